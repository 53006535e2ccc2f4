// fused_parity_test: the fused family (FlashAttention-2-style kernel) against the float64 CPU
// reference through the parity harness: the standard grid for fp16/bf16 at head dims 64 and
// 128, the other head dims, every tile variant, and explicit cases (T != S, T = 1, lengths that
// are not multiples of the tiles, zero-length keys, long causal S, GQA 8/2/1 varlen), plus the
// refusals. Without a CUDA device the GPU tests skip ("no CUDA device: skipped").
// ATTN_PARITY_OUT=<path>: per-case results appended as JSON lines.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "attn/kernels/fused_attention.h"
#include "edge_cases.h"
#include "fused_params.h"  // kernels/fused: BlockKeyTiles, shared with the kernel
#include "parity_harness.h"

namespace attn::parity {
namespace {

using kernels::CausalAlignment;
using kernels::DType;
using kernels::FusedPlan;
using kernels::Layout;

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
  Status From(const void* host, size_t bytes) {
    CUDA_OK(cudaMalloc(&p_, bytes == 0 ? 256 : bytes));
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

cudaStream_t Stream() {
  static cudaStream_t s = [] {
    cudaStream_t st = nullptr;
    (void)cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    return st;
  }();
  return s;
}

/// Copies the case in (outputs too, poisoned, so rows the kernel skips stay poison), plans the
/// requested variant, runs, copies back.
Status RunFused(const HostCase& c, HostOutputs* out, int variant, FusedPlan* plan_out) {
  const AttentionShape& s = c.shape;
  kernels::FusedPlanOptions opt;
  opt.variant = variant;
  StatusOr<FusedPlan> plan = kernels::FusedPlanFor(s, 0, opt);
  if (!plan.ok()) return plan.status();
  if (plan_out != nullptr) *plan_out = *plan;
  DeviceBuffer q, k, v, o, lse, ql, kl, qo, ko;
  ATTN_RETURN_IF_ERROR(q.From(c.q.data(), c.q.size()));
  ATTN_RETURN_IF_ERROR(k.From(c.k.data(), c.k.size()));
  ATTN_RETURN_IF_ERROR(v.From(c.v.data(), c.v.size()));
  ATTN_RETURN_IF_ERROR(o.From(out->o.data(), out->o.size()));
  ATTN_RETURN_IF_ERROR(lse.From(out->lse.data(), out->lse.size() * sizeof(float)));
  ATTN_RETURN_IF_ERROR(ql.From(c.q_lengths.data(), c.q_lengths.size() * sizeof(int32_t)));
  ATTN_RETURN_IF_ERROR(kl.From(c.kv_lengths.data(), c.kv_lengths.size() * sizeof(int32_t)));
  ATTN_RETURN_IF_ERROR(qo.From(c.q_offsets.data(), c.q_offsets.size() * sizeof(int64_t)));
  ATTN_RETURN_IF_ERROR(ko.From(c.kv_offsets.data(), c.kv_offsets.size() * sizeof(int64_t)));
  kernels::AttentionTensors t;
  t.q = q.get();
  t.k = k.get();
  t.v = v.get();
  t.o = o.get();
  t.lse = s.return_lse ? static_cast<float*>(lse.get()) : nullptr;
  if (s.has_lengths && !c.q_lengths.empty()) {
    t.q_lengths = static_cast<const int32_t*>(ql.get());
    t.kv_lengths = static_cast<const int32_t*>(kl.get());
  }
  if (s.layout == Layout::kVarlen) {
    t.q_offsets = static_cast<const int64_t*>(qo.get());
    t.kv_offsets = static_cast<const int64_t*>(ko.get());
  }
  ATTN_RETURN_IF_ERROR(kernels::FusedRun(*plan, t, Stream()));
  CUDA_OK(cudaStreamSynchronize(Stream()));
  CUDA_OK(cudaMemcpy(out->o.data(), o.get(), out->o.size(), cudaMemcpyDeviceToHost));
  if (!out->lse.empty()) {
    CUDA_OK(cudaMemcpy(out->lse.data(), lse.get(), out->lse.size() * sizeof(float),
                       cudaMemcpyDeviceToHost));
  }
  return Status::Ok();
}

KernelRunner FusedRunner(int variant = -1, FusedPlan* plan_out = nullptr) {
  return {"fused", kernels::FusedSupports, [variant, plan_out](const HostCase& c, HostOutputs* o) {
            return RunFused(c, o, variant, plan_out);
          }};
}

void Record(const std::string& label, const std::vector<CaseResult>& results) {
  if (const char* path = std::getenv("ATTN_PARITY_OUT")) {
    std::ofstream(path, std::ios::app) << ResultsToJson("fused/" + label, results);
  }
}

/// Expects no failures, no skips (the shapes given are all supported), at least one pass.
void ExpectParity(const std::string& label, const std::vector<CaseResult>& results) {
  Record(label, results);
  int passed = 0, failed = 0, skipped = 0;
  double worst = 0;
  for (const CaseResult& r : results) {
    if (r.skipped) {
      ++skipped;
      ADD_FAILURE() << label << ": " << r.name << " skipped: " << r.skip_reason;
    } else if (r.passed) {
      ++passed;
      worst = std::max(worst, r.rel_l2);
    } else if (++failed <= 25) {
      ADD_FAILURE() << label << ": " << r.name << ": " << r.failure;
    }
  }
  std::printf("[%s] %d passed, %d failed, %d skipped; worst rel_l2 %.3g\n", label.c_str(),
              passed, failed, skipped, worst);
  EXPECT_EQ(failed, 0);
  EXPECT_GT(passed, 0);
}

AttentionShape Shape(DType dtype, int64_t B, int64_t T, int64_t S, int64_t N, int64_t K,
                     int64_t H, CausalAlignment causal, bool lengths) {
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
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  return s;
}

class FusedGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
  }
};

TEST_F(FusedGpu, StandardGridFloat16) {
  GridOptions opt;
  opt.dtypes = {DType::kFloat16};
  opt.head_dims = {64, 128};
  ExpectParity("grid/float16", RunGrid(FusedRunner(), StandardGrid(opt)));
}

TEST_F(FusedGpu, StandardGridBFloat16) {
  GridOptions opt;
  opt.dtypes = {DType::kBFloat16};
  opt.head_dims = {64, 128};
  ExpectParity("grid/bfloat16", RunGrid(FusedRunner(), StandardGrid(opt)));
}

TEST_F(FusedGpu, OtherHeadDims) {
  GridOptions opt;
  opt.dtypes = {DType::kFloat16, DType::kBFloat16};
  opt.head_dims = {32, 80, 96, 256};
  opt.include_hard_inputs = false;
  ExpectParity("head_dims", RunGrid(FusedRunner(), StandardGrid(opt)));
}

// Every tile variant (the default is chosen per shape, and the benchmark forces each) on a
// reduced grid. Head dims with a single variant run it as their default in OtherHeadDims.
TEST_F(FusedGpu, EveryVariant) {
  for (int64_t hd : {32, 64, 80, 96, 128, 256}) {
    const int count = kernels::FusedVariantCount(hd);
    for (int variant = 0; count > 1 && variant < count; ++variant) {
      GridOptions opt;
      opt.dtypes = {DType::kBFloat16, DType::kFloat16};
      opt.head_dims = {hd};
      opt.include_hard_inputs = false;
      ExpectParity("variant/h" + std::to_string(hd) + "/" + std::to_string(variant),
                   RunGrid(FusedRunner(variant), StandardGrid(opt)));
    }
  }
}

// Edge cases (edge_cases.h): large magnitudes (single-key rows exactly v), very negative
// logits, NaN/±Inf at masked keys, very wide windows; every tile variant of H = 64 and 128
// (the non-finite V check depends on the tile's keys and threads) and the other head dims.
TEST_F(FusedGpu, EdgeCasesEveryVariant) {
  for (int64_t hd : {32, 64, 80, 96, 128, 256}) {
    EdgeOptions opt;
    opt.head_dims = {hd};
    const int count = kernels::FusedVariantCount(hd);
    for (int variant = -1; variant < count; ++variant) {
      KernelRunner runner = FusedRunner(variant);
      runner.exact_single_key = true;
      ExpectParity("edge/h" + std::to_string(hd) + "/" + std::to_string(variant),
                   RunGrid(runner, EdgeCases(opt)));
    }
  }
}

/// T != S both ways, T = 1, ragged lengths, empty key sets, sliding windows, at head dim H.
std::vector<HostCase> ExplicitCases(std::vector<int64_t> head_dims) {
  std::vector<HostCase> cases;
  uint64_t seed = 4242;
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t H : head_dims) {
      // T != S both ways, both alignments (bottom-right offset S - T).
      for (CausalAlignment a : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
        cases.push_back(MakeCase(Shape(d, 2, 300, 1000, 4, 2, H, a, false), InputKind::kNormal,
                                 seed++, false));
        cases.push_back(MakeCase(Shape(d, 2, 1000, 300, 4, 4, H, a, false), InputKind::kNormal,
                                 seed++, false));
      }
      // T = 1 (decode) against many keys, bottom-right and no mask.
      cases.push_back(MakeCase(Shape(d, 3, 1, 4097, 8, 1, H, CausalAlignment::kBottomRight,
                                     false),
                               InputKind::kNormal, seed++, false));
      cases.push_back(MakeCase(Shape(d, 3, 1, 777, 8, 8, H, CausalAlignment::kNone, true),
                               InputKind::kNormal, seed++, true));
      // Lengths that are not multiples of any tile, some zero-length keys (allow_empty).
      cases.push_back(MakeCase(Shape(d, 4, 333, 517, 4, 2, H, CausalAlignment::kBottomRight,
                                     true),
                               InputKind::kNormal, seed++, true));
      cases.push_back(MakeCase(Shape(d, 4, 129, 65, 4, 1, H, CausalAlignment::kNone, true),
                               InputKind::kLogitsTimes8, seed++, true));
      // Sliding windows that cut through tiles on both sides.
      AttentionShape w = Shape(d, 2, 700, 700, 4, 2, H, CausalAlignment::kNone, false);
      w.mask.window_left = 100;
      w.mask.window_right = 3;
      cases.push_back(MakeCase(w, InputKind::kNormal, seed++, false));
      w.mask.causal = CausalAlignment::kBottomRight;
      w.mask.window_left = 255;
      cases.push_back(MakeCase(w, InputKind::kNormal, seed++, false));
    }
  }
  return cases;
}

