// The per-token INT8 pre-pass's host reference (attn/kernels/int8_prepass.h,
// kernels/fp8/int8_prepass_reference.cc), the definition the GPU pre-pass is held to bit for bit.
// Checked here on the CPU:
//  - dequantised values x8·scale are within INT8 rounding (scale/2, plus the division's ulp) of
//    the transformed input (float64 rotation and mean computed here), for every recipe; every
//    row's largest |x| lands on ±127;
//  - padding garbage (±1e4, NaN, inf past the lengths, in q, k and v) changes nothing, and
//    padding rows come out as zeros with scale 0;
//  - per-token: changing one token's k changes no other token's k8 / k_scale (smooth_k off),
//    and with smooth_k on it changes them only through K's mean;
//  - non-finite rows: NaN scale and zeros, other rows untouched; all-zero rows: scale 1;
//  - V in E4M3 for the E4M3 P·V format (amax over valid rows only), nothing for 16-bit P·V;
//  - varlen, fp16, head dims 64/128/96, refusals, recipe names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/int8_prepass.h"

namespace attn::kernels {
namespace {

struct Inputs {
  AttentionShape shape;
  std::vector<uint16_t> q, k, v;
  std::vector<int32_t> q_lengths, kv_lengths;
  std::vector<int64_t> q_offsets, kv_offsets;
  AttentionTensors index;
};

/// B=2, T=S=`len`, N=4, K=2; padded with lengths (len, len/2 + 3) when `lengths`, or varlen
/// with those lengths. `outliers`: q and k channels 1, H/2, H-1 ×20; `k_bias`: +20 on them in k.
Inputs Make(int64_t H, int64_t len, bool lengths, bool varlen, DType dtype, bool outliers,
            bool k_bias, uint64_t seed) {
  Inputs in;
  AttentionShape& s = in.shape;
  s.dtype = dtype;
  s.batch = 2;
  s.max_q_len = s.max_kv_len = len;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = H;
  s.scale = 1.f / std::sqrt(static_cast<float>(H));
  const std::vector<int32_t> l = {static_cast<int32_t>(len), static_cast<int32_t>(len / 2 + 3)};
  if (varlen) {
    s.layout = Layout::kVarlen;
    s.has_lengths = true;
    in.q_offsets = in.kv_offsets = {0, l[0], l[0] + l[1]};
    s.total_q = s.total_kv = l[0] + l[1];
    in.index.q_offsets = in.q_offsets.data();
    in.index.kv_offsets = in.kv_offsets.data();
  } else if (lengths) {
    s.has_lengths = true;
    in.q_lengths = in.kv_lengths = l;
    in.index.q_lengths = in.q_lengths.data();
    in.index.kv_lengths = in.kv_lengths.data();
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto special = [&](int64_t c) { return c == 1 || c == H / 2 || c == H - 1; };
  auto fill = [&](std::vector<uint16_t>* t, int64_t n, bool outlier, bool bias) {
    t->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = i % H;
      float x = normal(rng);
      if (outlier && special(c)) x *= 20.f;
      if (bias && special(c)) x += 20.f;
      (*t)[i] = dtype == DType::kBFloat16 ? FloatToBf16(x) : FloatToFp16(x);
    }
  };
  fill(&in.q, s.q_elements(), outliers, false);
  fill(&in.k, s.kv_elements(), outliers, k_bias);
  fill(&in.v, s.kv_elements(), false, false);
  return in;
}

float Decode(const Inputs& in, uint16_t bits) {
  return in.shape.dtype == DType::kBFloat16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
}

Int8PrepassHost Reference(const Inputs& in, Int8PvFormat pv = Int8PvFormat::kE4M3) {
  Int8PrepassHost o;
  const Status s =
      Int8PrepassReference(in.shape, in.q.data(), in.k.data(), in.v.data(), in.index, pv, &o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return o;
}

int64_t Len(const Inputs& in, bool q, int64_t b) {
  if (in.shape.layout == Layout::kVarlen) {
    const auto& off = q ? in.q_offsets : in.kv_offsets;
    return off[b + 1] - off[b];
  }
  if (!in.shape.has_lengths) return q ? in.shape.max_q_len : in.shape.max_kv_len;
  return (q ? in.q_lengths : in.kv_lengths)[b];
}
int64_t RowBase(const Inputs& in, bool q, int64_t b) {
  if (in.shape.layout == Layout::kVarlen) return (q ? in.q_offsets : in.kv_offsets)[b];
  return b * (q ? in.shape.max_q_len : in.shape.max_kv_len);
}

/// float64 transform of one row: the orthonormal Sylvester-Hadamard rotation per block of
/// `order` (H_n[i][j] = (−1)^popcount(i & j) / sqrt(n)), then minus `mean`.
std::vector<double> Transform64(const Inputs& in, const uint16_t* row, const float* mean) {
  const int64_t H = in.shape.head_dim;
  std::vector<double> x(H), y(H);
  for (int64_t i = 0; i < H; ++i) x[i] = Decode(in, row[i]);
  if (in.shape.fp8.rotate) {
    const int n = Fp8HadamardOrder(H);
    for (int64_t base = 0; base < H; base += n)
      for (int j = 0; j < n; ++j) {
        double acc = 0;
        for (int i = 0; i < n; ++i)
          acc += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * x[base + i];
        y[base + j] = acc / std::sqrt(static_cast<double>(n));
      }
    x = y;
  }
  if (mean)
    for (int64_t i = 0; i < H; ++i) x[i] -= mean[i];
  return x;
}

/// Every valid row of q (is_q) or k: x8·scale within scale/2 (+ slack for the fp32 transform)
/// of the float64 transform; max |x8| == 127. Padding rows: zeros, scale 0.
void CheckTensor(const Inputs& in, const Int8PrepassHost& o, bool is_q) {
  const AttentionShape& s = in.shape;
  const int64_t H = s.head_dim, heads = is_q ? s.num_heads : s.num_kv_heads;
  const int64_t extent = is_q ? s.max_q_len : s.max_kv_len;
  const std::vector<uint16_t>& src = is_q ? in.q : in.k;
  const std::vector<int8_t>& x8 = is_q ? o.q8 : o.k8;
  const std::vector<float>& sc = is_q ? o.q_scale : o.k_scale;
  ASSERT_EQ(static_cast<int64_t>(x8.size()), (is_q ? s.q_elements() : s.kv_elements()));
  ASSERT_EQ(static_cast<int64_t>(sc.size()), (is_q ? s.q_rows() : s.kv_rows()) * heads);
  int checked = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t len = Len(in, is_q, b);
    const int64_t written = s.layout == Layout::kVarlen ? len : extent;
    for (int64_t t = 0; t < written; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = RowBase(in, is_q, b) + t, at = (row * heads + h) * H;
        const float scale = sc[row * heads + h];
        if (t >= len) {
          EXPECT_EQ(scale, 0.f) << "padding row " << t;
          for (int64_t d = 0; d < H; ++d) ASSERT_EQ(x8[at + d], 0) << "padding row " << t;
          continue;
        }
        const float* mean =
            (!is_q && s.fp8.smooth_k) ? o.mean_k.data() + (b * heads + h) * H : nullptr;
        const std::vector<double> x = Transform64(in, &src[at], mean);
        double amax = 0;
        int max8 = 0;
        for (int64_t d = 0; d < H; ++d) {
          amax = std::max(amax, std::fabs(x[d]));
          max8 = std::max(max8, std::abs(static_cast<int>(x8[at + d])));
        }
        ASSERT_TRUE(std::isfinite(scale) && scale > 0.f) << row;
        EXPECT_NEAR(scale, amax / 127.0, 1e-5 * amax / 127.0 + 1e-30) << row;
        EXPECT_EQ(max8, 127) << row;
        // fp32 transform error: ~log2(order) roundings of values up to ~amax·sqrt(order).
        const double slack = 0.5 * scale * (1 + 1e-5) + 1e-5 * amax;
        for (int64_t d = 0; d < H; ++d) {
          ASSERT_LE(std::fabs(x8[at + d] * static_cast<double>(scale) - x[d]), slack)
              << (is_q ? "q" : "k") << " row " << row << " head " << h << " channel " << d;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Int8PrepassReference, DequantisedWithinInt8Rounding) {
  uint64_t seed = 1;
  for (int64_t H : {64, 128, 96}) {
    for (int recipe = 0; recipe < 4; ++recipe) {
      for (int layout = 0; layout < 3; ++layout) {
        Inputs in = Make(H, 70, layout == 1, layout == 2,
                         recipe % 2 ? DType::kBFloat16 : DType::kFloat16, recipe >= 2,
                         recipe == 3, ++seed);
        in.shape.fp8.rotate = (recipe & 1) != 0;
        in.shape.fp8.smooth_k = (recipe & 2) != 0;
        const Int8PrepassHost o = Reference(in);
        SCOPED_TRACE("H " + std::to_string(H) + " recipe " + std::to_string(recipe) +
                     " layout " + std::to_string(layout));
        CheckTensor(in, o, true);
        CheckTensor(in, o, false);
        EXPECT_EQ(o.mean_k.size(),
                  in.shape.fp8.smooth_k ? static_cast<size_t>(2 * 2 * H) : size_t{0});
      }
    }
  }
}

// K's mean is that of the valid (rotated) keys: the smoothed k8 rows of each (entry, head) sum
// to ~0 per channel, within the rows' rounding.
TEST(Int8PrepassReference, SmoothedKeysHaveZeroMean) {
  Inputs in = Make(128, 90, true, false, DType::kBFloat16, false, true, 17);
  const Int8PrepassHost o = Reference(in);
  const AttentionShape& s = in.shape;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t len = in.kv_lengths[b];
    for (int64_t h = 0; h < s.num_kv_heads; ++h) {
      for (int64_t d = 0; d < s.head_dim; ++d) {
        double sum = 0, bound = 0;
        for (int64_t t = 0; t < len; ++t) {
          const int64_t row = b * s.max_kv_len + t;
          const double sc = o.k_scale[row * s.num_kv_heads + h];
          sum += o.k8[(row * s.num_kv_heads + h) * s.head_dim + d] * sc;
          bound += 0.5 * sc;
        }
        EXPECT_LE(std::fabs(sum / len), bound / len + 1e-4) << b << " " << h << " " << d;
      }
    }
  }
}

/// Writes `x(t, e)` into every element of the rows past the lengths (padded layout).
void Poison(Inputs* in) {
  const AttentionShape& s = in->shape;
  auto poison = [&](std::vector<uint16_t>* buf, int64_t extent, const std::vector<int32_t>& len,
                    int64_t row) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = len[b]; t < extent; ++t)
        for (int64_t e = 0; e < row; ++e) {
          const int k = static_cast<int>((t + e) % 4);
          const float x = k == 0 ? NAN : (k == 1 ? INFINITY : (k == 2 ? 1e4f : -1e4f));
          (*buf)[(b * extent + t) * row + e] =
              s.dtype == DType::kBFloat16 ? FloatToBf16(x) : FloatToFp16(x);
        }
  };
  poison(&in->q, s.max_q_len, in->q_lengths, s.num_heads * s.head_dim);
  poison(&in->k, s.max_kv_len, in->kv_lengths, s.num_kv_heads * s.head_dim);
  poison(&in->v, s.max_kv_len, in->kv_lengths, s.num_kv_heads * s.head_dim);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

TEST(Int8PrepassReference, PaddingGarbageChangesNothing) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int recipe : {0, 3}) {
      Inputs clean = Make(64, 100, true, false, dtype, false, false, 31 + recipe);
      clean.shape.fp8.rotate = clean.shape.fp8.smooth_k = recipe == 3;
      Inputs dirty = clean;
      Poison(&dirty);
      dirty.index.q_lengths = dirty.q_lengths.data();
      dirty.index.kv_lengths = dirty.kv_lengths.data();
      ASSERT_NE(clean.k, dirty.k);
      for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
        const Int8PrepassHost a = Reference(clean, pv), b = Reference(dirty, pv);
        EXPECT_EQ(a.q8, b.q8) << recipe;
        EXPECT_EQ(a.k8, b.k8) << recipe;
        EXPECT_TRUE(SameBits(a.q_scale, b.q_scale)) << recipe;
        EXPECT_TRUE(SameBits(a.k_scale, b.k_scale)) << recipe;
        EXPECT_EQ(a.v8, b.v8) << recipe;
        EXPECT_TRUE(SameBits(a.v_scalars, b.v_scalars)) << recipe;
        EXPECT_TRUE(SameBits(a.mean_k, b.mean_k)) << recipe;
        for (float x : a.q_scale) EXPECT_TRUE(std::isfinite(x));
      }
    }
  }
}

