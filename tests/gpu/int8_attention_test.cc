// int8_attention_test: the INT8 Q·Kᵀ path of our 8-bit kernel (attn/kernels/int8_attention.h)
// after the per-token INT8 pre-pass (attn/kernels/int8_prepass.h), both P·V formats (E4M3, and
// 16-bit), against the float64 CPU reference of the UNQUANTISED inputs (parity harness):
//  - the pre-pass matches its host reference bit for bit (padding garbage included);
//  - recipe table: every recipe (rotation / K smoothing on or off) × input set (normal, ×20
//    outlier channels, +20 key bias) × H 64/128 × bf16/fp16 × mask (none, causal) × layout
//    (padded with lengths, varlen): relative L2 printed per recipe, the default recipe
//    (rotation + smoothing) asserted ≤ 0.05 on all three sets (issue 20's target);
//  - the standard grid and explicit shapes (GQA, T != S, windows, T = 1, empty key sets) with
//    the default recipe at the FP8 end-to-end tolerance; every tile variant;
//  - causal invariance (16-bit P·V, smoothing off): v[64] = 1024 and k[64] × 100 at T = S = 128
//    leave rows 0..63 bit-identical (o and lse), both causal alignments, rotation on and off;
//  - tile invariance: decode (T = 1, bottom-right causal) vs the last prefill row at S = 64 ..
//    8192 agree within bf16's tolerance (1e-2 relative L2 per head);
//  - padding garbage (±1e4, NaN past the lengths) changes no output bit;
//  - Supports, variant counts, workspace sizes, refusals (host-only).
// Without a CUDA device (or below sm_89) the GPU tests skip with the reason.
// ATTN_PARITY_OUT=<path>: per-case results appended as JSON lines ("int8/<label>").
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "attn/kernels/device_limits.h"
#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/int8_attention.h"
#include "attn/kernels/int8_prepass.h"
#include "parity_harness.h"

namespace attn::parity {
namespace {

using kernels::CausalAlignment;
using kernels::DType;
using kernels::Int8PvFormat;
using kernels::Layout;

constexpr double kDefaultRecipeTol = 0.05;  // issue 20: our 8-bit kernel, all three input sets
constexpr double kEndToEndTol = 8e-2;       // fp8_parity_test.cc's, for the shape grid
constexpr double kLseTol = 0.25;

std::string SkipReason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return "no CUDA device: skipped";
  }
  StatusOr<kernels::DeviceLimits> l = kernels::GetDeviceLimits(0);
  if (!l.ok()) return "no CUDA device: skipped (" + l.status().ToString() + ")";
  if (l->compute_capability < 890) return "device below sm_89: skipped";
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

/// Device copy of `bytes` host bytes (uninitialised when host is null; never a null pointer
/// unless cudaMalloc fails).
DevPtr Upload(const void* host, size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 256 : bytes) != cudaSuccess) return DevPtr();
  if (host != nullptr && bytes > 0) cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
  return DevPtr(p);
}

/// Everything one run of the INT8 path needs on the device.
struct DeviceRun {
  DevPtr q, k, v, o, lse, ql, kl, qo, ko, q8, k8, qs, ks, v8, vsc, pws, kws;
  kernels::AttentionTensors t;       // the 16-bit inputs
  kernels::Int8PrepassOutputs pre;
};