TEST_F(FusedGpu, ExplicitCases) {
  ExpectParity("explicit", RunGrid(FusedRunner(), ExplicitCases({64, 128})));
}

// The explicit cases once per tile variant of head dims 64 and 128 (the default above picks
// 64-row variants for these small grids; the 128-row ones run here).
TEST_F(FusedGpu, ExplicitCasesEveryVariant) {
  for (int64_t hd : {64, 128}) {
    const std::vector<HostCase> cases = ExplicitCases({hd});
    for (int variant = 0; variant < kernels::FusedVariantCount(hd); ++variant) {
      ExpectParity("explicit/h" + std::to_string(hd) + "/" + std::to_string(variant),
                   RunGrid(FusedRunner(variant), cases));
    }
  }
}


TEST_F(FusedGpu, LongCausal) {
  std::vector<HostCase> cases;
  uint64_t seed = 777;
  cases.push_back(MakeCase(Shape(DType::kBFloat16, 1, 4096, 4096, 2, 1, 128,
                                 CausalAlignment::kTopLeft, false),
                           InputKind::kNormal, seed++, false));
  cases.push_back(MakeCase(Shape(DType::kFloat16, 1, 4096, 4096, 2, 2, 64,
                                 CausalAlignment::kBottomRight, false),
                           InputKind::kNormal, seed++, false));
  cases.push_back(MakeCase(Shape(DType::kBFloat16, 1, 1000, 4096, 2, 1, 128,
                                 CausalAlignment::kBottomRight, false),
                           InputKind::kLogitsTimes8, seed++, false));
  ExpectParity("long_causal", RunGrid(FusedRunner(), cases));
}

