// Host-side conversions between float and the 16-bit formats (IEEE binary16, bfloat16).
// Round-to-nearest-even on narrowing; NaN stays NaN; overflow goes to ±inf.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

#include "attn/kernels/attention_problem.h"

namespace attn::kernels {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// bfloat16 bits -> float (exact).
inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

/// float -> bfloat16 bits, round to nearest even.
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// IEEE binary16 bits -> float (exact, subnormals included).
inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// float -> IEEE binary16 bits, round to nearest even.
inline uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                 // below 2^-14: subnormal or zero
    // Scale to units of 2^-24 and round to nearest even.
    const float a = BitsFloat(abs) * 16777216.0f;          // exact (power of two)
    uint32_t q = static_cast<uint32_t>(a);
    const float rem = a - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = abs - 0x38000000u;                          // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

/// Reads element `i` of a buffer of `dtype` as float (kFloat8E4M3 unsupported here: returns 0).
inline float LoadAsFloat(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(data)[i];
    case DType::kFloat16: return Fp16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16: return Bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    default: return 0.f;
  }
}

/// Writes `value` rounded to `dtype` at element `i`.
inline void StoreFromFloat(void* data, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(data)[i] = value; break;
    case DType::kFloat16: static_cast<uint16_t*>(data)[i] = FloatToFp16(value); break;
    case DType::kBFloat16: static_cast<uint16_t*>(data)[i] = FloatToBf16(value); break;
    default: break;
  }
}

}  // namespace attn::kernels