std::unique_ptr<DeviceRun> Prepare(const HostCase& c) {
  const AttentionShape& s = c.shape;
  auto d = std::make_unique<DeviceRun>();
  d->q = Upload(c.q.data(), c.q.size());
  d->k = Upload(c.k.data(), c.k.size());
  d->v = Upload(c.v.data(), c.v.size());
  d->o = Upload(nullptr, c.q.size());
  cudaMemset(d->o.get(), 0xFF, c.q.size());  // NaN poison: every row must be written
  d->lse = Upload(nullptr, s.lse_elements() * 4);
  d->ql = Upload(c.q_lengths.data(), c.q_lengths.size() * 4);
  d->kl = Upload(c.kv_lengths.data(), c.kv_lengths.size() * 4);
  d->qo = Upload(c.q_offsets.data(), c.q_offsets.size() * 8);
  d->ko = Upload(c.kv_offsets.data(), c.kv_offsets.size() * 8);
  d->q8 = Upload(nullptr, s.q_elements());
  d->k8 = Upload(nullptr, s.kv_elements());
  d->qs = Upload(nullptr, s.q_rows() * s.num_heads * 4);
  d->ks = Upload(nullptr, s.kv_rows() * s.num_kv_heads * 4);
  d->v8 = Upload(nullptr, s.kv_elements());
  d->vsc = Upload(nullptr, 16);
  d->pws = Upload(nullptr, kernels::Int8PrepassWorkspaceBytes(s));
  kernels::AttentionTensors& t = d->t;
  t.q = d->q.get();
  t.k = d->k.get();
  t.v = d->v.get();
  t.o = d->o.get();
  t.lse = s.return_lse ? static_cast<float*>(d->lse.get()) : nullptr;
  if (s.has_lengths && !c.q_lengths.empty()) {
    t.q_lengths = static_cast<const int32_t*>(d->ql.get());
    t.kv_lengths = static_cast<const int32_t*>(d->kl.get());
  }
  if (s.layout == Layout::kVarlen) {
    t.q_offsets = static_cast<const int64_t*>(d->qo.get());
    t.kv_offsets = static_cast<const int64_t*>(d->ko.get());
  }
  d->pre.q8 = static_cast<int8_t*>(d->q8.get());
  d->pre.k8 = static_cast<int8_t*>(d->k8.get());
  d->pre.q_scale = static_cast<float*>(d->qs.get());
  d->pre.k_scale = static_cast<float*>(d->ks.get());
  d->pre.v8 = static_cast<uint8_t*>(d->v8.get());
  d->pre.v_scalars = static_cast<float*>(d->vsc.get());
  return d;
}

/// Pre-pass, kernel (variant -1: default), lse shift; o and lse copied back into `out`.
Status RunInt8(const HostCase& c, HostOutputs* out, Int8PvFormat pv, int variant) {
  const AttentionShape& s = c.shape;
  kernels::Int8AttentionPlanOptions opt;
  opt.pv = pv;
  opt.variant = variant;
  StatusOr<kernels::Int8AttentionPlan> plan = kernels::Int8AttentionPlanFor(s, 0, opt);
  if (!plan.ok()) return plan.status();
  std::unique_ptr<DeviceRun> d = Prepare(c);
  ATTN_RETURN_IF_ERROR(kernels::Int8Prepass(s, d->t, pv, d->pre, d->pws.get(),
                                            kernels::Int8PrepassWorkspaceBytes(s), Stream()));
  d->kws = Upload(nullptr, plan->workspace_bytes);
  cudaMemset(d->kws.get(), 0x7F, plan->workspace_bytes);  // e4m3 NaN: unwritten bytes show
  kernels::AttentionTensors t = d->t;
  t.q = d->q8.get();
  t.k = d->k8.get();
  t.v = pv == Int8PvFormat::kE4M3 ? d->v8.get() : d->v.get();
  const kernels::Int8Scales sc{d->pre.q_scale, d->pre.k_scale, d->pre.v_scalars + 1};
  ATTN_RETURN_IF_ERROR(kernels::Int8AttentionRun(*plan, t, sc, d->kws.get(),
                                                 plan->workspace_bytes, Stream()));
  ATTN_RETURN_IF_ERROR(kernels::Fp8PrepassLseShift(s, d->t, d->pws.get(), Stream()));
  if (cudaStreamSynchronize(Stream()) != cudaSuccess) return Internal("stream sync failed");
  out->o.resize(c.q.size());
  cudaMemcpy(out->o.data(), d->o.get(), out->o.size(), cudaMemcpyDeviceToHost);
  if (s.return_lse) {
    out->lse.resize(s.lse_elements());
    cudaMemcpy(out->lse.data(), d->lse.get(), out->lse.size() * 4, cudaMemcpyDeviceToHost);
  }
  return cudaGetLastError() == cudaSuccess ? Status::Ok() : Internal("copy back failed");
}

