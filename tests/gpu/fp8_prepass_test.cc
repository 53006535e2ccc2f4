// fp8_prepass_test: the FP8 accuracy pre-pass (attn/kernels/fp8_prepass.h) on the GPU, and the
// fp8 recipes it gives both FP8 paths (issue 20).
//  - MatchesTheHostReferenceBitForBit: Fp8Prepass's E4M3 q/k/v, scales, amax and K means equal
//    Fp8PrepassReference's bit for bit: bf16 and fp16, head dims 16-256 (Hadamard orders 16-256,
//    block-diagonal at 80), padded with and without lengths (±1e4 and NaN in the padding), varlen,
//    GQA, an entry without keys, every recipe.
//  - RecipeErrors{OwnKernel,Cudnn}: relative L2 against float64 of the unquantised inputs for
//    every recipe × input set (normal, ×20 outlier channels, +20 key bias) × H 64/128 × mask,
//    printed as a table (and ATTN_PARITY_OUT JSON lines); the default recipe (rotation and K
//    smoothing) must reach ≤ 0.10 at H=128 and ≤ 0.15 at H=64 on all three sets, its lse within
//    0.25 on the normal and key-bias sets (smoothing's shift undone).
//  - PaddingGarbageChangesNothing: ±1e4 / NaN past the lengths leave o and lse bit-identical.
// Without a CUDA device of sm_89 or newer every test skips with the reason; the cuDNN cases also
// need sm_90 and a loadable cuDNN.
#include "attn/kernels/fp8_prepass.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/device_limits.h"
#include "attn/kernels/fp8_attention.h"
#include "attn/kernels/host_dtype.h"
#include "fp8_prepass_geometry.h"  // kernels/fp8: where the K means sit in the workspace
#include "parity_harness.h"
#if defined(ATTN_TEST_CUDNN)
#include "attn/kernels/cudnn_attention.h"
#endif

namespace attn::parity {
namespace {

using kernels::CausalAlignment;
using kernels::DType;
using kernels::Layout;

std::string SkipReason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return "no CUDA device: skipped";
  }
  StatusOr<kernels::DeviceLimits> l = kernels::GetDeviceLimits(0);
  if (!l.ok()) return "no CUDA device: skipped (" + l.status().ToString() + ")";
  if (l->compute_capability < 890) return "device below sm_89 (no e4m3): skipped";
  return "";
}

cudaStream_t Stream() {
  static cudaStream_t s = [] {
    cudaStream_t st = nullptr;
    (void)cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    return st;
  }();
  return s;
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevPtr = std::unique_ptr<void, CudaFree>;

/// Device copy of `bytes` host bytes (or an uninitialised allocation when host is null).
DevPtr Upload(const void* host, size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 256 : bytes) != cudaSuccess) return DevPtr();
  if (host != nullptr && bytes > 0) cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
  return DevPtr(p);
}

/// A case's inputs and outputs on the device, with AttentionTensors pointing at them.
struct DeviceCase {
  DevPtr q, k, v, o, lse, ql, kl, qo, ko;
  kernels::AttentionTensors t;
};
std::unique_ptr<DeviceCase> ToDevice(const HostCase& c) {
  auto d = std::make_unique<DeviceCase>();
  d->q = Upload(c.q.data(), c.q.size());
  d->k = Upload(c.k.data(), c.k.size());
  d->v = Upload(c.v.data(), c.v.size());
  d->o = Upload(nullptr, c.q.size());
  d->lse = Upload(nullptr, c.shape.lse_elements() * sizeof(float));
  d->ql = Upload(c.q_lengths.data(), c.q_lengths.size() * 4);
  d->kl = Upload(c.kv_lengths.data(), c.kv_lengths.size() * 4);
  d->qo = Upload(c.q_offsets.data(), c.q_offsets.size() * 8);
  d->ko = Upload(c.kv_offsets.data(), c.kv_offsets.size() * 8);
  kernels::AttentionTensors& t = d->t;
  t.q = d->q.get();
  t.k = d->k.get();
  t.v = d->v.get();
  t.o = d->o.get();
  t.lse = c.shape.return_lse ? static_cast<float*>(d->lse.get()) : nullptr;
  if (c.shape.has_lengths && !c.q_lengths.empty()) {
    t.q_lengths = static_cast<const int32_t*>(d->ql.get());
    t.kv_lengths = static_cast<const int32_t*>(d->kl.get());
  }
  if (c.shape.layout == Layout::kVarlen) {
    t.q_offsets = static_cast<const int64_t*>(d->qo.get());
    t.kv_offsets = static_cast<const int64_t*>(d->ko.get());
  }
  return d;
}

