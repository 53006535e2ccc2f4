// The FP8 accuracy pre-pass's host reference (attn/kernels/fp8_prepass.h,
// kernels/fp8/fp8_prepass_reference.cc), the definition the GPU pre-pass is compared with bit
// for bit (tests/gpu/fp8_prepass_test.cc). Checked here on the CPU:
//  - statistics over valid positions only: values past the lengths (±1e4, NaN) change nothing
//    and padding rows come out as E4M3 zeros;
//  - K smoothing: the means are those of the valid keys (float64 check), and the quantised K
//    is K − mean (dequantised within E4M3's rounding);
//  - the rotation is orthonormal: dequantised q8·k8 of a rotated pair reproduces q·k, and on
//    outlier channels it does so far better than without the rotation (the reason it exists);
//  - the Hadamard order for each head dim, the recipe names, refusals, determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "attn/kernels/host_dtype.h"

namespace attn::kernels {
namespace {

struct Inputs {
  AttentionShape shape;
  std::vector<uint16_t> q, k, v;
  std::vector<int32_t> q_lengths, kv_lengths;
  AttentionTensors index;
};

/// Padded bf16 inputs B=2, T=S=`len`, N=4, K=2; lengths (len, len/2) for both q and kv when
/// `lengths`. `outliers`: q and k channels 1, H/2, H-1 ×20; `k_bias`: +20 on those channels of
/// k.
Inputs Make(int64_t H, int64_t len, bool lengths, bool outliers, bool k_bias, uint64_t seed) {
  Inputs in;
  AttentionShape& s = in.shape;
  s.dtype = DType::kBFloat16;
  s.batch = 2;
  s.max_q_len = s.max_kv_len = len;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = H;
  s.scale = 1.f / std::sqrt(static_cast<float>(H));
  s.has_lengths = lengths;
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
      (*t)[i] = FloatToBf16(x);
    }
  };
  fill(&in.q, s.q_elements(), outliers, false);
  fill(&in.k, s.kv_elements(), outliers, k_bias);
  fill(&in.v, s.kv_elements(), false, false);
  if (lengths) {
    in.q_lengths = {static_cast<int32_t>(len), static_cast<int32_t>(len / 2)};
    in.kv_lengths = in.q_lengths;
    in.index.q_lengths = in.q_lengths.data();
    in.index.kv_lengths = in.kv_lengths.data();
  }
  return in;
}

struct Out {
  std::vector<uint8_t> q8, k8, v8;
  std::vector<float> scalars, mean;
};

Out Prepass(const Inputs& in) {
  Out o;
  const Status s = Fp8PrepassReference(in.shape, in.q.data(), in.k.data(), in.v.data(), in.index,
                                       &o.q8, &o.k8, &o.v8, &o.scalars, &o.mean);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return o;
}

TEST(Fp8Prepass, HadamardOrderAndRecipeNames) {
  EXPECT_EQ(Fp8HadamardOrder(64), 64);
  EXPECT_EQ(Fp8HadamardOrder(128), 128);
  EXPECT_EQ(Fp8HadamardOrder(256), 256);
  EXPECT_EQ(Fp8HadamardOrder(80), 16);
  EXPECT_EQ(Fp8HadamardOrder(96), 32);
  EXPECT_EQ(Fp8HadamardOrder(192), 64);
  EXPECT_EQ(Fp8HadamardOrder(24), 8);
  EXPECT_EQ(Fp8HadamardOrder(12), 0);
  EXPECT_EQ(Fp8HadamardOrder(0), 0);
  Fp8Options o;
  EXPECT_EQ(Fp8RecipeName(o), "e4m3 per-tensor, hadamard q/k, k-smoothing");
  o.rotate = false;
  EXPECT_EQ(Fp8RecipeName(o), "e4m3 per-tensor, k-smoothing");
  o.smooth_k = false;
  EXPECT_EQ(Fp8RecipeName(o), "e4m3 per-tensor");
}

TEST(Fp8Prepass, WorkspaceOnlyForSmoothing) {
  Inputs in = Make(64, 100, false, false, false, 1);
  EXPECT_GT(Fp8PrepassWorkspaceBytes(in.shape), 0);
  in.shape.fp8.smooth_k = false;
  EXPECT_EQ(Fp8PrepassWorkspaceBytes(in.shape), 0);
}

TEST(Fp8Prepass, PaddingChangesNothingAndIsWrittenAsZeros) {
  for (const bool rotate : {true, false}) {
    for (const bool smooth : {true, false}) {
      Inputs in = Make(128, 130, /*lengths=*/true, false, false, 7);
      in.shape.fp8.rotate = rotate;
      in.shape.fp8.smooth_k = smooth;
      const Out clean = Prepass(in);
      // Garbage past the lengths of entry 1 (q and kv length 65 of 130).
      const AttentionShape& s = in.shape;
      const int64_t qrow = s.num_heads * s.head_dim, kvrow = s.num_kv_heads * s.head_dim;
      for (int64_t t = 65; t < 130; ++t) {
        for (int64_t e = 0; e < qrow; ++e) {
          in.q[(130 + t) * qrow + e] = FloatToBf16(t % 3 == 0 ? NAN : (e % 2 ? 1e4f : -1e4f));
        }
        for (int64_t e = 0; e < kvrow; ++e) {
          in.k[(130 + t) * kvrow + e] = FloatToBf16(e % 2 ? 1e4f : -INFINITY);
          in.v[(130 + t) * kvrow + e] = FloatToBf16(t % 2 ? NAN : 1e4f);
        }
      }
      const Out dirty = Prepass(in);
      EXPECT_EQ(clean.q8, dirty.q8);
      EXPECT_EQ(clean.k8, dirty.k8);
      EXPECT_EQ(clean.v8, dirty.v8);
      EXPECT_EQ(clean.scalars, dirty.scalars);
      EXPECT_EQ(clean.mean, dirty.mean);
      for (int64_t t = 65; t < 130; ++t) {
        for (int64_t e = 0; e < qrow; ++e) ASSERT_EQ(dirty.q8[(130 + t) * qrow + e], 0);
        for (int64_t e = 0; e < kvrow; ++e) ASSERT_EQ(dirty.k8[(130 + t) * kvrow + e], 0);
      }
    }
  }
}