KernelRunner Int8Runner(Int8PvFormat pv, int variant = -1, double tol = kEndToEndTol) {
  KernelRunner r;
  r.name = std::string("int8-") + kernels::Int8PvFormatName(pv);
  r.supports = [pv](const AttentionShape& s) { return kernels::Int8AttentionSupports(s, pv); };
  r.run = [pv, variant](const HostCase& c, HostOutputs* o) { return RunInt8(c, o, pv, variant); };
  r.tolerance = tol;
  r.lse_tolerance = kLseTol;
  return r;
}

std::string Label(Int8PvFormat pv) { return pv == Int8PvFormat::kE4M3 ? "e4m3-pv" : "16bit-pv"; }

void Record(const std::string& label, const std::vector<CaseResult>& results) {
  if (const char* path = std::getenv("ATTN_PARITY_OUT")) {
    std::ofstream(path, std::ios::app) << ResultsToJson("int8/" + label, results);
  }
}

/// Expects no failures, no skips, at least one pass; prints the worst error.
void ExpectParity(const std::string& label, const std::vector<CaseResult>& results) {
  Record(label, results);
  int passed = 0, failed = 0;
  double worst = 0;
  for (const CaseResult& r : results) {
    EXPECT_FALSE(r.skipped) << label << ": " << r.name << " skipped: " << r.skip_reason;
    if (r.passed) {
      ++passed;
    } else if (!r.skipped && ++failed <= 25) {
      ADD_FAILURE() << label << ": " << r.name << ": " << r.failure << " (rel_l2 " << r.rel_l2
                    << ")";
    }
    worst = std::max(worst, r.rel_l2);
  }
  std::printf("[int8/%s] %d passed, %d failed; worst rel_l2 %.4f\n", label.c_str(), passed,
              failed, worst);
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

/// Writes ±1e4 and NaN into every padding row (past the lengths) of a padded case.
void PoisonPadding(HostCase* c) {
  const AttentionShape& s = c->shape;
  auto poison = [&](std::vector<uint8_t>* buf, int64_t extent, const std::vector<int32_t>& len,
                    int64_t row) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = len[b]; t < extent; ++t)
        for (int64_t e = 0; e < row; ++e) {
          const float x = (t + e) % 5 == 0 ? NAN : ((t + e) % 2 ? 1e4f : -1e4f);
          kernels::StoreFromFloat(buf->data(), s.dtype, (b * extent + t) * row + e, x);
        }
  };
  poison(&c->q, s.max_q_len, c->q_lengths, s.num_heads * s.head_dim);
  poison(&c->k, s.max_kv_len, c->kv_lengths, s.num_kv_heads * s.head_dim);
  poison(&c->v, s.max_kv_len, c->kv_lengths, s.num_kv_heads * s.head_dim);
}

class Int8Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = SkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

