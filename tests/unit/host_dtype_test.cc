// Tests of the host fp16/bf16 conversions (host_dtype.h): exhaustive round trips, round to
// nearest even (normal and subnormal), overflow to inf, NaN preservation, and the
// LoadAsFloat/StoreFromFloat dispatch.

#include "attn/kernels/host_dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace attn::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

bool IsFp16Nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool IsBf16Nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

TEST(HostDtypeFp16, EveryBitPatternRoundTrips) {
  int nans = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = Fp16ToFloat(h);
    if (IsFp16Nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      ASSERT_TRUE(IsFp16Nan(FloatToFp16(f))) << std::hex << bits;
      ++nans;
    } else {
      ASSERT_EQ(FloatToFp16(f), h) << std::hex << bits << " -> " << f;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(HostDtypeBf16, EveryBitPatternRoundTrips) {
  int nans = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = Bf16ToFloat(h);
    if (IsBf16Nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      ASSERT_TRUE(IsBf16Nan(FloatToBf16(f))) << std::hex << bits;
      ++nans;
    } else {
      ASSERT_EQ(FloatToBf16(f), h) << std::hex << bits << " -> " << f;
    }
  }
  EXPECT_EQ(nans, 2 * 127);
}

TEST(HostDtypeFp16, KnownValues) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(0.0f), 0x0000);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);   // largest finite
  EXPECT_EQ(FloatToFp16(65519.99f), 0x7bff);  // below the overflow midpoint
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);   // midpoint rounds to even: inf
  EXPECT_EQ(FloatToFp16(1e9f), 0x7c00);
  EXPECT_EQ(FloatToFp16(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToFp16(kInf), 0x7c00);
  EXPECT_EQ(FloatToFp16(-kInf), 0xfc00);
  EXPECT_TRUE(IsFp16Nan(FloatToFp16(std::nanf(""))));
  EXPECT_EQ(Fp16ToFloat(0x7c00), kInf);
  EXPECT_EQ(Fp16ToFloat(0xfc00), -kInf);
  EXPECT_EQ(Fp16ToFloat(0x3555), 0.333251953125f);
}

TEST(HostDtypeFp16, RoundsToNearestEvenInNormalRange) {
  const float ulp = std::ldexp(1.0f, -10);            // fp16 ulp at 1
  EXPECT_EQ(FloatToFp16(1.0f + 0.5f * ulp), 0x3c00);  // tie -> even (1.0)
  EXPECT_EQ(FloatToFp16(1.0f + 1.5f * ulp), 0x3c02);  // tie -> even (1 + 2 ulp)
  EXPECT_EQ(FloatToFp16(1.0f + 0.5f * ulp + std::ldexp(1.0f, -20)), 0x3c01);  // above tie
  EXPECT_EQ(FloatToFp16(1.0f + 0.5f * ulp - std::ldexp(1.0f, -20)), 0x3c00);  // below tie
  EXPECT_EQ(FloatToFp16(-(1.0f + 1.5f * ulp)), 0xbc02);
}

