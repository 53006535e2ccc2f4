// The parity harness (parity_harness.h): input generation, poisoning, the float64 reference and
// the checks of DESIGN.md §4.
#include "parity_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"

namespace attn::parity {

using kernels::AttentionTensors;
using kernels::BandKeyRange;
using kernels::CausalAlignment;
using kernels::DType;
using kernels::KeyRange;
using kernels::Layout;

namespace {

/// splitmix64: small, fast, identical on every platform (unlike std::normal_distribution).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1).
  double Uniform() {
    return (static_cast<double>(Next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  /// Uniform integer in [lo, hi].
  int64_t Int(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  /// Standard normal (Box–Muller).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(Uniform()));
    const double a = 6.283185307179586 * Uniform();
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  uint64_t s_;
  double spare_ = 0;
  bool has_spare_ = false;
};

const char* ShortDType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    default:
      return "fp8";
  }
}

/// Fills `n` elements of `dtype` with `scale_of(channel) · N(0, 1)`, never exactly zero.
template <typename ScaleFn>
void FillNormal(std::vector<uint8_t>* buf, DType dtype, int64_t n, int64_t head_dim, Rng* rng,
                ScaleFn scale_of) {
  buf->assign(static_cast<size_t>(n) * kernels::DTypeSize(dtype), 0);
  for (int64_t i = 0; i < n; ++i) {
    double x = rng->Normal();
    if (std::fabs(x) < 1e-3) x = x < 0 ? -1e-3 : 1e-3;  // keep rounded values away from 0
    kernels::StoreFromFloat(buf->data(), dtype, i, static_cast<float>(x * scale_of(i % head_dim)));
  }
}

std::string Fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

const char* InputKindName(InputKind kind) {
  switch (kind) {
    case InputKind::kNormal:
      return "normal";
    case InputKind::kLogitsTimes8:
      return "logits_x8";
    case InputKind::kOutlierChannels:
      return "outlier_channels";
    case InputKind::kHuge:
      return "huge";
    case InputKind::kTiny:
      return "tiny";
    case InputKind::kKeyBias:
      return "k_bias";
  }
  return "unknown";
}

double ToleranceFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 1e-2;
    case DType::kFloat8E4M3:
      return 6e-2;
  }
  return 0;
}

HostCase MakeCase(const AttentionShape& shape_in, InputKind kind, uint64_t seed, bool allow_empty) {
  HostCase c;
  c.shape = shape_in;
  AttentionShape& s = c.shape;
  Rng rng(seed);
  const int64_t B = s.batch, T = s.max_q_len, S = s.max_kv_len, H = s.head_dim;
  if (s.scale == 0.f) s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));

  const bool varlen = s.layout == Layout::kVarlen;
  if (varlen) s.has_lengths = true;
  if (s.has_lengths) {
    c.q_lengths.resize(B);
    c.kv_lengths.resize(B);
    for (int64_t b = 0; b < B; ++b) {
      // Entry 0 uses the full extents (so T and S are the true maxima); the others are drawn,
      // which yields lengths that are not multiples of 64/128. With allow_empty, entry 1 has
      // no keys and the others may have none.
      int64_t tq = b == 0 ? T : rng.Int(std::min<int64_t>(1, T), T);
      int64_t tk = b == 0 ? S : rng.Int(allow_empty ? 0 : std::min<int64_t>(1, S), S);
      if (allow_empty && b == 1) tk = 0;
      c.q_lengths[b] = static_cast<int32_t>(tq);
      c.kv_lengths[b] = static_cast<int32_t>(tk);
    }
  }
  if (varlen) {
    c.q_offsets.assign(B + 1, 0);
    c.kv_offsets.assign(B + 1, 0);
    for (int64_t b = 0; b < B; ++b) {
      c.q_offsets[b + 1] = c.q_offsets[b] + c.q_lengths[b];
      c.kv_offsets[b + 1] = c.kv_offsets[b] + c.kv_lengths[b];
    }
    s.total_q = c.q_offsets[B];
    s.total_kv = c.kv_offsets[B];
  }

  // Per-kind scales of q, k, v (per head-dim channel for the outlier kind).
  double q_scale = 1, k_scale = 1, v_scale = 1;
  switch (kind) {
    case InputKind::kNormal:
      break;
    case InputKind::kLogitsTimes8:
      q_scale = 8;
      break;
    case InputKind::kOutlierChannels:
      break;
    case InputKind::kHuge:
      // Large q and v, compensating small k: logits stay O(1), values and outputs are large.
      if (s.dtype == DType::kFloat16) {
        q_scale = 1000, k_scale = 1e-3, v_scale = 8000;  // |v| < 65504 after 6 sigma
      } else {
        q_scale = 1e15, k_scale = 1e-15, v_scale = 1e30;
      }
      break;
    case InputKind::kTiny:
      q_scale = k_scale = v_scale = 1e-3;
      break;
    case InputKind::kKeyBias:
      break;
  }
  auto outlier = [&](int64_t ch) {
    // Three channels x20 in q and k (logits of std ~60: exp overflows without the max trick).
    // float32 gets two channels x5 (logit std ~5): its 1e-5 tolerance is below the rounding
    // error a correct fp32-accumulating kernel makes on logits of magnitude ~100 (the absolute
    // logit error grows with |logit|), so larger outliers would fail correct kernels.
    if (kind != InputKind::kOutlierChannels) return 1.0;
    if (s.dtype == DType::kFloat32) return ch == 1 || ch == H / 2 ? 5.0 : 1.0;
    return ch == 1 || ch == H / 2 || ch == H - 1 ? 20.0 : 1.0;
  };
  FillNormal(&c.q, s.dtype, s.q_elements(), H, &rng,
             [&](int64_t ch) { return q_scale * outlier(ch); });
  FillNormal(&c.k, s.dtype, s.kv_elements(), H, &rng,
             [&](int64_t ch) { return k_scale * outlier(ch); });
  FillNormal(&c.v, s.dtype, s.kv_elements(), H, &rng, [&](int64_t) { return v_scale; });
  if (kind == InputKind::kKeyBias) {
    const bool f32 = s.dtype == DType::kFloat32;
    for (int64_t i = 0; i < s.kv_elements(); ++i) {
      const int64_t ch = i % H;
      const bool biased = ch == 1 || ch == H / 2 || (!f32 && ch == H - 1);
      if (!biased) continue;
      const float x = kernels::LoadAsFloat(c.k.data(), s.dtype, i);
      kernels::StoreFromFloat(c.k.data(), s.dtype, i, x + (f32 ? 5.f : 20.f));
    }
  }

  std::ostringstream name;
  name << ShortDType(s.dtype) << ' ' << (varlen ? "varlen" : (s.has_lengths ? "pad+len" : "pad"))
       << " B" << B << " T" << T << " S" << S << " N" << s.num_heads << " K" << s.num_kv_heads
       << " H" << H << " mask=" << kernels::CausalAlignmentName(s.mask.causal);
  if (s.mask.window_left >= 0) name << " wl=" << s.mask.window_left;
  if (s.mask.window_right >= 0) name << " wr=" << s.mask.window_right;
  name << " kind=" << InputKindName(kind) << (s.return_lse ? " lse" : "")
       << (allow_empty ? " empty_kv" : "") << " seed=" << seed;
  if (s.has_lengths) {
    name << " lens=";
    for (int64_t b = 0; b < B; ++b) {
      name << (b ? "," : "") << c.q_lengths[b] << '/' << c.kv_lengths[b];
    }
  }
  c.name = name.str();
  return c;
}