template <class T>
std::vector<T> Download(const void* dev, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

TEST_F(Int8Gpu, PrepassMatchesTheHostReferenceBitForBit) {
  int cases = 0;
  uint64_t seed = 5300;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t H : {16, 64, 96, 128, 256}) {
      for (int layout = 0; layout < 3; ++layout) {  // padded, padded + lengths, varlen
        for (int recipe = 0; recipe < 4; ++recipe) {
          AttentionShape s = Shape(dt, 3, 130, 200, 4, 2, H, CausalAlignment::kNone, layout != 0);
          s.layout = layout == 2 ? Layout::kVarlen : Layout::kPadded;
          s.fp8.rotate = (recipe & 1) != 0;
          s.fp8.smooth_k = (recipe & 2) != 0;
          HostCase c = MakeCase(s, recipe == 3 ? InputKind::kKeyBias : InputKind::kOutlierChannels,
                                ++seed, /*allow_empty=*/layout != 0);
          if (layout == 1) PoisonPadding(&c);
          s = c.shape;
          const Int8PvFormat pv = recipe % 2 ? Int8PvFormat::k16Bit : Int8PvFormat::kE4M3;
          std::unique_ptr<DeviceRun> d = Prepare(c);
          ASSERT_TRUE(kernels::Int8Prepass(s, d->t, pv, d->pre, d->pws.get(),
                                           kernels::Int8PrepassWorkspaceBytes(s), Stream())
                          .ok());
          ASSERT_EQ(cudaStreamSynchronize(Stream()), cudaSuccess);
          kernels::Int8PrepassHost r;
          ASSERT_TRUE(kernels::Int8PrepassReference(
                          s, reinterpret_cast<const uint16_t*>(c.q.data()),
                          reinterpret_cast<const uint16_t*>(c.k.data()),
                          reinterpret_cast<const uint16_t*>(c.v.data()), HostIndex(c), pv, &r)
                          .ok());
          const std::string what = c.name + " recipe " + std::to_string(recipe);
          EXPECT_EQ(Download<int8_t>(d->q8.get(), s.q_elements()), r.q8) << what;
          EXPECT_EQ(Download<int8_t>(d->k8.get(), s.kv_elements()), r.k8) << what;
          EXPECT_TRUE(SameBits(Download<float>(d->qs.get(), s.q_rows() * s.num_heads), r.q_scale))
              << what;
          EXPECT_TRUE(
              SameBits(Download<float>(d->ks.get(), s.kv_rows() * s.num_kv_heads), r.k_scale))
              << what;
          if (pv == Int8PvFormat::kE4M3) {
            EXPECT_EQ(Download<uint8_t>(d->v8.get(), s.kv_elements()), r.v8) << what;
            EXPECT_TRUE(SameBits(Download<float>(d->vsc.get(), 3), r.v_scalars)) << what;
          }
          ++cases;
        }
      }
    }
  }
  std::printf("[int8 prepass] %d cases bit-identical to the host reference\n", cases);
}

// Every recipe × input set × H × dtype × mask × layout, both P·V formats: the table of errors;
// the default recipe asserted ≤ 0.05 (and its lse off the outlier set).
TEST_F(Int8Gpu, RecipeErrors) {
  const char* recipe_names[4] = {"plain", "rotate", "smooth_k", "default"};
  std::ofstream jsonl;
  if (const char* p = std::getenv("ATTN_PARITY_OUT")) jsonl.open(p, std::ios::app);
  uint64_t seed = 9100;
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    for (int64_t H : {64, 128}) {
      for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
        for (InputKind kind :
             {InputKind::kNormal, InputKind::kOutlierChannels, InputKind::kKeyBias}) {
          for (CausalAlignment mask : {CausalAlignment::kNone, CausalAlignment::kBottomRight}) {
            for (bool varlen : {false, true}) {
              AttentionShape s = Shape(dt, 2, 256, 320, 8, 2, H, mask, true);
              if (varlen) s.layout = Layout::kVarlen;
              const HostCase base = MakeCase(s, kind, ++seed, false);
              std::printf("[int8/%s] H%lld %s %-16s %-12s %-6s", Label(pv).c_str(),
                          static_cast<long long>(H), kernels::DTypeName(dt), InputKindName(kind),
                          kernels::CausalAlignmentName(mask), varlen ? "varlen" : "padded");
              for (int recipe = 0; recipe < 4; ++recipe) {
                HostCase c = base;
                c.shape.fp8.rotate = (recipe & 1) != 0;
                c.shape.fp8.smooth_k = (recipe & 2) != 0;
                c.name += std::string(" recipe=") + recipe_names[recipe];
                KernelRunner r = Int8Runner(pv, -1, kDefaultRecipeTol);
                CaseResult res = RunCase(r, c);
                std::printf("  %s %.4f", recipe_names[recipe], res.rel_l2);
                const bool asserted = recipe == 3;
                const bool l2_ok = std::isfinite(res.rel_l2) && res.rel_l2 <= kDefaultRecipeTol;
                const bool lse_ok =
                    kind == InputKind::kOutlierChannels || res.worst_lse_abs <= kLseTol;
                res.passed = !asserted || (l2_ok && lse_ok);
                if (!asserted) res.failure.clear();
                if (jsonl.is_open()) {
                  jsonl << ResultsToJson("int8/" + Label(pv) + "/recipes" +
                                             (asserted ? "" : "/report"),
                                         {res});
                }
                if (asserted) {
                  EXPECT_TRUE(l2_ok) << Label(pv) << " " << c.name << ": rel_l2 " << res.rel_l2;
                  EXPECT_TRUE(lse_ok) << Label(pv) << " " << c.name << ": lse "
                                      << res.worst_lse_abs;
                }
              }
              std::printf("\n");
            }
          }
        }
      }
    }
  }
}