TEST_F(FusedGpu, GqaVarlen) {
  std::vector<HostCase> cases;
  uint64_t seed = 31337;
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t K : {8, 2, 1}) {
      for (CausalAlignment a :
           {CausalAlignment::kNone, CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
        AttentionShape s = Shape(d, 5, 300, 450, 8, K, K == 2 ? 128 : 64, a, true);
        s.layout = Layout::kVarlen;
        cases.push_back(MakeCase(s, InputKind::kNormal, seed++, true));
      }
    }
  }
  ExpectParity("gqa_varlen", RunGrid(FusedRunner(), cases));
}

// Every variant fits an L4's 99 KB of shared memory per block.
TEST_F(FusedGpu, VariantsFitL4) {
  for (int64_t hd : {32, 64, 80, 96, 128, 256}) {
    for (int variant = 0; variant < kernels::FusedVariantCount(hd); ++variant) {
      kernels::FusedPlanOptions opt;
      opt.variant = variant;
      StatusOr<FusedPlan> plan = kernels::FusedPlanFor(
          Shape(DType::kBFloat16, 1, 128, 128, 1, 1, hd, CausalAlignment::kNone, false), 0, opt);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_LE(plan->smem_bytes, 101376) << plan->Describe();
      std::printf("h%lld variant %d: %s\n", static_cast<long long>(hd), variant,
                  plan->Describe().c_str());
    }
  }
}