kernels::AttentionTensors HostIndex(const HostCase& c) {
  kernels::AttentionTensors t;
  if (c.shape.has_lengths && !c.q_lengths.empty()) {
    t.q_lengths = c.q_lengths.data();
    t.kv_lengths = c.kv_lengths.data();
  }
  if (c.shape.layout == Layout::kVarlen) {
    t.q_offsets = c.q_offsets.data();
    t.kv_offsets = c.kv_offsets.data();
  }
  return t;
}

Status Download(const DeviceCase& d, const HostCase& c, HostOutputs* out) {
  if (cudaStreamSynchronize(Stream()) != cudaSuccess) return Internal("stream sync failed");
  cudaMemcpy(out->o.data(), d.o.get(), out->o.size(), cudaMemcpyDeviceToHost);
  if (c.shape.return_lse) {
    cudaMemcpy(out->lse.data(), d.lse.get(), out->lse.size() * 4, cudaMemcpyDeviceToHost);
  }
  return cudaGetLastError() == cudaSuccess ? Status::Ok() : Internal("copy back failed");
}

/// Writes ±1e4 and NaN into every padding row (past the lengths) of a padded case.
void PoisonPadding(HostCase* c) {
  const AttentionShape& s = c->shape;
  auto poison = [&](std::vector<uint8_t>* buf, int64_t extent, const std::vector<int32_t>& len,
                    int64_t row) {
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = len[b]; t < extent; ++t) {
        for (int64_t e = 0; e < row; ++e) {
          const float x = (t + e) % 5 == 0 ? NAN : ((t + e) % 2 ? 1e4f : -1e4f);
          kernels::StoreFromFloat(buf->data(), s.dtype, (b * extent + t) * row + e, x);
        }
      }
    }
  };
  poison(&c->q, s.max_q_len, c->q_lengths, s.num_heads * s.head_dim);
  poison(&c->k, s.max_kv_len, c->kv_lengths, s.num_kv_heads * s.head_dim);
  poison(&c->v, s.max_kv_len, c->kv_lengths, s.num_kv_heads * s.head_dim);
}

class Fp8PrepassGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = SkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(Fp8PrepassGpu, MatchesTheHostReferenceBitForBit) {
  int cases = 0;
  uint64_t seed = 4200;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t H : {16, 64, 80, 128, 256}) {
      for (int layout = 0; layout < 3; ++layout) {  // padded, padded + lengths, varlen
        for (int recipe = 0; recipe < 4; ++recipe) {
          AttentionShape s;
          s.dtype = dt;
          s.layout = layout == 2 ? Layout::kVarlen : Layout::kPadded;
          s.has_lengths = layout != 0;
          s.batch = 3;
          s.max_q_len = 130;
          s.max_kv_len = 200;
          s.num_heads = 4;
          s.num_kv_heads = 2;
          s.head_dim = H;
          s.scale = 0.125f;
          s.fp8.rotate = (recipe & 1) != 0;
          s.fp8.smooth_k = (recipe & 2) != 0;
          HostCase c = MakeCase(s, recipe == 3 ? InputKind::kKeyBias : InputKind::kNormal, ++seed,
                                /*allow_empty=*/layout != 0);
          if (layout == 1) PoisonPadding(&c);
          s = c.shape;
          std::unique_ptr<DeviceCase> d = ToDevice(c);
          DevPtr q8 = Upload(nullptr, s.q_elements()), k8 = Upload(nullptr, s.kv_elements()),
                 v8 = Upload(nullptr, s.kv_elements()), sc = Upload(nullptr, 64);
          const int64_t ws_bytes = kernels::Fp8PrepassWorkspaceBytes(s);
          DevPtr ws = Upload(nullptr, ws_bytes);
          ASSERT_TRUE(kernels::Fp8Prepass(s, d->t, q8.get(), k8.get(), v8.get(),
                                          static_cast<float*>(sc.get()), ws.get(), ws_bytes,
                                          Stream())
                          .ok());
          ASSERT_EQ(cudaStreamSynchronize(Stream()), cudaSuccess);
          std::vector<uint8_t> gq(s.q_elements()), gk(s.kv_elements()), gv(s.kv_elements());
          std::vector<float> gsc(kernels::kFp8NumScalars), gmean;
          cudaMemcpy(gq.data(), q8.get(), gq.size(), cudaMemcpyDeviceToHost);
          cudaMemcpy(gk.data(), k8.get(), gk.size(), cudaMemcpyDeviceToHost);
          cudaMemcpy(gv.data(), v8.get(), gv.size(), cudaMemcpyDeviceToHost);
          cudaMemcpy(gsc.data(), sc.get(), gsc.size() * 4, cudaMemcpyDeviceToHost);
          if (s.fp8.smooth_k) {
            gmean.resize(s.batch * s.num_kv_heads * H);
            cudaMemcpy(
                gmean.data(),
                static_cast<char*>(ws.get()) + kernels::fp8::PrepassWorkspaceLayout(s).mean_offset,
                gmean.size() * 4, cudaMemcpyDeviceToHost);
          }
          std::vector<uint8_t> rq, rk, rv;
          std::vector<float> rsc, rmean;
          ASSERT_TRUE(kernels::Fp8PrepassReference(s, reinterpret_cast<const uint16_t*>(c.q.data()),
                                                   reinterpret_cast<const uint16_t*>(c.k.data()),
                                                   reinterpret_cast<const uint16_t*>(c.v.data()),
                                                   HostIndex(c), &rq, &rk, &rv, &rsc, &rmean)
                          .ok());
          EXPECT_EQ(gq, rq) << c.name << " recipe " << recipe;
          EXPECT_EQ(gk, rk) << c.name << " recipe " << recipe;
          EXPECT_EQ(gv, rv) << c.name << " recipe " << recipe;
          EXPECT_EQ(std::memcmp(gsc.data(), rsc.data(), 4 * gsc.size()), 0)
              << c.name << " recipe " << recipe << ": scale_q " << gsc[0] << " vs " << rsc[0];
          EXPECT_EQ(gmean, rmean) << c.name << " recipe " << recipe;
          ++cases;
        }
      }
    }
  }
  std::printf("[prepass] %d cases bit-identical to the host reference\n", cases);
}

