#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "loadgen/dtype_codec.h"

namespace attn::loadgen {
namespace {

TEST(ClientDType, Fp16KnownBitPatterns) {
  EXPECT_EQ(EncodeFp16(0.0f), 0x0000);
  EXPECT_EQ(EncodeFp16(-0.0f), 0x8000);
  EXPECT_EQ(EncodeFp16(1.0f), 0x3c00);
  EXPECT_EQ(EncodeFp16(-2.0f), 0xc000);
  EXPECT_EQ(EncodeFp16(0.5f), 0x3800);
  EXPECT_EQ(EncodeFp16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(EncodeFp16(65520.0f), 0x7c00);  // halfway to 2^16 rounds (to even) to inf
  EXPECT_EQ(EncodeFp16(65519.0f), 0x7bff);
  EXPECT_EQ(EncodeFp16(1e6f), 0x7c00);
  EXPECT_EQ(EncodeFp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(EncodeFp16(std::nanf("")) & 0x7c00, 0x7c00);
  EXPECT_NE(EncodeFp16(std::nanf("")) & 0x03ff, 0);
  EXPECT_EQ(EncodeFp16(6.103515625e-05f), 0x0400);          // smallest normal 2^-14
  EXPECT_EQ(EncodeFp16(5.9604644775390625e-08f), 0x0001);   // smallest subnormal 2^-24
  EXPECT_EQ(EncodeFp16(2.98023223876953125e-08f), 0x0000);  // 2^-25: tie, rounds to even 0
  EXPECT_EQ(EncodeFp16(3.0e-08f), 0x0001);                  // just above the tie
  EXPECT_EQ(EncodeFp16(0.333333333f), 0x3555);
  EXPECT_EQ(EncodeFp16(3.14159265f), 0x4248);
  // Ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(EncodeFp16(1.0f + 0x1.0p-11f), 0x3c00);
  EXPECT_EQ(EncodeFp16(1.0f + 3 * 0x1.0p-11f), 0x3c02);
  EXPECT_EQ(EncodeFp16(1.0f + 0x1.0p-11f + 0x1.0p-20f), 0x3c01);
}

TEST(ClientDType, Fp16DecodeRoundTrip) {
  EXPECT_EQ(DecodeFp16(0x3c00), 1.0f);
  EXPECT_EQ(DecodeFp16(0x7bff), 65504.0f);
  EXPECT_EQ(DecodeFp16(0x0001), 5.9604644775390625e-08f);
  EXPECT_EQ(DecodeFp16(0xc000), -2.0f);
  EXPECT_TRUE(std::isinf(DecodeFp16(0x7c00)));
  EXPECT_TRUE(std::isnan(DecodeFp16(0x7e00)));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
    ASSERT_EQ(EncodeFp16(DecodeFp16(h)), h) << std::hex << bits;
  }
}

TEST(ClientDType, Bf16KnownBitPatterns) {
  EXPECT_EQ(EncodeBf16(0.0f), 0x0000);
  EXPECT_EQ(EncodeBf16(1.0f), 0x3f80);
  EXPECT_EQ(EncodeBf16(-2.0f), 0xc000);
  EXPECT_EQ(EncodeBf16(3.14159265f), 0x4049);
  EXPECT_EQ(EncodeBf16(0.333333333f), 0x3eab);
  // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(EncodeBf16(1.0f + 0x1.0p-8f), 0x3f80);
  EXPECT_EQ(EncodeBf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_EQ(EncodeBf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81);
  EXPECT_EQ(EncodeBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(EncodeBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  const uint16_t nan = EncodeBf16(std::nanf(""));
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x7f, 0);
  EXPECT_EQ(DecodeBf16(0x3f80), 1.0f);
  EXPECT_EQ(DecodeBf16(0x4049), 3.140625f);
}

TEST(ClientDType, EncodeDecodeValuesLittleEndian) {
  const float values[] = {1.0f, -2.0f};
  std::string bytes;
  EncodeValues(values, 2, attention::v1::FLOAT16, &bytes);
  ASSERT_EQ(bytes.size(), 4u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x00);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1]), 0x3c);
  EXPECT_EQ(static_cast<unsigned char>(bytes[3]), 0xc0);
  std::vector<double> decoded;
  ASSERT_TRUE(DecodeValues(bytes, attention::v1::FLOAT16, &decoded));
  EXPECT_EQ(decoded, (std::vector<double>{1.0, -2.0}));

  bytes.clear();
  EncodeValues(values, 2, attention::v1::FLOAT32, &bytes);
  ASSERT_TRUE(DecodeValues(bytes, attention::v1::FLOAT32, &decoded));
  EXPECT_EQ(decoded, (std::vector<double>{1.0, -2.0}));
  EXPECT_FALSE(DecodeValues("abc", attention::v1::FLOAT32, &decoded));
}

}  // namespace
}  // namespace attn::loadgen