TEST(Int8PrepassReference, PerTokenScalesIgnoreOtherTokens) {
  for (bool rotate : {false, true}) {
    Inputs a = Make(128, 64, false, false, DType::kBFloat16, true, false, 77);
    a.shape.fp8.rotate = rotate;
    a.shape.fp8.smooth_k = false;
    Inputs b = a;
    const AttentionShape& s = a.shape;
    const int64_t row = 37, kv_head = 1, row_elems = s.num_kv_heads * s.head_dim;
    for (int64_t d = 0; d < s.head_dim; ++d) {  // key 37 of entry 0, kv head 1: ×100
      uint16_t& e = b.k[row * row_elems + kv_head * s.head_dim + d];
      e = FloatToBf16(Bf16ToFloat(e) * 100.f);
    }
    const Int8PrepassHost oa = Reference(a, Int8PvFormat::k16Bit), ob = Reference(b, Int8PvFormat::k16Bit);
    int changed_rows = 0;
    for (int64_t r = 0; r < s.kv_rows(); ++r) {
      for (int64_t h = 0; h < s.num_kv_heads; ++h) {
        const int64_t u = r * s.num_kv_heads + h;
        const bool same_scale = std::memcmp(&oa.k_scale[u], &ob.k_scale[u], 4) == 0;
        const bool same_k8 = std::equal(oa.k8.begin() + u * s.head_dim,
                                        oa.k8.begin() + (u + 1) * s.head_dim,
                                        ob.k8.begin() + u * s.head_dim);
        if (r == row && h == kv_head) {
          EXPECT_NE(oa.k_scale[u], ob.k_scale[u]);
          changed_rows += !same_scale;
        } else {
          EXPECT_TRUE(same_scale && same_k8) << "row " << r << " head " << h;
        }
      }
    }
    EXPECT_EQ(changed_rows, 1);
    EXPECT_EQ(oa.q8, ob.q8);
    // With smoothing, the change moves K's mean and so every key of that (entry, head).
    a.shape.fp8.smooth_k = b.shape.fp8.smooth_k = true;
    const Int8PrepassHost sa = Reference(a, Int8PvFormat::k16Bit), sb = Reference(b, Int8PvFormat::k16Bit);
    EXPECT_NE(sa.mean_k, sb.mean_k);
    EXPECT_NE(sa.k8, sb.k8);
  }
}