TEST_F(FusedGpu, RunErrors) {
  const AttentionShape s =
      Shape(DType::kFloat16, 2, 16, 16, 4, 2, 64, CausalAlignment::kNone, false);
  StatusOr<FusedPlan> plan = kernels::FusedPlanFor(s, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  kernels::AttentionTensors t;  // all null
  EXPECT_EQ(kernels::FusedRun(*plan, t, Stream()).code(), StatusCode::kInvalidArgument);
  kernels::FusedPlanOptions opt;
  opt.variant = 99;
  EXPECT_EQ(kernels::FusedPlanFor(s, 0, opt).status().code(), StatusCode::kInvalidArgument);
}

// Host-only checks: no device needed.

// The kernel's tile range and interior-tile decisions against BandKeyRange, exhaustively over
// small shapes: every visible (row, key) pair lies in a visited tile, and interior tiles lie
// inside every visible row's band.
TEST(FusedTiles, CoverBandAndInteriorIsExact) {
  using kernels::BandKeyRange;
  using kernels::KeyRange;
  using kernels::MaskSpec;
  const MaskSpec masks[] = {
      {CausalAlignment::kNone, -1, -1},       {CausalAlignment::kTopLeft, -1, -1},
      {CausalAlignment::kBottomRight, -1, -1}, {CausalAlignment::kBottomRight, 37, -1},
      {CausalAlignment::kNone, 20, 11},        {CausalAlignment::kTopLeft, 0, -1},
      {CausalAlignment::kNone, -1, 5},         {CausalAlignment::kNone, 70, 0},
  };
  int64_t checked = 0;
  for (const MaskSpec& m : masks) {
    for (int q_len : {0, 1, 17, 64, 130, 300}) {
      for (int kv_len : {0, 1, 31, 64, 129, 257}) {
        for (int bm : {64, 128}) {
          for (int bn : {32, 64, 128}) {
            for (int m0 = 0; m0 < q_len + bm; m0 += bm) {
              const kernels::fused::BlockTiles t =
                  kernels::fused::BlockKeyTiles(m, m0, bm, bn, q_len, kv_len);
              for (int i = m0; i < std::min(m0 + bm, q_len); ++i) {
                const KeyRange r = BandKeyRange(m, i, q_len, kv_len);
                if (!r.empty()) {
                  ASSERT_GE(r.lo, int64_t{t.n_begin} * bn) << i;
                  ASSERT_LT(r.hi, int64_t{t.n_end} * bn) << i;
                }
                for (int n = t.n_begin; n < t.n_end; ++n) {
                  if (!t.Interior(n, bn)) continue;
                  ASSERT_LE(r.lo, n * bn) << "row " << i << " tile " << n;
                  ASSERT_GE(r.hi, n * bn + bn - 1) << "row " << i << " tile " << n;
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// The default-variant table (fused_attention.cc): a valid index for every head dim and load,
// and the measured choices at H=64 (bench/results/nvidia-h200-2026-11-29.json, 132 SMs).
TEST(FusedDefaultVariant, TableChoices) {
  auto tile = [](const AttentionShape& s, int sms) {
    const int v = kernels::FusedDefaultVariant(s, sms);
    EXPECT_GE(v, 0);
    EXPECT_LT(v, kernels::FusedVariantCount(s.head_dim));
    return v;
  };
  for (int64_t hd : {32, 64, 80, 96, 128, 256})
    for (int64_t b : {1, 4, 16, 4096})
      for (int64_t t : {1, 128, 1000, 16384})
        for (CausalAlignment a : {CausalAlignment::kNone, CausalAlignment::kBottomRight})
          for (int sms : {0, 58, 132})
            (void)tile(Shape(DType::kBFloat16, b, t, t, 8, 8, hd, a, false), sms);
  // H=64 variants: v1 = 128x64/4w, v2 = 64x128/4w (fused_params.h).
  const auto none = CausalAlignment::kNone, causal = CausalAlignment::kBottomRight;
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 4, 512, 512, 8, 8, 64, none, false), 132), 2);
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 4, 1024, 1024, 8, 8, 64, none, false), 132), 1);
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 4, 4096, 4096, 8, 8, 64, causal, false), 132), 2);
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 4, 8192, 8192, 8, 8, 64, causal, false), 132), 1);
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 16, 1024, 1024, 32, 32, 64, causal, false), 132), 1);
  // H=128 variants: v1 = 64x64/4w, v2 = 128x64/4w.
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 4, 4096, 4096, 16, 16, 128, none, false), 132), 2);
  EXPECT_EQ(tile(Shape(DType::kBFloat16, 1, 300, 300, 4, 4, 128, none, false), 132), 1);
}