CaseResult RunCase(const KernelRunner& runner, const HostCase& c) {
  CaseResult r;
  r.name = c.name;
  const AttentionShape& s = c.shape;
  const Status sup = runner.supports ? runner.supports(s) : Status::Ok();
  if (!sup.ok()) {
    r.skipped = true;
    r.skip_reason = sup.ToString();
    return r;
  }
  auto fail = [&](std::string why) {
    r.passed = false;
    if (r.failure.empty()) r.failure = std::move(why);
    return r;
  };

  // Reference (float64), from the same rounded inputs the runner receives.
  AttentionTensors t;
  t.q = c.q.data();
  t.k = c.k.data();
  t.v = c.v.data();
  if (s.has_lengths || s.layout == Layout::kVarlen) {
    t.q_lengths = c.q_lengths.empty() ? nullptr : c.q_lengths.data();
    t.kv_lengths = c.kv_lengths.empty() ? nullptr : c.kv_lengths.data();
  }
  if (s.layout == Layout::kVarlen) {
    t.q_offsets = c.q_offsets.data();
    t.kv_offsets = c.kv_offsets.data();
  }
  const int64_t q_elems = s.q_elements();
  const int64_t lse_elems = s.lse_elements();
  std::vector<double> ref_o(static_cast<size_t>(q_elems));
  std::vector<double> ref_lse(static_cast<size_t>(lse_elems));
  const Status ref_status = kernels::CpuAttentionF64(s, t, ref_o.data(), ref_lse.data());
  if (!ref_status.ok()) return fail("reference failed: " + ref_status.ToString());

  // Poisoned outputs: 0xFF bytes are NaN in float32, float16 and bfloat16.
  HostOutputs out;
  out.o.assign(static_cast<size_t>(q_elems) * kernels::DTypeSize(s.dtype), 0xFF);
  if (s.return_lse) {
    out.lse.resize(static_cast<size_t>(lse_elems));
    std::memset(out.lse.data(), 0xFF, out.lse.size() * sizeof(float));
  }
  const Status run_status = runner.run(c, &out);
  if (!run_status.ok()) return fail("runner failed: " + run_status.ToString());
  if (out.o.size() != static_cast<size_t>(q_elems) * kernels::DTypeSize(s.dtype)) {
    return fail("runner resized o");
  }
  if (s.return_lse && out.lse.size() != static_cast<size_t>(lse_elems)) {
    return fail("runner resized lse");
  }

  // Walk rows: (q row, head). Padded: q row = b*T + t. Varlen: q row in [q_offsets[b], ...).
  const int64_t N = s.num_heads, H = s.head_dim;
  const double tol = runner.tolerance > 0 ? runner.tolerance : ToleranceFor(s.dtype);
  const double lse_tol = runner.lse_tolerance > 0 ? runner.lse_tolerance : 1e-3;
  double diff2 = 0, ref2 = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const bool varlen = s.layout == Layout::kVarlen;
    const int64_t q_len = varlen || s.has_lengths ? c.q_lengths[b] : s.max_q_len;
    const int64_t kv_len = varlen || s.has_lengths ? c.kv_lengths[b] : s.max_kv_len;
    const int64_t rows = varlen ? q_len : s.max_q_len;
    const int64_t row0 = varlen ? c.q_offsets[b] : b * s.max_q_len;
    for (int64_t i = 0; i < rows; ++i) {
      const KeyRange kr = BandKeyRange(s.mask, i, q_len, kv_len);
      const bool empty = kr.empty();
      for (int64_t h = 0; h < N; ++h) {
        const int64_t base = ((row0 + i) * N + h) * H;
        bool ref_finite = true, got_finite = true;
        for (int64_t e = 0; e < H; ++e) {
          ref_finite = ref_finite && std::isfinite(ref_o[base + e]);
          got_finite =
              got_finite && std::isfinite(kernels::LoadAsFloat(out.o.data(), s.dtype, base + e));
        }
        if (!ref_finite) {
          // The row sees a non-finite key: it must not come out finite (NaN propagates).
          if (got_finite) {
            return fail(
                "row sees a non-finite key but its output is finite at b=" + std::to_string(b) +
                " row=" + std::to_string(i) + " head=" + std::to_string(h));
          }
          continue;
        }
        if (runner.exact_single_key && kr.lo == kr.hi) {
          // One visible key: p = 1 exactly, so o must be that key's v, bit for bit.
          const int64_t kv_row =
              s.layout == Layout::kVarlen ? c.kv_offsets[b] + kr.lo : b * s.max_kv_len + kr.lo;
          const int64_t vbase = (kv_row * s.num_kv_heads + h / (N / s.num_kv_heads)) * H;
          for (int64_t e = 0; e < H; ++e) {
            const float got = kernels::LoadAsFloat(out.o.data(), s.dtype, base + e);
            const float want = kernels::LoadAsFloat(c.v.data(), s.dtype, vbase + e);
            if (got != want) {
              return fail("single-key row is not v exactly at b=" + std::to_string(b) +
                          " row=" + std::to_string(i) + " head=" + std::to_string(h) +
                          " e=" + std::to_string(e) + ": " + Fmt(got) + " vs " + Fmt(want));
            }
          }
        }
        double d2 = 0, r2 = 0;
        for (int64_t e = 0; e < H; ++e) {
          const double got = kernels::LoadAsFloat(out.o.data(), s.dtype, base + e);
          const double want = ref_o[base + e];
          if (std::isnan(got) || std::isinf(got)) {
            return fail("non-finite output " + Fmt(got) + " at b=" + std::to_string(b) +
                        " row=" + std::to_string(i) + " head=" + std::to_string(h) + " e=" +
                        std::to_string(e) + (empty ? " (row sees no key: poison left?)" : ""));
          }
          if (empty && got != 0.0) {
            return fail(
                "row that sees no key (or padding) is not exactly 0 at b=" + std::to_string(b) +
                " row=" + std::to_string(i) + " head=" + std::to_string(h) + ": " + Fmt(got));
          }
          d2 += (got - want) * (got - want);
          r2 += want * want;
        }
        diff2 += d2;
        ref2 += r2;
        if (!empty) {
          const double row_rel = r2 > 0 ? std::sqrt(d2 / r2) : (d2 > 0 ? INFINITY : 0.0);
          if (row_rel > r.worst_row_rel) r.worst_row_rel = row_rel;
        }
        if (s.return_lse) {
          const int64_t li = varlen ? h * s.total_q + row0 + i : (b * N + h) * s.max_q_len + i;
          const double got = out.lse[li];
          const double want = ref_lse[li];
          if (std::isnan(got)) {
            return fail("lse is NaN at b=" + std::to_string(b) + " row=" + std::to_string(i) +
                        " head=" + std::to_string(h));
          }
          if (std::isinf(want) || std::isinf(got)) {
            if (!(std::isinf(want) && got == want)) {
              return fail("lse " + Fmt(got) + " where the reference is " + Fmt(want) +
                          " at b=" + std::to_string(b) + " row=" + std::to_string(i) +
                          " head=" + std::to_string(h));
            }
          } else {
            // Beyond lse_tol, 1e-6 of |lse| (~8 float32 ulps): lse is stored in float32, so
            // at the logits of the large-magnitude cases (~1e11) its rounding alone is ~1e4.
            const double excess = std::fabs(got - want) - 1e-6 * std::fabs(want);
            r.worst_lse_abs = std::max(r.worst_lse_abs, std::max(excess, 0.0));
          }
        }
      }
    }
  }
  r.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0.0);
  if (!(r.rel_l2 <= tol)) return fail("relative L2 error " + Fmt(r.rel_l2) + " > " + Fmt(tol));
  if (!(r.worst_row_rel <= 5 * tol)) {
    return fail("worst row relative error " + Fmt(r.worst_row_rel) + " > 5 x " + Fmt(tol));
  }
  if (!(r.worst_lse_abs <= lse_tol)) {
    return fail("lse absolute error " + Fmt(r.worst_lse_abs) + " > " + Fmt(lse_tol));
  }
  r.passed = true;
  return r;
}

