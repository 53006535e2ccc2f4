#include "loadgen/dtype_codec.h"

#include <cstring>

namespace attn::loadgen {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Shifts `mantissa` (< 2^31) right by `shift` bits, rounding to nearest, ties to even, without
// data-dependent branches: adding half-minus-one plus the kept LSB carries exactly when the
// discarded bits exceed one half, or equal it with an odd kept part.
uint32_t ShiftRoundEven(uint32_t mantissa, int shift) {
  if (shift <= 0) return mantissa;
  if (shift > 31) return 0;
  const uint32_t bias = (1u << (shift - 1)) - 1u + ((mantissa >> shift) & 1u);
  return (mantissa + bias) >> shift;
}

}  // namespace

uint16_t EncodeFp16(float value) {
  const uint32_t u = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const int exp = static_cast<int>((u >> 23) & 0xffu);
  const uint32_t frac = u & 0x7fffffu;
  if (exp == 0xff)
    return frac ? static_cast<uint16_t>(sign | 0x7e00u | (frac >> 13))
                : static_cast<uint16_t>(sign | 0x7c00u);
  const int e = exp - 127;  // unbiased exponent (float subnormals are far below fp16's range)
  if (exp == 0 || e < -26) return sign;    // rounds to ±0 (2^-26 < half the smallest subnormal)
  const uint32_t mant = frac | 0x800000u;  // 24-bit significand, value = mant * 2^(e-23)
  if (e < -14) {
    // Subnormal: value / 2^-24 = mant * 2^(e-23+24); shift right by (-e - 1).
    const uint32_t q = ShiftRoundEven(mant, -e - 1);  // may round up to 0x400: the min normal
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: keep 11 significant bits; carry out of the mantissa bumps the exponent naturally.
  const uint32_t q = ShiftRoundEven(mant, 13);  // in [0x400, 0x800]
  const uint32_t biased = static_cast<uint32_t>(e + 15);
  const uint32_t result = (biased << 10) + (q - 0x400u);
  if (result >= 0x7c00u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  return static_cast<uint16_t>(sign | result);
}

float DecodeFp16(uint16_t bits) {
  const bool negative = bits & 0x8000u;
  const int exp = (bits >> 10) & 0x1f;
  const uint32_t frac = bits & 0x3ffu;
  float magnitude;
  if (exp == 0) {
    magnitude = static_cast<float>(frac) * 5.9604644775390625e-08f;  // frac * 2^-24, exact
  } else if (exp == 31) {
    magnitude = FromBits(0x7f800000u | (frac << 13));
  } else {
    magnitude = FromBits(static_cast<uint32_t>(exp - 15 + 127) << 23 | (frac << 13));
  }
  return negative ? -magnitude : magnitude;
}

uint16_t EncodeBf16(float value) {
  const uint32_t u = Bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Same add-bias rounding as ShiftRoundEven; a carry runs into the exponent (up to inf).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float DecodeBf16(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

int DTypeSize(attention::v1::DType dtype) {
  switch (dtype) {
    case attention::v1::FLOAT32:
      return 4;
    case attention::v1::FLOAT16:
      return 2;
    case attention::v1::BFLOAT16:
      return 2;
    case attention::v1::FLOAT8_E4M3:
      return 1;
    default:
      return 0;
  }
}

bool ParseDType(const std::string& name, attention::v1::DType* dtype) {
  if (name == "fp32" || name == "float32") {
    *dtype = attention::v1::FLOAT32;
  } else if (name == "fp16" || name == "float16") {
    *dtype = attention::v1::FLOAT16;
  } else if (name == "bf16" || name == "bfloat16") {
    *dtype = attention::v1::BFLOAT16;
  } else {
    return false;
  }
  return true;
}

std::string DTypeName(attention::v1::DType dtype) {
  switch (dtype) {
    case attention::v1::FLOAT32:
      return "fp32";
    case attention::v1::FLOAT16:
      return "fp16";
    case attention::v1::BFLOAT16:
      return "bf16";
    case attention::v1::FLOAT8_E4M3:
      return "fp8_e4m3";
    default:
      return "unspecified";
  }
}

void EncodeValues(const float* values, int64_t count, attention::v1::DType dtype,
                  std::string* out) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian");
  const size_t start = out->size();
  const size_t size = static_cast<size_t>(DTypeSize(dtype));
  out->resize(start + static_cast<size_t>(count) * size);
  char* dst = out->data() + start;
  if (dtype == attention::v1::FLOAT32) {
    std::memcpy(dst, values, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const bool fp16 = dtype == attention::v1::FLOAT16;
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t bits = fp16 ? EncodeFp16(values[i]) : EncodeBf16(values[i]);
    std::memcpy(dst + i * 2, &bits, 2);
  }
}

bool DecodeValues(const std::string& bytes, attention::v1::DType dtype, std::vector<double>* out) {
  if (dtype != attention::v1::FLOAT32 && dtype != attention::v1::FLOAT16 &&
      dtype != attention::v1::BFLOAT16) {
    return false;
  }
  const int size = DTypeSize(dtype);
  if (bytes.size() % size != 0) return false;
  const size_t count = bytes.size() / size;
  out->resize(count);
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < size; ++b) bits |= static_cast<uint32_t>(src[i * size + b]) << (8 * b);
    float f;
    if (dtype == attention::v1::FLOAT32) {
      f = FromBits(bits);
    } else if (dtype == attention::v1::FLOAT16) {
      f = DecodeFp16(static_cast<uint16_t>(bits));
    } else {
      f = DecodeBf16(static_cast<uint16_t>(bits));
    }
    (*out)[i] = f;
  }
  return true;
}

}  // namespace attn::loadgen