TEST(Int8PrepassReference, NonFiniteAndZeroRows) {
  Inputs in = Make(64, 16, false, false, DType::kBFloat16, false, false, 5);
  in.shape.fp8.rotate = true;
  in.shape.fp8.smooth_k = false;
  const AttentionShape& s = in.shape;
  const int64_t qrow = s.num_heads * s.head_dim;
  in.q[3 * qrow + 1 * s.head_dim + 10] = FloatToBf16(NAN);   // token 3, head 1
  in.q[4 * qrow + 2 * s.head_dim + 0] = FloatToBf16(INFINITY);  // token 4, head 2
  for (int64_t d = 0; d < s.head_dim; ++d) in.q[5 * qrow + d] = 0;  // token 5, head 0
  const Int8PrepassHost o = Reference(in);
  for (int64_t u : {3 * s.num_heads + 1, 4 * s.num_heads + 2}) {
    EXPECT_TRUE(std::isnan(o.q_scale[u])) << u;
    for (int64_t d = 0; d < s.head_dim; ++d) EXPECT_EQ(o.q8[u * s.head_dim + d], 0);
  }
  EXPECT_EQ(o.q_scale[5 * s.num_heads], 1.f);
  for (int64_t d = 0; d < s.head_dim; ++d) EXPECT_EQ(o.q8[5 * s.num_heads * s.head_dim + d], 0);
  int finite = 0;
  for (float x : o.q_scale) finite += std::isfinite(x) ? 1 : 0;
  EXPECT_EQ(finite, static_cast<int>(o.q_scale.size()) - 2);
  // The NaN row's neighbours are quantised as without it.
  Inputs clean = Make(64, 16, false, false, DType::kBFloat16, false, false, 5);
  clean.shape.fp8 = in.shape.fp8;
  const Int8PrepassHost c = Reference(clean);
  EXPECT_EQ(c.q_scale[3 * s.num_heads], o.q_scale[3 * s.num_heads]);
  EXPECT_EQ(c.k8, o.k8);
}