TEST(HostDtypeFp16, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  EXPECT_EQ(Fp16ToFloat(0x0001), tiny);
  EXPECT_EQ(Fp16ToFloat(0x03ff), 1023.0f * tiny);  // largest subnormal
  EXPECT_EQ(Fp16ToFloat(0x8001), -tiny);
  EXPECT_EQ(FloatToFp16(tiny), 0x0001);
  EXPECT_EQ(FloatToFp16(0.5f * tiny), 0x0000);  // tie -> even (0)
  EXPECT_EQ(FloatToFp16(0.51f * tiny), 0x0001);
  EXPECT_EQ(FloatToFp16(1.5f * tiny), 0x0002);  // tie -> even (2)
  EXPECT_EQ(FloatToFp16(2.5f * tiny), 0x0002);  // tie -> even (2)
  EXPECT_EQ(FloatToFp16(-2.5f * tiny), 0x8002);
  EXPECT_EQ(FloatToFp16(1023.5f * tiny), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(FloatToFp16(1e-10f), 0x0000);
  EXPECT_EQ(FloatToFp16(-1e-10f), 0x8000);
}

// Property: FloatToFp16 returns the nearest fp16 (ties to even) for random floats over the
// whole fp16 range, subnormals included.
TEST(HostDtypeFp16, NearestForRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp_dist(-26.f, 16.f);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  for (int n = 0; n < 200000; ++n) {
    float x = std::ldexp(mant(rng), static_cast<int>(std::floor(exp_dist(rng))));
    if (n & 1) x = -x;
    if (std::fabs(x) >= 65504.f) continue;
    const uint16_t h = FloatToFp16(x);
    const double err = std::fabs(static_cast<double>(x) - Fp16ToFloat(h));
    for (int delta : {-1, 1}) {
      const uint16_t nb = static_cast<uint16_t>(h + delta);
      if ((nb & 0x7fffu) >= 0x7c00u || ((nb ^ h) & 0x8000u)) continue;  // left the sign/range
      const double nerr = std::fabs(static_cast<double>(x) - Fp16ToFloat(nb));
      ASSERT_LE(err, nerr) << x;
      if (err == nerr) ASSERT_EQ(h & 1u, 0u) << "tie not to even at " << x;
    }
  }
}

TEST(HostDtypeBf16, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-1.0f), 0xbf80);
  const float ulp = std::ldexp(1.0f, -7);             // bf16 ulp at 1
  EXPECT_EQ(FloatToBf16(1.0f + 0.5f * ulp), 0x3f80);  // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 1.5f * ulp), 0x3f82);  // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 0.5f * ulp + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(Bf16ToFloat(0x7f7f), 3.3895313892515355e38f);             // largest finite
  EXPECT_EQ(FloatToBf16(kInf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-kInf), 0xff80);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
}

TEST(HostDtypeBf16, NanNeverBecomesInf) {
  // A NaN whose payload lives only in the low 16 bits would truncate to inf; it must stay NaN.
  EXPECT_TRUE(IsBf16Nan(FloatToBf16(BitsFloat(0x7f800001u))));
  EXPECT_TRUE(IsBf16Nan(FloatToBf16(BitsFloat(0xff800001u))));
  EXPECT_TRUE(IsBf16Nan(FloatToBf16(BitsFloat(0x7fffffffu))));  // must not carry into sign
  EXPECT_TRUE(IsBf16Nan(FloatToBf16(std::nanf(""))));
}

TEST(HostDtypeBf16, Subnormals) {
  const float tiny = std::ldexp(1.0f, -133);  // smallest bf16 subnormal
  EXPECT_EQ(Bf16ToFloat(0x0001), tiny);
  EXPECT_EQ(FloatToBf16(tiny), 0x0001);
  EXPECT_EQ(FloatToBf16(0.5f * tiny), 0x0000);  // tie -> even
  EXPECT_EQ(FloatToBf16(1.5f * tiny), 0x0002);  // tie -> even
  EXPECT_EQ(FloatToBf16(std::ldexp(1.0f, -149)), 0x0000);
  EXPECT_EQ(FloatToBf16(std::ldexp(1.0f, -126)), 0x0080);  // smallest normal
}

TEST(HostDtype, LoadStoreDispatch) {
  float f32[2] = {0, 0};
  uint16_t f16[2] = {0, 0};
  uint16_t b16[2] = {0, 0};
  StoreFromFloat(f32, DType::kFloat32, 1, 0.1f);
  StoreFromFloat(f16, DType::kFloat16, 1, 0.1f);
  StoreFromFloat(b16, DType::kBFloat16, 1, 0.1f);
  EXPECT_EQ(f32[1], 0.1f);
  EXPECT_EQ(f16[1], FloatToFp16(0.1f));
  EXPECT_EQ(b16[1], FloatToBf16(0.1f));
  EXPECT_EQ(f16[0], 0);
  EXPECT_EQ(LoadAsFloat(f32, DType::kFloat32, 1), 0.1f);
  EXPECT_EQ(LoadAsFloat(f16, DType::kFloat16, 1), Fp16ToFloat(FloatToFp16(0.1f)));
  EXPECT_EQ(LoadAsFloat(b16, DType::kBFloat16, 1), Bf16ToFloat(FloatToBf16(0.1f)));
  EXPECT_NE(LoadAsFloat(f16, DType::kFloat16, 1), 0.1f);  // 0.1 is not exact in fp16
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kFloat8E4M3), 1);
}

}  // namespace
}  // namespace attn::kernels
