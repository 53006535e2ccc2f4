// naive_parity_test: the naive family (cuBLAS + softmax + cuBLAS) against the float64 CPU
// reference through the parity harness: the standard grid for fp32/fp16/bf16, other head dims,
// large causal cases, forced chunking, each GEMM decomposition, and the error paths.
// Without a CUDA device the GPU tests skip ("no CUDA device: skipped").
// ATTN_PARITY_OUT=<path>: per-case results appended as JSON lines.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "attn/kernels/naive_attention.h"
#include "edge_cases.h"
#include "parity_harness.h"

namespace attn::parity {
namespace {

using kernels::CausalAlignment;
using kernels::DType;
using kernels::Layout;
using kernels::NaivePlan;

constexpr size_t kDefaultWorkspaceLimit = size_t{1} << 30;

bool HaveDevice() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

#define CUDA_OK(expr)                                                                         \
  do {                                                                                        \
    const cudaError_t _e = (expr);                                                            \
    if (_e != cudaSuccess) return Internal(std::string(#expr) + ": " + cudaGetErrorName(_e)); \
  } while (0)

/// A device allocation freed on scope exit (tests only: the library never allocates).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Status Alloc(size_t bytes) {
    CUDA_OK(cudaMalloc(&p_, bytes == 0 ? 256 : bytes));
    return Status::Ok();
  }
  Status From(const void* host, size_t bytes) {
    ATTN_RETURN_IF_ERROR(Alloc(bytes));
    if (bytes > 0) CUDA_OK(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice));
    // A pageable host->device cudaMemcpy may return before its DMA lands, and the kernels run
    // on a non-blocking stream that does not wait for the legacy stream: wait here, or the
    // kernel can read the buffer before it is filled (seen as rare wrong results under load).
    CUDA_OK(cudaDeviceSynchronize());
    return Status::Ok();
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

/// One cuBLAS handle + stream + cuBLAS workspace for the whole binary.
struct GpuEnv {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  void* cublas_ws = nullptr;
};
GpuEnv* g_env = nullptr;

Status InitEnv() {
  if (g_env != nullptr) return Status::Ok();
  auto* env = new GpuEnv;
  CUDA_OK(cudaStreamCreateWithFlags(&env->stream, cudaStreamNonBlocking));
  if (cublasCreate(&env->handle) != CUBLAS_STATUS_SUCCESS) return Internal("cublasCreate");
  CUDA_OK(cudaMalloc(&env->cublas_ws, 32 << 20));
  if (cublasSetStream(env->handle, env->stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(env->handle, env->cublas_ws, 32 << 20) != CUBLAS_STATUS_SUCCESS) {
    return Internal("cublasSetStream/cublasSetWorkspace");
  }
  g_env = env;
  return Status::Ok();
}

/// Runs the naive family on a host case: copies in (including the poisoned outputs, so that
/// anything the kernel does not write stays poison), plans under `limit`, runs, copies back.
Status RunNaive(const HostCase& c, HostOutputs* out, size_t limit, NaivePlan* plan_out) {
  ATTN_RETURN_IF_ERROR(InitEnv());
  const AttentionShape& s = c.shape;
  StatusOr<NaivePlan> plan = kernels::NaivePlanFor(s, limit);
  if (!plan.ok()) return plan.status();
  if (plan_out != nullptr) *plan_out = *plan;
  DeviceBuffer q, k, v, o, lse, ql, kl, ws;
  ATTN_RETURN_IF_ERROR(q.From(c.q.data(), c.q.size()));
  ATTN_RETURN_IF_ERROR(k.From(c.k.data(), c.k.size()));
  ATTN_RETURN_IF_ERROR(v.From(c.v.data(), c.v.size()));
  ATTN_RETURN_IF_ERROR(o.From(out->o.data(), out->o.size()));
  ATTN_RETURN_IF_ERROR(lse.From(out->lse.data(), out->lse.size() * sizeof(float)));
  ATTN_RETURN_IF_ERROR(ql.From(c.q_lengths.data(), c.q_lengths.size() * sizeof(int32_t)));
  ATTN_RETURN_IF_ERROR(kl.From(c.kv_lengths.data(), c.kv_lengths.size() * sizeof(int32_t)));
  ATTN_RETURN_IF_ERROR(ws.Alloc(plan->workspace_bytes));
  // Poison the workspace too: stale scores must never leak into results.
  CUDA_OK(cudaMemset(ws.get(), 0xFF, plan->workspace_bytes));
  // cudaMemset runs on the legacy stream, which the non-blocking stream below does not wait
  // for: without this wait the poison could land after the GEMM wrote the scores (seen on the
  // H200 when two test processes shared the GPU: rows of NaN / lse -inf).
  CUDA_OK(cudaDeviceSynchronize());
  kernels::AttentionTensors t;
  t.q = q.get();
  t.k = k.get();
  t.v = v.get();
  t.o = o.get();
  t.lse = s.return_lse ? static_cast<float*>(lse.get()) : nullptr;
  if (s.has_lengths) {
    t.q_lengths = static_cast<const int32_t*>(ql.get());
    t.kv_lengths = static_cast<const int32_t*>(kl.get());
  }
  ATTN_RETURN_IF_ERROR(
      kernels::NaiveRun(*plan, t, ws.get(), plan->workspace_bytes, g_env->handle, g_env->stream));
  CUDA_OK(cudaStreamSynchronize(g_env->stream));
  CUDA_OK(cudaMemcpy(out->o.data(), o.get(), out->o.size(), cudaMemcpyDeviceToHost));
  if (!out->lse.empty()) {
    CUDA_OK(cudaMemcpy(out->lse.data(), lse.get(), out->lse.size() * sizeof(float),
                       cudaMemcpyDeviceToHost));
  }
  return Status::Ok();
}

KernelRunner NaiveRunner(size_t limit = kDefaultWorkspaceLimit, NaivePlan* plan_out = nullptr) {
  return {"naive", kernels::NaiveSupports, [limit, plan_out](const HostCase& c, HostOutputs* o) {
            return RunNaive(c, o, limit, plan_out);
          }};
}

void Record(const std::string& label, const std::vector<CaseResult>& results) {
  if (const char* path = std::getenv("ATTN_PARITY_OUT")) {
    std::ofstream(path, std::ios::app) << ResultsToJson("naive/" + label, results);
  }
}

/// Expects no failures and at least one pass; skips are allowed only for varlen (refused).
void ExpectParity(const std::string& label, const std::vector<CaseResult>& results) {
  Record(label, results);
  int passed = 0, failed = 0, skipped = 0;
  double worst = 0;
  for (const CaseResult& r : results) {
    if (r.skipped) {
      ++skipped;
      EXPECT_NE(r.skip_reason.find("varlen"), std::string::npos)
          << r.name << " skipped: " << r.skip_reason;
      continue;
    }
    if (r.passed) {
      ++passed;
      worst = std::max(worst, r.rel_l2);
    } else if (++failed <= 25) {
      ADD_FAILURE() << label << ": " << r.name << ": " << r.failure;
    }
  }
  std::printf("[%s] %d passed, %d failed, %d skipped (varlen); worst rel_l2 %.3g\n", label.c_str(),
              passed, failed, skipped, worst);
  EXPECT_EQ(failed, 0);
  EXPECT_GT(passed, 0);
}

AttentionShape Shape(DType dtype, int64_t B, int64_t T, int64_t S, int64_t N, int64_t K, int64_t H,
                     CausalAlignment causal, bool lengths) {
  AttentionShape s;
  s.dtype = dtype;
  s.batch = B;
  s.max_q_len = T;
  s.max_kv_len = S;
  s.num_heads = N;
  s.num_kv_heads = K;
  s.head_dim = H;
  s.mask.causal = causal;
  s.has_lengths = lengths;
  s.return_lse = true;
  return s;
}

class NaiveGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
    const Status st = InitEnv();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  static void Grid(DType dtype) {
    GridOptions opt;
    opt.dtypes = {dtype};
    ExpectParity(std::string("grid/") + kernels::DTypeName(dtype),
                 RunGrid(NaiveRunner(), StandardGrid(opt)));
  }
};

TEST_F(NaiveGpu, StandardGridFloat32) { Grid(DType::kFloat32); }
TEST_F(NaiveGpu, StandardGridFloat16) { Grid(DType::kFloat16); }
TEST_F(NaiveGpu, StandardGridBFloat16) { Grid(DType::kBFloat16); }

TEST_F(NaiveGpu, OtherHeadDims) {
  GridOptions opt;
  opt.dtypes = {DType::kFloat16, DType::kBFloat16};
  opt.head_dims = {32, 80, 128};
  opt.include_varlen = false;
  opt.include_hard_inputs = false;
  ExpectParity("head_dims", RunGrid(NaiveRunner(), StandardGrid(opt)));
}

// Edge cases (edge_cases.h), head dims 8 (the NaN case) and 64: large magnitudes
// (single-key rows exactly v), very negative logits, NaN/±Inf at masked keys and past the
// lengths (the P·V GEMM multiplies them by zero: naive_masked_values.cu), very wide windows.
TEST_F(NaiveGpu, EdgeCases) {
  EdgeOptions opt;
  opt.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  opt.head_dims = {8, 64};
  KernelRunner runner = NaiveRunner();
  runner.exact_single_key = true;
  ExpectParity("edge", RunGrid(runner, EdgeCases(opt)));
}

TEST_F(NaiveGpu, LargeCausal) {
  std::vector<HostCase> cases;
  uint64_t seed = 99;
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    cases.push_back(
        MakeCase(Shape(d, 2, 1024, 1024, 8, 2, 64, CausalAlignment::kBottomRight, false),
                 InputKind::kNormal, seed++, false));
  }
  cases.push_back(
      MakeCase(Shape(DType::kBFloat16, 2, 1000, 1536, 8, 2, 128, CausalAlignment::kTopLeft, true),
               InputKind::kNormal, seed++, false));
  ExpectParity("large", RunGrid(NaiveRunner(), cases));
}

TEST_F(NaiveGpu, ManyChunksAndEveryGemmVariant) {
  struct Spec {
    int64_t B, N, K;
  };
  // (B, N, K): A (MHA, batched over kv heads), C (GQA/MQA, stride-0 K/V), D (batched over b).
  const Spec specs[] = {{1, 8, 8}, {3, 8, 2}, {3, 8, 1}, {12, 8, 2}, {5, 4, 4}, {4, 6, 3}};
  int64_t chunked = 0;
  uint64_t seed = 500;
  for (const Spec& sp : specs) {
    for (DType d : {DType::kFloat32, DType::kFloat16}) {
      const AttentionShape s =
          Shape(d, sp.B, 70, 45, sp.N, sp.K, 48, CausalAlignment::kBottomRight, true);
      const HostCase c = MakeCase(s, InputKind::kNormal, seed++, sp.B > 1);
      StatusOr<NaivePlan> whole = kernels::NaivePlanFor(c.shape, kDefaultWorkspaceLimit);
      ASSERT_TRUE(whole.ok()) << whole.status().ToString();
      // One unit's scores + probabilities, their 256-byte alignment, and the per-unit flags
      // (B*K int32 <= 256 bytes here, 4-byte aligned).
      const size_t unit = whole->unit_scores_bytes + whole->unit_probs_bytes + 512;
      // Unchunked; one unit per chunk; a ragged number of units per chunk.
      for (size_t limit : {kDefaultWorkspaceLimit, unit, 3 * unit}) {
        NaivePlan plan;
        const CaseResult r = RunCase(NaiveRunner(limit, &plan), c);
        Record("chunks", {r});
        EXPECT_TRUE(r.passed) << c.name << " limit " << limit << " chunks " << plan.num_chunks
                              << ": " << r.failure;
        EXPECT_LE(plan.workspace_bytes, limit);
        chunked += plan.num_chunks > 1;
      }
    }
  }
  EXPECT_GT(chunked, 10);
}

TEST_F(NaiveGpu, RunErrors) {
  const AttentionShape s =
      Shape(DType::kFloat16, 2, 16, 16, 4, 2, 64, CausalAlignment::kNone, false);
  StatusOr<NaivePlan> plan = kernels::NaivePlanFor(s, kDefaultWorkspaceLimit);
  ASSERT_TRUE(plan.ok());
  DeviceBuffer buf;
  ASSERT_TRUE(buf.Alloc(plan->workspace_bytes + (1 << 20)).ok());
  kernels::AttentionTensors t;
  t.q = t.k = t.v = buf.get();
  t.o = buf.get();
  t.lse = static_cast<float*>(buf.get());
  Status st = kernels::NaiveRun(*plan, t, buf.get(), plan->workspace_bytes - 1, g_env->handle,
                                g_env->stream);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  st = kernels::NaiveRun(*plan, t, buf.get(), plan->workspace_bytes, g_env->handle, other);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("stream"), std::string::npos);
  cudaStreamDestroy(other);
  t.lse = nullptr;
  st = kernels::NaiveRun(*plan, t, buf.get(), plan->workspace_bytes, g_env->handle, g_env->stream);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

// Host-only planning checks: no device needed.
TEST(NaivePlan, ResourceExhaustedNamesBytes) {
  const AttentionShape s =
      Shape(DType::kBFloat16, 2, 4096, 4096, 32, 8, 128, CausalAlignment::kBottomRight, false);
  StatusOr<NaivePlan> ok = kernels::NaivePlanFor(s, size_t{1} << 34);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  const size_t one = ok->unit_scores_bytes + ok->unit_probs_bytes;  // 4*4096*4096*(4+2)
  EXPECT_EQ(one, size_t{4} * 4096 * 4096 * 6);
  StatusOr<NaivePlan> small = kernels::NaivePlanFor(s, one - 1);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = small.status().message();
  EXPECT_NE(m.find(std::to_string(one)), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(one - 1)), std::string::npos) << m;
  // 5 units plus the per-unit non-finite flags (B*K = 16 int32: 64 bytes).
  StatusOr<NaivePlan> chunked = kernels::NaivePlanFor(s, 5 * one + 256);
  ASSERT_TRUE(chunked.ok());
  EXPECT_EQ(chunked->units_per_chunk, 5);  // fewer than K = 8 units: no rounding to entries
  EXPECT_EQ(chunked->num_chunks, 4);
  EXPECT_LE(chunked->workspace_bytes, 5 * one + 256);
  EXPECT_EQ(chunked->flags_offset_bytes, 5 * one);
  EXPECT_EQ(kernels::NaivePlanFor(s, 5 * one)->units_per_chunk, 4);  // the flags need room too
}

TEST(NaivePlan, RefusesVarlenAndFp8) {
  AttentionShape s = Shape(DType::kFloat16, 2, 16, 16, 4, 2, 64, CausalAlignment::kNone, true);
  s.layout = Layout::kVarlen;
  Status st = kernels::NaiveSupports(s);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("varlen"), std::string::npos) << st.message();
  s.layout = Layout::kPadded;
  s.dtype = DType::kFloat8E4M3;
  EXPECT_EQ(kernels::NaiveSupports(s).code(), StatusCode::kFailedPrecondition);
  s.dtype = DType::kFloat16;
  s.num_kv_heads = 3;
  EXPECT_EQ(kernels::NaiveSupports(s).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attn::parity