// ---- Recipes on both FP8 paths --------------------------------------------------------------

using PathRun = std::function<Status(const HostCase&, HostOutputs*)>;

/// Our e4m3 kernel (sm_89 path) after the pre-pass, then the lse shift.
Status RunOwn(const HostCase& c, HostOutputs* out) {
  const AttentionShape& s = c.shape;
  auto plan = kernels::Fp8AttentionPlanFor(s, 0);
  if (!plan.ok()) return plan.status();
  std::unique_ptr<DeviceCase> d = ToDevice(c);
  DevPtr q8 = Upload(nullptr, s.q_elements()), k8 = Upload(nullptr, s.kv_elements()),
         v8 = Upload(nullptr, s.kv_elements()), sc = Upload(nullptr, 64);
  const int64_t pw = kernels::Fp8PrepassWorkspaceBytes(s);
  DevPtr pws = Upload(nullptr, pw), kws = Upload(nullptr, plan->workspace_bytes);
  float* f = static_cast<float*>(sc.get());
  ATTN_RETURN_IF_ERROR(
      kernels::Fp8Prepass(s, d->t, q8.get(), k8.get(), v8.get(), f, pws.get(), pw, Stream()));
  kernels::AttentionTensors t = d->t;
  t.q = q8.get();
  t.k = k8.get();
  t.v = v8.get();
  const kernels::Fp8Descales ds{f + kernels::kFp8DescaleQ, f + kernels::kFp8DescaleK,
                                f + kernels::kFp8DescaleV};
  ATTN_RETURN_IF_ERROR(
      kernels::Fp8AttentionRun(*plan, t, ds, kws.get(), plan->workspace_bytes, Stream()));
  ATTN_RETURN_IF_ERROR(kernels::Fp8PrepassLseShift(s, d->t, pws.get(), Stream()));
  return Download(*d, c, out);
}

#if defined(ATTN_TEST_CUDNN)
/// cuDNN's FP8 SDPA with our pre-pass (CudnnAttention::Run), or null with `why`.
kernels::CudnnAttention* Cudnn(std::string* why) {
  static std::string reason;
  static kernels::CudnnAttention* inst = [] {  // leaked: see cudnn_parity_test.cc
    auto c = kernels::CudnnAttention::Create(0, {});
    if (!c.ok()) {
      reason = "cuDNN unavailable: " + c.status().ToString();
      return static_cast<kernels::CudnnAttention*>(nullptr);
    }
    if ((*c)->sm() < 90) {
      reason = "cuDNN FP8 SDPA needs sm_90";
      return static_cast<kernels::CudnnAttention*>(nullptr);
    }
    return c->release();
  }();
  if (why) *why = reason;
  return inst;
}

Status RunCudnn(const HostCase& c, HostOutputs* out) {
  kernels::CudnnAttention* cd = Cudnn(nullptr);
  auto plan = cd->Plan(c.shape, /*fp8=*/true);
  if (!plan.ok()) return plan.status();
  std::unique_ptr<DeviceCase> d = ToDevice(c);
  DevPtr ws = Upload(nullptr, plan->workspace_bytes);
  kernels::CudnnFp8Inputs in;
  in.out_dtype = c.shape.dtype;
  ATTN_RETURN_IF_ERROR(cd->Run(*plan, d->t, in, ws.get(), plan->workspace_bytes, Stream()));
  return Download(*d, c, out);
}
#endif