TEST(Int8PrepassReference, ValueFormats) {
  Inputs in = Make(64, 40, true, false, DType::kBFloat16, false, false, 9);
  const Int8PrepassHost e = Reference(in, Int8PvFormat::kE4M3), h = Reference(in, Int8PvFormat::k16Bit);
  EXPECT_TRUE(h.v8.empty());
  EXPECT_TRUE(h.v_scalars.empty());
  ASSERT_EQ(static_cast<int64_t>(e.v8.size()), in.shape.kv_elements());
  ASSERT_EQ(e.v_scalars.size(), 3u);
  // amax over the valid rows only; v8 · descale within E4M3's rounding of v.
  const AttentionShape& s = in.shape;
  const int64_t row_elems = s.num_kv_heads * s.head_dim;
  float amax = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < in.kv_lengths[b]; ++t)
      for (int64_t i = 0; i < row_elems; ++i)
        amax = std::max(amax, std::fabs(Bf16ToFloat(in.v[(b * s.max_kv_len + t) * row_elems + i])));
  EXPECT_EQ(e.v_scalars[2], amax);
  EXPECT_EQ(e.v_scalars[0], Fp8ScaleForAmax(amax));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.max_kv_len; ++t)
      for (int64_t i = 0; i < row_elems; ++i) {
        const int64_t at = (b * s.max_kv_len + t) * row_elems + i;
        const float back = E4M3ToFloat(e.v8[at]) * e.v_scalars[1];
        if (t >= in.kv_lengths[b]) {
          ASSERT_EQ(e.v8[at], 0);
        } else {
          const float x = Bf16ToFloat(in.v[at]);
          ASSERT_LE(std::fabs(back - x), std::fabs(x) / 16 + amax * std::ldexp(1.f, -10));
        }
      }
}