TEST(FusedSupports, Refusals) {
  AttentionShape s = Shape(DType::kFloat16, 2, 16, 16, 4, 2, 64, CausalAlignment::kNone, false);
  s.scale = 0.125f;
  EXPECT_TRUE(kernels::FusedSupports(s).ok());
  for (DType d : {DType::kFloat32, DType::kFloat8E4M3}) {
    s.dtype = d;
    const Status st = kernels::FusedSupports(s);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("dtype"), std::string::npos) << st.message();
  }
  s.dtype = DType::kBFloat16;
  for (int64_t hd : {48, 112, 160, 512}) {
    s.head_dim = hd;
    const Status st = kernels::FusedSupports(s);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << hd;
    EXPECT_NE(st.message().find("head dim"), std::string::npos) << st.message();
  }
  s.head_dim = 128;
  s.num_kv_heads = 3;
  EXPECT_EQ(kernels::FusedSupports(s).code(), StatusCode::kInvalidArgument);
  s.num_kv_heads = 2;
  s.scale = -1.f;
  EXPECT_EQ(kernels::FusedSupports(s).code(), StatusCode::kFailedPrecondition);
  s.scale = 0.1f;
  s.batch = 70000;
  EXPECT_EQ(kernels::FusedSupports(s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::FusedVariantCount(48), 0);
  EXPECT_GE(kernels::FusedVariantCount(128), 1);
}

}  // namespace
}  // namespace attn::parity