/// Every recipe × input set × H × mask on one path: prints the errors, checks the default's.
void RecipeTable(const std::string& path, const PathRun& run) {
  const char* recipe_names[4] = {"plain", "rotate", "smooth_k", "default"};
  std::ofstream jsonl;
  if (const char* p = std::getenv("ATTN_PARITY_OUT")) jsonl.open(p, std::ios::app);
  uint64_t seed = 7100;
  for (int64_t H : {64, 128}) {
    for (InputKind kind : {InputKind::kNormal, InputKind::kOutlierChannels, InputKind::kKeyBias}) {
      for (CausalAlignment mask : {CausalAlignment::kNone, CausalAlignment::kTopLeft}) {
        AttentionShape s;
        s.dtype = DType::kBFloat16;
        s.batch = 2;
        s.max_q_len = s.max_kv_len = 256;
        s.num_heads = 8;
        s.num_kv_heads = 2;
        s.head_dim = H;
        s.mask.causal = mask;
        s.return_lse = true;
        s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
        const HostCase base = MakeCase(s, kind, ++seed, false);
        std::printf("[%s] H%lld %-16s %-9s", path.c_str(), static_cast<long long>(H),
                    InputKindName(kind), kernels::CausalAlignmentName(mask));
        for (int recipe = 0; recipe < 4; ++recipe) {
          HostCase c = base;
          c.shape.fp8.rotate = (recipe & 1) != 0;
          c.shape.fp8.smooth_k = (recipe & 2) != 0;
          c.name += std::string(" recipe=") + recipe_names[recipe];
          KernelRunner r;
          r.name = "fp8-" + path;
          r.run = run;
          r.tolerance = H == 128 ? 0.10 : 0.15;
          r.lse_tolerance = 0.25;
          CaseResult res = RunCase(r, c);
          std::printf("  %s %.4f (lse %.3g)", recipe_names[recipe], res.rel_l2, res.worst_lse_abs);
          // What this table asserts (the default recipe's rel_l2, and its lse off the outlier
          // set) decides the recorded status; the other recipes' rows are reports.
          const bool asserted = recipe == 3;
          const bool l2_ok = std::isfinite(res.rel_l2) && res.rel_l2 <= r.tolerance;
          const bool lse_ok = kind == InputKind::kOutlierChannels || res.worst_lse_abs <= 0.25;
          res.passed = !asserted || (l2_ok && lse_ok);
          if (!asserted) res.failure.clear();
          if (jsonl.is_open()) {
            jsonl << ResultsToJson(std::string("fp8-prepass/") + path + (asserted ? "" : "/report"),
                                   {res});
          }
          if (asserted) {
            EXPECT_TRUE(l2_ok) << path << " " << c.name << ": rel_l2 " << res.rel_l2;
            EXPECT_TRUE(lse_ok) << path << " " << c.name << ": lse " << res.worst_lse_abs;
          }
        }
        std::printf("\n");
      }
    }
  }
}

TEST_F(Fp8PrepassGpu, RecipeErrorsOwnKernel) { RecipeTable("own", RunOwn); }

#if defined(ATTN_TEST_CUDNN)
TEST_F(Fp8PrepassGpu, RecipeErrorsCudnn) {
  std::string why;
  if (Cudnn(&why) == nullptr) GTEST_SKIP() << why << ": skipped";
  RecipeTable("cudnn", RunCudnn);
}
#endif

TEST_F(Fp8PrepassGpu, PaddingGarbageChangesNothing) {
  std::vector<std::pair<std::string, PathRun>> paths{{"own", RunOwn}};
#if defined(ATTN_TEST_CUDNN)
  if (Cudnn(nullptr) != nullptr) paths.emplace_back("cudnn", RunCudnn);
#endif
  for (const auto& [name, run] : paths) {
    for (int recipe : {0, 3}) {
      AttentionShape s;
      s.dtype = DType::kBFloat16;
      s.batch = 8;
      s.max_q_len = s.max_kv_len = 128;
      s.num_heads = 4;
      s.num_kv_heads = 4;
      s.head_dim = 128;
      s.has_lengths = true;
      s.return_lse = true;
      s.scale = 0.088f;
      s.fp8.rotate = s.fp8.smooth_k = recipe == 3;
      HostCase clean = MakeCase(s, InputKind::kNormal, 99 + recipe, false);
      HostCase dirty = clean;
      PoisonPadding(&dirty);
      HostOutputs a, b;
      a.o.assign(clean.q.size(), 0);
      a.lse.assign(s.lse_elements(), 0.f);
      b = a;
      ASSERT_TRUE(run(clean, &a).ok()) << name;
      ASSERT_TRUE(run(dirty, &b).ok()) << name;
      EXPECT_EQ(a.o, b.o) << name << " recipe " << recipe;
      EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), 4 * a.lse.size()), 0)
          << name << " recipe " << recipe;
    }
  }
}

}  // namespace
}  // namespace attn::parity