std::vector<HostCase> StandardGrid(const GridOptions& options) {
  struct Extent {
    int64_t B, T, S;
  };
  // T != S, T = 1 (decode), S = 1, non-multiples of 64/128, and T > S.
  const std::vector<Extent> extents = {
      {1, 1, 1},    {3, 1, 130},   {1, 1, 64},    {1, 17, 17},   {3, 64, 17},
      {1, 17, 257}, {3, 17, 130},  {3, 130, 64},  {1, 257, 130}, {1, 257, 17},
      {3, 64, 64},  {1, 130, 257}, {3, 257, 257},
  };
  struct Mask {
    CausalAlignment causal;
    int64_t wl, wr;
  };
  const std::vector<Mask> masks = {
      {CausalAlignment::kNone, -1, -1},        {CausalAlignment::kTopLeft, -1, -1},
      {CausalAlignment::kBottomRight, -1, -1}, {CausalAlignment::kBottomRight, 37, -1},
      {CausalAlignment::kNone, 20, 11},
  };
  const int64_t N = 8;
  const std::vector<int64_t> kv_heads = {8, 2, 1};
  enum LayoutKind { kPad, kPadLen, kVar };
  std::vector<LayoutKind> layouts = {kPad, kPadLen};
  if (options.include_varlen) layouts.push_back(kVar);
  const std::vector<int64_t> head_dims =
      options.head_dims.empty() ? std::vector<int64_t>{64} : options.head_dims;

  std::vector<HostCase> cases;
  uint64_t n = 0;
  auto add = [&](DType dtype, int64_t hd, const Extent& e, const Mask& m, int64_t K, LayoutKind lk,
                 InputKind kind) {
    AttentionShape s;
    s.layout = lk == kVar ? Layout::kVarlen : Layout::kPadded;
    s.dtype = dtype;
    s.batch = e.B;
    s.max_q_len = e.T;
    s.max_kv_len = e.S;
    s.num_heads = N;
    s.num_kv_heads = K;
    s.head_dim = hd;
    s.mask.causal = m.causal;
    s.mask.window_left = m.wl;
    s.mask.window_right = m.wr;
    s.has_lengths = lk != kPad;
    s.return_lse = (n % 4) != 3;
    const bool allow_empty = lk != kPad && e.B > 1;
    cases.push_back(MakeCase(s, kind, options.seed + 7919 * n, allow_empty));
    ++n;
  };
  for (DType dtype : options.dtypes) {
    for (int64_t hd : head_dims) {
      // Main grid: every extent × mask × layout; the kv-head count rotates so that each
      // (extent, mask) and (mask, layout) pair meets every grouping.
      for (size_t ei = 0; ei < extents.size(); ++ei) {
        for (size_t mi = 0; mi < masks.size(); ++mi) {
          for (size_t li = 0; li < layouts.size(); ++li) {
            const int64_t K = kv_heads[(ei + mi + li) % kv_heads.size()];
            add(dtype, hd, extents[ei], masks[mi], K, layouts[li], InputKind::kNormal);
          }
        }
      }
      if (!options.include_hard_inputs) continue;
      // Hard inputs on a subset: causal and windowed masks, GQA, padded with lengths.
      const InputKind kinds[] = {InputKind::kLogitsTimes8, InputKind::kOutlierChannels,
                                 InputKind::kHuge, InputKind::kTiny};
      const Extent hard_extents[] = {{3, 130, 64}, {1, 64, 257}};
      for (size_t ki = 0; ki < 4; ++ki) {
        for (size_t xi = 0; xi < 2; ++xi) {
          add(dtype, hd, hard_extents[xi], masks[(ki + xi) % masks.size()],
              kv_heads[(ki + xi) % kv_heads.size()], xi == 0 ? kPadLen : kPad, kinds[ki]);
        }
      }
      // Long S (decode-like and short-prefill rows against many keys).
      add(dtype, hd, {1, 1, 2049}, masks[2], 2, kPad, InputKind::kLogitsTimes8);
      add(dtype, hd, {2, 16, 1500}, masks[3], 1, kPadLen, InputKind::kNormal);
    }
  }
  return cases;
}

