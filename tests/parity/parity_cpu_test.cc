// parity_cpu: the harness checked on the CPU.
//  (a) the standard grid passes with a runner wrapping CpuAttention (outputs rounded once);
//  (b) a float32 emulation of the naive family's arithmetic (fp32 scores, expf softmax,
//      probabilities rounded to the input dtype, fp32 P·V) passes the padded grid: the hard
//      inputs are not so ill-conditioned that a correct fp32-accumulating kernel must fail
//      (ATTN_PARITY_SEED=<n> varies its inputs);
//  (c) injected faults are caught: one NaN, an ignored mask, a skipped row (poison left),
//      outputs 3% off. Each must FAIL every case it applies to.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"
#include "edge_cases.h"
#include "parity_harness.h"

namespace attn::parity {
namespace {

using kernels::AttentionTensors;
using kernels::BandKeyRange;
using kernels::CausalAlignment;
using kernels::DType;
using kernels::KeyRange;
using kernels::Layout;

AttentionTensors InputTensors(const HostCase& c) {
  AttentionTensors t;
  t.q = c.q.data();
  t.k = c.k.data();
  t.v = c.v.data();
  if (c.shape.has_lengths || c.shape.layout == Layout::kVarlen) {
    t.q_lengths = c.q_lengths.data();
    t.kv_lengths = c.kv_lengths.data();
  }
  if (c.shape.layout == Layout::kVarlen) {
    t.q_offsets = c.q_offsets.data();
    t.kv_offsets = c.kv_offsets.data();
  }
  return t;
}

Status RunCpu(const HostCase& c, const AttentionShape& s, HostOutputs* out) {
  AttentionTensors t = InputTensors(c);
  t.o = out->o.data();
  t.lse = s.return_lse ? out->lse.data() : nullptr;
  return kernels::CpuAttention(s, t);
}

KernelRunner CpuRunner() {
  return {"cpu", kernels::CpuSupports,
          [](const HostCase& c, HostOutputs* out) { return RunCpu(c, c.shape, out); }};
}

/// The naive family's arithmetic in float on the host (padded layout only, like naive).
Status RunNaiveEmulation(const HostCase& c, HostOutputs* out) {
  const AttentionShape& s = c.shape;
  const int64_t B = s.batch, T = s.max_q_len, S = s.max_kv_len, N = s.num_heads;
  const int64_t K = s.num_kv_heads, H = s.head_dim, G = N / K;
  std::vector<float> q(s.q_elements()), k(s.kv_elements()), v(s.kv_elements());
  for (size_t i = 0; i < q.size(); ++i) q[i] = kernels::LoadAsFloat(c.q.data(), s.dtype, i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = kernels::LoadAsFloat(c.k.data(), s.dtype, i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = kernels::LoadAsFloat(c.v.data(), s.dtype, i);
  std::vector<float> sc(S), p(S), acc(H);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = s.has_lengths ? c.q_lengths[b] : T;
    const int64_t kv_len = s.has_lengths ? c.kv_lengths[b] : S;
    for (int64_t h = 0; h < N; ++h) {
      const int64_t kh = h / G;
      for (int64_t t = 0; t < T; ++t) {
        const float* qr = &q[((b * T + t) * N + h) * H];
        const KeyRange kr = BandKeyRange(s.mask, t, q_len, kv_len);
        float m = -INFINITY;
        for (int64_t j = kr.lo; j <= kr.hi; ++j) {
          const float* kr_ = &k[((b * S + j) * K + kh) * H];
          float d = 0.f;
          for (int64_t e = 0; e < H; ++e) d = std::fma(qr[e], kr_[e], d);
          sc[j] = s.scale * d;
          m = std::max(m, sc[j]);
        }
        float l = 0.f;
        for (int64_t j = kr.lo; j <= kr.hi; ++j) l += std::exp(sc[j] - m);
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t j = kr.lo; j <= kr.hi; ++j) {
          uint16_t dummy = 0;
          float pj = std::exp(sc[j] - m) / l;
          if (s.dtype != DType::kFloat32) {  // probabilities are stored in the input dtype
            kernels::StoreFromFloat(&dummy, s.dtype, 0, pj);
            pj = kernels::LoadAsFloat(&dummy, s.dtype, 0);
          }
          const float* vr = &v[((b * S + j) * K + kh) * H];
          for (int64_t e = 0; e < H; ++e) acc[e] = std::fma(pj, vr[e], acc[e]);
        }
        const int64_t base = ((b * T + t) * N + h) * H;
        for (int64_t e = 0; e < H; ++e)
          kernels::StoreFromFloat(out->o.data(), s.dtype, base + e, acc[e]);
        if (s.return_lse) {
          out->lse[(b * N + h) * T + t] = kr.empty() ? -INFINITY : m + std::log(l);
        }
      }
    }
  }
  return Status::Ok();
}

/// Whether the band mask removes any key that padding alone would keep.
bool MaskMatters(const HostCase& c) {
  const AttentionShape& s = c.shape;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t q_len = c.q_lengths.empty() ? s.max_q_len : c.q_lengths[b];
    const int64_t kv_len = c.kv_lengths.empty() ? s.max_kv_len : c.kv_lengths[b];
    for (int64_t i = 0; i < q_len; ++i) {
      const KeyRange kr = BandKeyRange(s.mask, i, q_len, kv_len);
      if (kv_len > 0 && (kr.empty() || kr.lo != 0 || kr.hi != kv_len - 1)) return true;
    }
  }
  return false;
}

void ReportFailures(const std::vector<CaseResult>& results, int max_lines = 20) {
  int shown = 0;
  for (const CaseResult& r : results) {
    if (!r.skipped && !r.passed && shown++ < max_lines) {
      ADD_FAILURE() << r.name << ": " << r.failure;
    }
  }
}

TEST(ParityHarness, ToleranceAndInputs) {
  EXPECT_EQ(ToleranceFor(DType::kFloat32), 1e-5);
  EXPECT_EQ(ToleranceFor(DType::kFloat16), 2e-3);
  EXPECT_EQ(ToleranceFor(DType::kBFloat16), 1e-2);
  EXPECT_EQ(ToleranceFor(DType::kFloat8E4M3), 6e-2);
  AttentionShape s;
  s.dtype = DType::kFloat16;
  s.batch = 3;
  s.max_q_len = 33;
  s.max_kv_len = 45;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 16;
  s.has_lengths = true;
  const HostCase a = MakeCase(s, InputKind::kNormal, 42, true);
  const HostCase b = MakeCase(s, InputKind::kNormal, 42, true);
  const HostCase d = MakeCase(s, InputKind::kNormal, 43, true);
  EXPECT_EQ(a.q, b.q);  // seeded: reproducible
  EXPECT_NE(a.q, d.q);  // fresh per seed
  EXPECT_FLOAT_EQ(a.shape.scale, 0.25f);
  EXPECT_EQ(a.kv_lengths[1], 0);  // allow_empty: entry 1 has no keys
  for (size_t i = 0; i < a.q.size() / 2; ++i) {
    ASSERT_NE(kernels::LoadAsFloat(a.q.data(), s.dtype, i), 0.f) << "zero input at " << i;
  }
  s.layout = Layout::kVarlen;
  const HostCase v = MakeCase(s, InputKind::kHuge, 7, false);
  EXPECT_EQ(v.q_offsets.back(), v.shape.total_q);
  EXPECT_EQ(static_cast<int64_t>(v.q.size()), v.shape.total_q * 4 * 16 * 2);
  CaseResult ok_case;
  ok_case.name = "a\\b";
  ok_case.passed = true;
  ok_case.rel_l2 = 1e-6;
  const std::string json = ResultsToJson("x\"y", {ok_case});
  EXPECT_NE(json.find("\"runner\":\"x\\\"y\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"status\":\"passed\""), std::string::npos) << json;
}

TEST(ParityHarness, GridPassesWithCpuRunner) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<HostCase> cases = StandardGrid(GridOptions{});
  const std::vector<CaseResult> results = RunGrid(CpuRunner(), cases);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int passed = 0;
  for (const CaseResult& r : results) passed += r.passed;
  std::cout << "[grid] " << cases.size() << " cases, " << passed << " passed, " << secs
            << " s (reference + cpu runner)\n";
  EXPECT_EQ(passed, static_cast<int>(cases.size()));
  ReportFailures(results);
}