// The standard grid (masks, GQA, padded/varlen, T != S, T = 1, empty key sets), default recipe.
TEST_F(Int8Gpu, StandardGrid) {
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    GridOptions opt;
    opt.dtypes = {DType::kBFloat16, DType::kFloat16};
    opt.head_dims = {64, 128};
    opt.include_hard_inputs = false;
    opt.seed = 4711;
    ExpectParity("grid/" + Label(pv), RunGrid(Int8Runner(pv), StandardGrid(opt)));
  }
}

/// T != S both ways, both alignments, GQA, decode rows, ragged lengths, windows, varlen.
std::vector<HostCase> ExplicitCases(int64_t H, InputKind kind, uint64_t seed) {
  std::vector<HostCase> cases;
  const DType d = DType::kBFloat16;
  for (CausalAlignment a : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    cases.push_back(MakeCase(Shape(d, 2, 300, 1000, 4, 2, H, a, false), kind, seed++, false));
    cases.push_back(MakeCase(Shape(d, 2, 1000, 300, 4, 4, H, a, false), kind, seed++, false));
  }
  cases.push_back(MakeCase(Shape(d, 3, 1, 4097, 8, 1, H, CausalAlignment::kBottomRight, false),
                           kind, seed++, false));
  cases.push_back(MakeCase(Shape(d, 4, 333, 517, 4, 2, H, CausalAlignment::kBottomRight, true),
                           kind, seed++, true));
  AttentionShape w = Shape(d, 2, 700, 700, 4, 2, H, CausalAlignment::kNone, false);
  w.mask.window_left = 100;
  w.mask.window_right = 3;
  cases.push_back(MakeCase(w, kind, seed++, false));
  AttentionShape v = Shape(d, 5, 300, 450, 8, 2, H, CausalAlignment::kTopLeft, true);
  v.layout = Layout::kVarlen;
  cases.push_back(MakeCase(v, kind, seed++, true));
  return cases;
}

TEST_F(Int8Gpu, EveryVariant) {
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    for (int64_t H : {64, 128}) {
      const std::vector<HostCase> cases = ExplicitCases(H, InputKind::kKeyBias, 300 + H);
      for (int i = 0; i < kernels::Int8AttentionVariantCount(pv, H); ++i) {
        ExpectParity("variant/" + Label(pv) + "/h" + std::to_string(H) + "/" + std::to_string(i),
                     RunGrid(Int8Runner(pv, i), cases));
      }
    }
  }
}

HostOutputs Outputs(const HostCase& c) {
  HostOutputs o;
  o.o.assign(c.q.size(), 0);
  o.lse.assign(c.shape.lse_elements(), 0.f);
  return o;
}