std::vector<CaseResult> RunGrid(const KernelRunner& runner, const std::vector<HostCase>& cases) {
  std::vector<CaseResult> results;
  results.reserve(cases.size());
  for (const HostCase& c : cases) results.push_back(RunCase(runner, c));
  return results;
}

std::vector<CaseResult> RunSupported(const KernelRunner& runner, const std::vector<HostCase>& cases,
                                     int* skipped) {
  std::vector<CaseResult> results;
  int n = 0;
  for (const HostCase& c : cases) {
    if (runner.supports && !runner.supports(c.shape).ok()) {
      ++n;
      continue;
    }
    results.push_back(RunCase(runner, c));
  }
  if (skipped != nullptr) *skipped = n;
  return results;
}

std::string Summarize(const std::vector<CaseResult>& results, int max_failures) {
  int passed = 0, failed = 0;
  std::string first;
  for (const CaseResult& r : results) {
    if (r.skipped) continue;
    if (r.passed) {
      ++passed;
    } else if (++failed <= max_failures) {
      first += "\n    " + r.name + ": " + r.failure;
    }
  }
  return std::to_string(passed) + " passed, " + std::to_string(failed) + " failed" + first;
}

std::string ResultsToJson(const std::string& runner_name, const std::vector<CaseResult>& results) {
  std::string out;
  for (const CaseResult& r : results) {
    out += "{\"runner\":" + JsonString(runner_name) + ",\"case\":" + JsonString(r.name) +
           ",\"status\":" + JsonString(r.skipped ? "skipped" : (r.passed ? "passed" : "failed")) +
           ",\"rel_l2\":" + JsonNumber(r.rel_l2) +
           ",\"worst_row_rel\":" + JsonNumber(r.worst_row_rel) +
           ",\"worst_lse_abs\":" + JsonNumber(r.worst_lse_abs);
    if (r.skipped) out += ",\"skip_reason\":" + JsonString(r.skip_reason);
    if (!r.failure.empty()) out += ",\"failure\":" + JsonString(r.failure);
    out += "}\n";
  }
  return out;
}

}  // namespace attn::parity