TEST(ParityHarness, Float32NaiveEmulationPasses) {
  GridOptions opt;
  opt.include_varlen = false;
  if (const char* seed = std::getenv("ATTN_PARITY_SEED"))
    opt.seed = std::strtoull(seed, nullptr, 10);
  const KernelRunner runner{
      "naive_emulation",
      [](const AttentionShape& s) {
        return s.layout == Layout::kPadded ? Status::Ok() : FailedPrecondition("padded only");
      },
      RunNaiveEmulation};
  const std::vector<CaseResult> results = RunGrid(runner, StandardGrid(opt));
  double worst[3] = {0, 0, 0}, worst_row[3] = {0, 0, 0};
  int passed = 0;
  for (size_t i = 0; i < results.size(); ++i) passed += results[i].passed;
  for (const CaseResult& r : results) {
    const int d = r.name.rfind("f32", 0) == 0 ? 0 : (r.name.rfind("f16", 0) == 0 ? 1 : 2);
    worst[d] = std::max(worst[d], r.rel_l2);
    worst_row[d] = std::max(worst_row[d], r.worst_row_rel);
  }
  std::cout << "[emulation] " << passed << "/" << results.size() << " passed; worst rel_l2 f32 "
            << worst[0] << " f16 " << worst[1] << " bf16 " << worst[2] << "; worst row f32 "
            << worst_row[0] << " f16 " << worst_row[1] << " bf16 " << worst_row[2] << "\n";
  EXPECT_EQ(passed, static_cast<int>(results.size()));
  ReportFailures(results);
}

