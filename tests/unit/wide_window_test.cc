// Windows wider than the problem (issue 14 item 5): window_left/right of 2^31, 2^32, 2^40 and
// INT64_MAX mean "unbounded". The Attend validator turns every window >= 2 * max_tokens (2^25,
// >= T + S of every accepted request) into -1 (kernels::NormalizeMask) before any backend, so no
// library narrows it to int32 (cuDNN's band bounds took 2^32 as 0 and 2^31 as negative). Each case
// runs the validated problem on the cpu backend and compares it with a float64 reference that
// applies the request's raw int64 windows (no clamping), for no causal mask and both causal
// alignments, T > S and T < S.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

using attention::v1::AttendRequest;
using kernels::CausalAlignment;

constexpr int64_t kN = 2, kH = 8;

std::vector<float> Values(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<float>((seed >> 8) & 0xffff) / 32768.f - 1.f;
  }
  return v;
}

void SetTensor(attention::v1::Tensor* t, const std::vector<float>& v, int64_t rows) {
  t->set_dtype(attention::v1::FLOAT32);
  for (int64_t d : {int64_t{1}, rows, kN, kH}) t->add_shape(d);
  t->mutable_data()->assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// float64 attention of (1, T, N, H) q over (1, S, N, H) k/v with the raw windows: key j is
// kept for row i iff diag - j <= wl (wl >= 0) and j - diag <= wr (wr >= 0, 0 when causal).
// diag - j and j - diag are small, so no arithmetic here can overflow for any int64 window.
std::vector<double> Reference(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, int64_t T, int64_t S,
                              CausalAlignment causal, int64_t wl, int64_t wr) {
  std::vector<double> o(T * kN * kH, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kH));
  if (causal != CausalAlignment::kNone) wr = 0;
  for (int64_t n = 0; n < kN; ++n) {
    for (int64_t i = 0; i < T; ++i) {
      const int64_t diag = causal == CausalAlignment::kTopLeft ? i : i + S - T;
      std::vector<double> p(S, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        const bool keep = (wl < 0 || diag - j <= wl) && (wr < 0 || j - diag <= wr);
        if (!keep) {
          p[j] = std::nan("");
          continue;
        }
        double dot = 0;
        for (int64_t h = 0; h < kH; ++h)
          dot += double{q[(i * kN + n) * kH + h]} * k[(j * kN + n) * kH + h];
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      if (std::isinf(mx)) continue;  // no key: o = 0
      double sum = 0;
      for (int64_t j = 0; j < S; ++j) {
        p[j] = std::isnan(p[j]) ? 0.0 : std::exp(p[j] - mx);
        sum += p[j];
      }
      for (int64_t j = 0; j < S; ++j) {
        for (int64_t h = 0; h < kH; ++h) {
          o[(i * kN + n) * kH + h] += p[j] / sum * v[(j * kN + n) * kH + h];
        }
      }
    }
  }
  return o;
}

struct Case {
  CausalAlignment causal;
  attention::v1::CausalAlignment proto;
};

// Runs one request through the validator and the cpu backend; returns the max abs error
// against Reference and the windows the backend was given.
void RunCase(int64_t T, int64_t S, const Case& c, int64_t w, bool both_sides) {
  const std::vector<float> q = Values(T * kN * kH, 1), k = Values(S * kN * kH, 2),
                           v = Values(S * kN * kH, 3);
  AttendRequest r;
  SetTensor(r.mutable_q(), q, T);
  SetTensor(r.mutable_k(), k, S);
  SetTensor(r.mutable_v(), v, S);
  r.mutable_mask()->set_causal(c.proto);
  r.mutable_mask()->set_window_left(w);
  if (both_sides) r.mutable_mask()->set_window_right(w);
  auto val = ValidateAttend(r);
  ASSERT_TRUE(val.ok()) << val.status().ToString();
  const kernels::MaskSpec& m = val->shape.mask;
  if (w >= 2 * ValidationLimits{}.max_tokens) {
    // Wider than any problem the validator accepts: unbounded, so nothing that does not fit
    // the int32 band bounds reaches a backend.
    EXPECT_EQ(m.window_left, -1) << "w=" << w;
    EXPECT_EQ(m.window_right, -1) << "w=" << w;
  } else {
    EXPECT_EQ(m.window_left, w);
    EXPECT_EQ(m.window_right, both_sides ? w : -1);
  }
  std::vector<float> o(T * kN * kH, -7.f);
  ASSERT_TRUE(kernels::CpuAttention(val->shape, val->Tensors(o.data(), nullptr), 1).ok());
  const std::vector<double> ref = Reference(q, k, v, T, S, c.causal, w, both_sides ? w : -1);
  double err = 0;
  for (size_t i = 0; i < o.size(); ++i) err = std::max(err, std::abs(o[i] - ref[i]));
  EXPECT_LT(err, 1e-5) << "T=" << T << " S=" << S << " causal=" << static_cast<int>(c.causal)
                       << " w=" << w;
  // The tightest exact bound, the request's own T + S, gives the same keys too.
  kernels::AttentionShape tight = val->shape;
  tight.mask = kernels::NormalizeMask({c.causal, w, both_sides ? w : -1}, T, S);
  EXPECT_EQ(tight.mask.window_left, w >= T + S ? -1 : w);
  std::fill(o.begin(), o.end(), -7.f);
  ASSERT_TRUE(kernels::CpuAttention(tight, val->Tensors(o.data(), nullptr), 1).ok());
  err = 0;
  for (size_t i = 0; i < o.size(); ++i) err = std::max(err, std::abs(o[i] - ref[i]));
  EXPECT_LT(err, 1e-5) << "tight: T=" << T << " S=" << S << " w=" << w;
}

const Case kCases[] = {
    {CausalAlignment::kNone, attention::v1::CAUSAL_NONE},
    {CausalAlignment::kTopLeft, attention::v1::CAUSAL_TOP_LEFT},
    {CausalAlignment::kBottomRight, attention::v1::CAUSAL_BOTTOM_RIGHT},
};
const int64_t kWide[] = {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40,
                         std::numeric_limits<int64_t>::max()};

TEST(WideWindow, WindowsWiderThanTheProblemAreUnboundedAndExact) {
  for (const auto& [T, S] : {std::pair<int64_t, int64_t>{6, 3}, {3, 6}}) {
    for (const Case& c : kCases) {
      for (int64_t w : kWide) {
        // No causal mask: window_left = window_right = w; causal: window_left = w only.
        RunCase(T, S, c, w, /*both_sides=*/c.causal == CausalAlignment::kNone);
      }
    }
  }
}

// Windows around T + S stay as given and keep the reference's keys; NormalizeMask at the
// request's own extents (the tightest exact bound) too.
TEST(WideWindow, NormalisationIsExactNearTheThreshold) {
  for (const auto& [T, S] : {std::pair<int64_t, int64_t>{6, 3}, {3, 6}, {5, 5}}) {
    for (const Case& c : kCases) {
      for (int64_t w = 0; w <= T + S + 1; ++w) {
        RunCase(T, S, c, w, c.causal == CausalAlignment::kNone);
      }
    }
  }
}

// Requests with the same window keep one batching signature whatever their lengths (the bound
// is the validator's limit, not the request's T + S).
TEST(WideWindow, TheBoundDoesNotDependOnTheRequest) {
  EXPECT_EQ(ValidationLimits{}.max_tokens, int64_t{1} << 24);
  for (int64_t w : {int64_t{3}, (int64_t{1} << 25) - 1, int64_t{1} << 25, int64_t{1} << 31}) {
    std::vector<int64_t> seen;
    for (const auto& [T, S] : {std::pair<int64_t, int64_t>{1, 2}, {6, 3}, {40, 70}}) {
      AttendRequest r;
      SetTensor(r.mutable_q(), Values(T * kN * kH, 1), T);
      SetTensor(r.mutable_k(), Values(S * kN * kH, 2), S);
      SetTensor(r.mutable_v(), Values(S * kN * kH, 3), S);
      r.mutable_mask()->set_window_left(w);
      auto v = ValidateAttend(r);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      seen.push_back(v->shape.mask.window_left);
    }
    const int64_t want = w >= (int64_t{1} << 25) ? -1 : w;
    EXPECT_EQ(seen, (std::vector<int64_t>{want, want, want})) << "w=" << w;
  }
}

TEST(WideWindow, NormalizeMaskUsesTheLargestExtents) {
  kernels::MaskSpec m{CausalAlignment::kNone, 9, 8};
  const kernels::MaskSpec a = kernels::NormalizeMask(m, 4, 5);  // T + S = 9
  EXPECT_EQ(a.window_left, -1);
  EXPECT_EQ(a.window_right, 8);
  const kernels::MaskSpec b = kernels::NormalizeMask({CausalAlignment::kTopLeft, -1, -1}, 4, 5);
  EXPECT_EQ(b.window_left, -1);
  EXPECT_EQ(b.window_right, -1);
  EXPECT_EQ(b.causal, CausalAlignment::kTopLeft);
}

}  // namespace
}  // namespace attn