TEST(Fp8Prepass, MeansAreThoseOfTheValidKeys) {
  Inputs in = Make(64, 100, /*lengths=*/true, false, /*k_bias=*/true, 3);
  in.shape.fp8.rotate = false;
  const Out o = Prepass(in);
  const AttentionShape& s = in.shape;
  const int64_t H = s.head_dim, K = s.num_kv_heads;
  ASSERT_EQ(o.mean.size(), static_cast<size_t>(s.batch * K * H));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < K; ++h) {
      for (int64_t d = 0; d < H; ++d) {
        double sum = 0;
        for (int64_t t = 0; t < in.kv_lengths[b]; ++t) {
          sum += Bf16ToFloat(in.k[((b * s.max_kv_len + t) * K + h) * H + d]);
        }
        const double want = sum / in.kv_lengths[b];
        EXPECT_NEAR(o.mean[(b * K + h) * H + d], want, 1e-5 * (1 + std::fabs(want)));
      }
    }
  }
  // The bias channels' mean is ~20; what is quantised is k - mean (|.| ~ N(0, 1)).
  EXPECT_NEAR(o.mean[1], 20.0, 1.0);
  const float dk = o.scalars[kFp8DescaleK];
  const int64_t i = 5 * K * H + 1;  // entry 0, token 5, kv head 0, channel 1
  EXPECT_NEAR(E4M3ToFloat(o.k8[i]) * dk, Bf16ToFloat(in.k[i]) - o.mean[1],
              0.07 * std::fabs(Bf16ToFloat(in.k[i]) - o.mean[1]) + 4 * dk);
}

/// rms over (query, key) pairs of the dequantised q8·k8 minus the exact q·k (same heads),
/// relative to the rms of q·k.
double DotError(const Inputs& in, const Out& o) {
  const AttentionShape& s = in.shape;
  const int64_t H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  const float dq = o.scalars[kFp8DescaleQ], dk = o.scalars[kFp8DescaleK];
  double err = 0, ref = 0;
  for (int64_t t = 0; t < 16; ++t) {
    for (int64_t j = 0; j < 16; ++j) {
      for (int64_t n = 0; n < N; ++n) {
        const int64_t qa = (t * N + n) * H, ka = (j * K + n / (N / K)) * H;
        double exact = 0, got = 0;
        for (int64_t d = 0; d < H; ++d) {
          exact += double(Bf16ToFloat(in.q[qa + d])) * Bf16ToFloat(in.k[ka + d]);
          got += double(E4M3ToFloat(o.q8[qa + d])) * dq * E4M3ToFloat(o.k8[ka + d]) * dk;
        }
        err += (got - exact) * (got - exact);
        ref += exact * exact;
      }
    }
  }
  return std::sqrt(err / ref);
}

TEST(Fp8Prepass, RotationKeepsDotProductsAndHelpsOutliers) {
  Inputs in = Make(128, 64, false, /*outliers=*/true, false, 11);
  in.shape.fp8.smooth_k = false;  // smoothing changes q·k by a per-row constant
  in.shape.fp8.rotate = false;
  const double plain = DotError(in, Prepass(in));
  in.shape.fp8.rotate = true;
  const double rotated = DotError(in, Prepass(in));
  // E4M3's 3-bit mantissa gives ~3-5 % on each product; on outliers the per-tensor scale set by
  // the ×20 channels flushes the normal channels without the rotation.
  EXPECT_LT(rotated, 0.08);
  EXPECT_LT(rotated * 2, plain) << "rotated " << rotated << " plain " << plain;
  Inputs normal = Make(64, 64, false, false, false, 12);
  normal.shape.fp8.smooth_k = false;
  EXPECT_LT(DotError(normal, Prepass(normal)), 0.08);
}

TEST(Fp8Prepass, DeterministicAndRefusals) {
  Inputs in = Make(80, 70, true, false, false, 5);
  const Out a = Prepass(in), b = Prepass(in);
  EXPECT_EQ(a.q8, b.q8);
  EXPECT_EQ(a.k8, b.k8);
  EXPECT_EQ(a.scalars, b.scalars);
  Out o;
  in.shape.dtype = DType::kFloat32;
  EXPECT_FALSE(Fp8PrepassReference(in.shape, in.q.data(), in.k.data(), in.v.data(), in.index, &o.q8,
                                   &o.k8, &o.v8, &o.scalars, &o.mean)
                   .ok());
  in.shape.dtype = DType::kBFloat16;
  in.shape.head_dim = 12;
  EXPECT_FALSE(Fp8PrepassReference(in.shape, in.q.data(), in.k.data(), in.v.data(), in.index, &o.q8,
                                   &o.k8, &o.v8, &o.scalars, &o.mean)
                   .ok());
}

}  // namespace
}  // namespace attn::kernels