// 16-bit P·V, smoothing off: a key/value change at key 64 leaves rows 0..63 (which never see
// key 64 under causal masks at T = S = 128) bit-identical. E4M3 P·V is reported: its per-tensor V
// scale moves with v[64], which is why it makes no such promise.
TEST_F(Int8Gpu, CausalInvariance) {
  for (Int8PvFormat pv : {Int8PvFormat::k16Bit, Int8PvFormat::kE4M3}) {
    for (int64_t H : {64, 128}) {
      for (CausalAlignment a : {CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
        for (bool rotate : {false, true}) {
          AttentionShape s = Shape(DType::kBFloat16, 2, 128, 128, 4, 2, H, a, false);
          s.fp8.rotate = rotate;
          s.fp8.smooth_k = false;
          const HostCase base = MakeCase(s, InputKind::kNormal, 77 + H, false);
          HostCase changed = base;
          const int64_t row = s.num_kv_heads * H;
          for (int64_t b = 0; b < s.batch; ++b)
            for (int64_t e = 0; e < row; ++e) {
              const int64_t i = (b * s.max_kv_len + 64) * row + e;
              kernels::StoreFromFloat(changed.v.data(), s.dtype, i, 1024.f);
              const float k = kernels::LoadAsFloat(changed.k.data(), s.dtype, i);
              kernels::StoreFromFloat(changed.k.data(), s.dtype, i, k * 100.f);
            }
          HostOutputs x = Outputs(base), y = Outputs(changed);
          ASSERT_TRUE(RunInt8(base, &x, pv, -1).ok());
          ASSERT_TRUE(RunInt8(changed, &y, pv, -1).ok());
          int differing_rows = 0, later_rows_changed = 0;
          const int64_t o_row = s.num_heads * H * 2;  // bytes per token row of o
          for (int64_t b = 0; b < s.batch; ++b)
            for (int64_t t = 0; t < s.max_q_len; ++t) {
              const int64_t at = (b * s.max_q_len + t) * o_row;
              bool same = std::memcmp(&x.o[at], &y.o[at], o_row) == 0;
              for (int64_t n = 0; n < s.num_heads; ++n) {
                const int64_t li = (b * s.num_heads + n) * s.max_q_len + t;
                same = same && std::memcmp(&x.lse[li], &y.lse[li], 4) == 0;
              }
              if (t < 64) differing_rows += !same;
              if (t >= 64) later_rows_changed += !same;
            }
          const std::string what = Label(pv) + " H" + std::to_string(H) + " " +
                                   kernels::CausalAlignmentName(a) +
                                   (rotate ? " rotate" : " no-rotate");
          std::printf("[int8/causal-invariance] %s: %d of rows 0..63 differ (%d later rows do)\n",
                      what.c_str(), differing_rows, later_rows_changed);
          EXPECT_GT(later_rows_changed, 0) << what;  // the change is visible where it should be
          if (pv == Int8PvFormat::k16Bit) EXPECT_EQ(differing_rows, 0) << what;
        }
      }
    }
  }
}

// Decode (T = 1, bottom-right causal: the row sees all S keys) against the last row of the
// prefill T = S with the same keys: within bf16's tolerance, at S across the tile sizes.
TEST_F(Int8Gpu, DecodeMatchesPrefillRow) {
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    for (int64_t H : {64, 128}) {
      for (int64_t S : {64, 100, 1000, 4097, 8192}) {
        AttentionShape s = Shape(DType::kBFloat16, 1, S, S, 4, 2, H,
                                 CausalAlignment::kBottomRight, false);
        const HostCase prefill = MakeCase(s, InputKind::kOutlierChannels, 31 + S + H, false);
        HostCase decode = prefill;
        decode.shape.max_q_len = 1;
        const int64_t q_row = s.num_heads * H * 2;  // bytes
        decode.q.assign(prefill.q.end() - q_row, prefill.q.end());
        HostOutputs a = Outputs(prefill), b = Outputs(decode);
        ASSERT_TRUE(RunInt8(prefill, &a, pv, -1).ok());
        ASSERT_TRUE(RunInt8(decode, &b, pv, -1).ok());
        const bool identical = std::memcmp(&a.o[(S - 1) * q_row], b.o.data(), q_row) == 0;
        double worst = 0;
        for (int64_t n = 0; n < s.num_heads; ++n) {
          double num = 0, den = 0;
          for (int64_t d = 0; d < H; ++d) {
            const int64_t e = n * H + d;
            const double x = kernels::LoadAsFloat(a.o.data(), s.dtype, (S - 1) * q_row / 2 + e);
            const double y = kernels::LoadAsFloat(b.o.data(), s.dtype, e);
            num += (x - y) * (x - y);
            den += x * x;
          }
          worst = std::max(worst, std::sqrt(num / den));
        }
        std::printf("[int8/decode-vs-prefill] %s H%lld S %lld: worst head rel %.3g%s\n",
                    Label(pv).c_str(), static_cast<long long>(H), static_cast<long long>(S),
                    worst, identical ? " (bit-identical)" : "");
        EXPECT_LE(worst, 1e-2) << Label(pv) << " H" << H << " S " << S;
      }
    }
  }
}