/// Runs `fault` over `cases` and expects every case to fail (none skipped or passed).
void ExpectAllFail(const KernelRunner& fault, const std::vector<HostCase>& cases) {
  ASSERT_FALSE(cases.empty());
  for (const CaseResult& r : RunGrid(fault, cases)) {
    EXPECT_FALSE(r.skipped) << fault.name << " skipped " << r.name;
    EXPECT_FALSE(r.passed) << fault.name << " was not caught on " << r.name;
    EXPECT_FALSE(r.failure.empty());
  }
}

std::vector<HostCase> Sample(const std::vector<HostCase>& all, size_t every, bool need_mask) {
  std::vector<HostCase> out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (need_mask ? MaskMatters(all[i]) && i % 3 == 0 : i % every == 0) out.push_back(all[i]);
  }
  return out;
}

class FaultInjection : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    GridOptions opt;
    opt.include_hard_inputs = true;
    cases_ = new std::vector<HostCase>(StandardGrid(opt));
  }
  static void TearDownTestSuite() {
    delete cases_;
    cases_ = nullptr;
  }
  static std::vector<HostCase>* cases_;
};
std::vector<HostCase>* FaultInjection::cases_ = nullptr;

TEST_F(FaultInjection, OneNaNIsCaught) {
  const KernelRunner fault{"nan_one", kernels::CpuSupports, [](const HostCase& c, HostOutputs* o) {
                             ATTN_RETURN_IF_ERROR(RunCpu(c, c.shape, o));
                             kernels::StoreFromFloat(o->o.data(), c.shape.dtype,
                                                     c.shape.q_elements() / 2, NAN);
                             return Status::Ok();
                           }};
  ExpectAllFail(fault, Sample(*cases_, 11, false));
}

TEST_F(FaultInjection, IgnoredMaskIsCaught) {
  const KernelRunner fault{"ignore_mask", kernels::CpuSupports,
                           [](const HostCase& c, HostOutputs* o) {
                             AttentionShape s = c.shape;
                             s.mask = kernels::MaskSpec{};
                             return RunCpu(c, s, o);
                           }};
  ExpectAllFail(fault, Sample(*cases_, 0, true));
}

TEST_F(FaultInjection, SkippedRowIsCaught) {
  const KernelRunner fault{
      "skip_row", kernels::CpuSupports, [](const HostCase& c, HostOutputs* o) {
        HostOutputs full = *o;
        ATTN_RETURN_IF_ERROR(RunCpu(c, c.shape, &full));
        // Copy everything except (row 0, head 0): its poison stays.
        const size_t row_bytes = c.shape.head_dim * kernels::DTypeSize(c.shape.dtype);
        std::memcpy(o->o.data() + row_bytes, full.o.data() + row_bytes, o->o.size() - row_bytes);
        o->lse = full.lse;
        return Status::Ok();
      }};
  ExpectAllFail(fault, Sample(*cases_, 11, false));
}