TEST(Int8PrepassReference, DeterministicRefusalsAndNames) {
  Inputs in = Make(64, 33, true, false, DType::kBFloat16, true, false, 3);
  const Int8PrepassHost a = Reference(in), b = Reference(in);
  EXPECT_EQ(a.k8, b.k8);
  EXPECT_TRUE(SameBits(a.k_scale, b.k_scale));
  Int8PrepassHost o;
  in.shape.dtype = DType::kFloat32;
  EXPECT_EQ(Int8PrepassReference(in.shape, in.q.data(), in.k.data(), in.v.data(), in.index,
                                 Int8PvFormat::kE4M3, &o)
                .code(),
            StatusCode::kInvalidArgument);
  in.shape.dtype = DType::kBFloat16;
  in.shape.head_dim = 60;
  EXPECT_EQ(Int8PrepassReference(in.shape, in.q.data(), in.k.data(), in.v.data(), in.index,
                                 Int8PvFormat::kE4M3, &o)
                .code(),
            StatusCode::kInvalidArgument);
  Fp8Options r;
  EXPECT_EQ(Int8RecipeName(r, Int8PvFormat::kE4M3),
            "int8 per-token q/k, hadamard q/k, k-smoothing, e4m3 p·v");
  r.rotate = r.smooth_k = false;
  EXPECT_EQ(Int8RecipeName(r, Int8PvFormat::k16Bit), "int8 per-token q/k, 16-bit p·v");
}

}  // namespace
}  // namespace attn::kernels