TEST_F(Int8Gpu, PaddingGarbageChangesNothing) {
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    for (int recipe : {0, 3}) {
      AttentionShape s = Shape(DType::kBFloat16, 8, 128, 128, 4, 4, 128,
                               CausalAlignment::kNone, true);
      s.fp8.rotate = s.fp8.smooth_k = recipe == 3;
      const HostCase clean = MakeCase(s, InputKind::kNormal, 99 + recipe, false);
      HostCase dirty = clean;
      PoisonPadding(&dirty);
      ASSERT_NE(clean.v, dirty.v);
      HostOutputs a = Outputs(clean), b = Outputs(dirty);
      ASSERT_TRUE(RunInt8(clean, &a, pv, -1).ok());
      ASSERT_TRUE(RunInt8(dirty, &b, pv, -1).ok());
      EXPECT_EQ(a.o, b.o) << Label(pv) << " recipe " << recipe;
      EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), 4 * a.lse.size()), 0)
          << Label(pv) << " recipe " << recipe;
    }
  }
}

TEST_F(Int8Gpu, VariantsFitL4AndRunErrors) {
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    for (int64_t H : {64, 128}) {
      for (int i = 0; i < kernels::Int8AttentionVariantCount(pv, H); ++i) {
        kernels::Int8AttentionPlanOptions opt;
        opt.pv = pv;
        opt.variant = i;
        auto plan = kernels::Int8AttentionPlanFor(
            Shape(DType::kFloat16, 1, 128, 128, 1, 1, H, CausalAlignment::kNone, false), 0, opt);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        EXPECT_LE(plan->smem_bytes, 101376) << plan->Describe();
        std::printf("%s\n", plan->Describe().c_str());
      }
    }
  }
  const AttentionShape s = Shape(DType::kBFloat16, 2, 16, 16, 4, 2, 64, CausalAlignment::kNone,
                                 false);
  auto plan = kernels::Int8AttentionPlanFor(s, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(kernels::Int8AttentionRun(*plan, {}, {}, nullptr, plan->workspace_bytes, Stream())
                .code(),
            StatusCode::kInvalidArgument);
  kernels::Int8AttentionPlanOptions bad;
  bad.variant = 99;
  EXPECT_EQ(kernels::Int8AttentionPlanFor(s, 0, bad).status().code(),
            StatusCode::kInvalidArgument);
}

// Host-only checks: no device needed.
TEST(Int8Supports, WhatEachPathTakes) {
  AttentionShape s = Shape(DType::kBFloat16, 2, 16, 16, 4, 2, 64, CausalAlignment::kNone, false);
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    EXPECT_TRUE(kernels::Int8AttentionSupports(s, pv).ok());
    EXPECT_TRUE(kernels::Int8AttentionSupports(s, pv, 890).ok());
    EXPECT_TRUE(kernels::Int8AttentionSupports(s, pv, 900).ok());
    EXPECT_EQ(kernels::Int8AttentionSupports(s, pv, 800).code(), StatusCode::kFailedPrecondition);
    for (int64_t hd : {32, 80, 96, 256}) {
      AttentionShape h = s;
      h.head_dim = hd;
      EXPECT_EQ(kernels::Int8AttentionSupports(h, pv).code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(kernels::Int8AttentionVariantCount(pv, hd), 0);
    }
    AttentionShape f = s;
    f.dtype = DType::kFloat32;
    EXPECT_EQ(kernels::Int8AttentionSupports(f, pv).code(), StatusCode::kFailedPrecondition);
    EXPECT_GE(kernels::Int8AttentionVariantCount(pv, 64), 1);
    EXPECT_GE(kernels::Int8AttentionVariantCount(pv, 128), 1);
  }
  EXPECT_EQ(kernels::Int8AttentionSupports(s, static_cast<Int8PvFormat>(7)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(kernels::Int8AttentionWorkspaceBytes(s, Int8PvFormat::k16Bit), 0);
  EXPECT_EQ(kernels::Int8AttentionWorkspaceBytes(s, Int8PvFormat::kE4M3), 2 * 64 * 2 * 128);
}

}  // namespace
}  // namespace attn::parity