TEST_F(FaultInjection, ThreePercentOffIsCaught) {
  const KernelRunner fault{"off_3pct", kernels::CpuSupports, [](const HostCase& c, HostOutputs* o) {
                             ATTN_RETURN_IF_ERROR(RunCpu(c, c.shape, o));
                             const int64_t n = c.shape.q_elements();
                             for (int64_t i = 0; i < n; ++i) {
                               const float x = kernels::LoadAsFloat(o->o.data(), c.shape.dtype, i);
                               kernels::StoreFromFloat(o->o.data(), c.shape.dtype, i, x * 1.03f);
                             }
                             return Status::Ok();
                           }};
  ExpectAllFail(fault, Sample(*cases_, 11, false));
}

// Edge cases (edge_cases.h): the cpu reference passes every one, single-key rows bit-exact.
TEST(ParityHarness, EdgeCasesPassWithCpuRunner) {
  EdgeOptions opt;
  opt.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  opt.head_dims = {8, 64};
  KernelRunner runner = CpuRunner();
  runner.exact_single_key = true;
  const std::vector<HostCase> cases = EdgeCases(opt);
  const std::vector<CaseResult> results = RunGrid(runner, cases);
  int passed = 0;
  for (const CaseResult& r : results) passed += r.passed;
  EXPECT_EQ(passed, static_cast<int>(cases.size()));
  ReportFailures(results);
}

/// The naive family's arithmetic with the P·V sum over every key (masked probabilities are
/// exact zeros): what a GEMM does, so 0 · NaN leaks into rows that cannot see the key.
Status RunAllKeysPv(const HostCase& c, HostOutputs* out) {
  ATTN_RETURN_IF_ERROR(RunCpu(c, c.shape, out));
  const AttentionShape& s = c.shape;
  const int64_t T = s.max_q_len, S = s.max_kv_len, N = s.num_heads, K = s.num_kv_heads;
  const int64_t H = s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < N; ++h)
        for (int64_t e = 0; e < H; ++e) {
          const int64_t oi = ((b * T + t) * N + h) * H + e;
          float acc = kernels::LoadAsFloat(out->o.data(), s.dtype, oi);
          for (int64_t j = 0; j < S; ++j) {
            const float vj =
                kernels::LoadAsFloat(c.v.data(), s.dtype, ((b * S + j) * K + h / (N / K)) * H + e);
            if (!std::isfinite(vj)) acc += 0.f * vj;  // the masked probability times V
          }
          kernels::StoreFromFloat(out->o.data(), s.dtype, oi, acc);
        }
  return Status::Ok();
}

TEST(ParityHarness, EdgeCaseFaultsAreCaught) {
  EdgeOptions opt;
  opt.dtypes = {DType::kBFloat16};
  const std::vector<HostCase> cases = EdgeCases(opt);
  // 0 · NaN at masked keys: every non-finite case must fail.
  const KernelRunner leak{"masked_nan_leak", kernels::CpuSupports, RunAllKeysPv};
  int nonfinite = 0, caught = 0;
  for (const HostCase& c : cases) {
    if (c.name.find("non-finite") == std::string::npos) continue;
    ++nonfinite;
    caught += !RunCase(leak, c).passed;
  }
  EXPECT_GT(nonfinite, 0);
  EXPECT_EQ(caught, nonfinite);
  // One ulp off on single-key rows: the constant S=1 case must fail the exact check.
  KernelRunner ulp{"single_key_ulp", kernels::CpuSupports, [](const HostCase& c, HostOutputs* o) {
                     ATTN_RETURN_IF_ERROR(RunCpu(c, c.shape, o));
                     const float x = kernels::LoadAsFloat(o->o.data(), c.shape.dtype, 0);
                     kernels::StoreFromFloat(o->o.data(), c.shape.dtype, 0, x * (1 + 1.f / 64));
                     return Status::Ok();
                   }};
  ulp.exact_single_key = true;
  int single = 0;
  for (const HostCase& c : cases) {
    if (c.name.find("S=1 ") == std::string::npos) continue;
    ++single;
    const CaseResult r = RunCase(ulp, c);
    EXPECT_FALSE(r.passed) << c.name;
    EXPECT_NE(r.failure.find("single-key"), std::string::npos) << r.failure;
  }
  EXPECT_GT(single, 0);
}

}  // namespace
}  // namespace attn::parity
