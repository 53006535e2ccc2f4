// Per-tensor FP8 (E4M3) quantisation on the GPU, and host-side E4M3 conversions.
//
// Format: OCP 8-bit Floating Point Specification (OFP8) rev. 1.0, E4M3: 1 sign, 4 exponent
// (bias 7), 3 mantissa bits; no infinities, NaN = S.1111.111; largest finite value
// 0x7E = 1.75 · 2^8 = 448; smallest normal 2^-6, smallest subnormal 2^-9. NVIDIA's
// __nv_fp8_e4m3 / cvt.*.e4m3x2 is this format.
//
// Per-tensor scaling (the "delayed/current scaling" recipe of NVIDIA Transformer Engine and
// cuDNN's FP8 SDPA, with the current tensor's amax):
//   amax    = max_i |src_i|
//   scale   = min(448 / amax, 2^126) (amax finite and > 0; the cap keeps scale finite and
//                                    descale a normal float for subnormal amax)
//           = 1                     (amax == 0: an all-zero tensor; or amax not finite: the
//                                    tensor holds inf or NaN, see below)
//   dst_i   = e4m3_rn_satfinite(src_i · scale)     round to nearest even, |x| > 448 -> ±448
//   descale = 1 / scale             so that src_i ≈ dst_i · descale
// The largest magnitude lands on 448 (up to fp32 rounding of the product; satfinite clamps),
// the top of E4M3's range, so the 3-bit mantissa (relative rounding error <= 2^-4) holds for
// every |src_i| >= amax · 2^-6 / 448 ≈ amax · 3.5e-5 (E4M3's smallest normal); below that the
// values are subnormal with absolute spacing amax · 2^-9 / 448, and |src_i · scale| <= 2^-10
// rounds to 0.
// Non-finite input: inf saturates to ±448 with scale 1 (satfinite), NaN stays NaN (0x7F); the
// caller should treat such a tensor as invalid — the amax written to d_amax_ws says so.
//
// Thread-safety: the functions only enqueue work on `stream`; concurrent calls with distinct
// output/workspace buffers are safe. Built only when ATTN_CUDA is on; the host conversions at the
// end are plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// E4M3's largest finite magnitude (OCP OFP8 spec, Table 1): 0 1111 110 = 1.75 · 2^8.
inline constexpr float kE4M3Max = 448.f;
/// Upper bound of a per-tensor scale (2^126): only reached when amax < 448 · 2^-126.
inline constexpr float kFp8MaxScale = 8.507059173023462e37f;

/// Quantises `n` elements of `src` (device memory, dtype `src_dtype`: kFloat16 or kBFloat16)
/// to E4M3 with one scale for the whole tensor (formula above), entirely on `stream`: no host
/// synchronisation, no allocation, graph-capturable. Three stream operations: a 4-byte memset
/// of *d_amax_ws, an amax reduction (atomicMax into *d_amax_ws), and the conversion (which
/// reads the amax, and whose first block writes *d_scale and *d_descale).
///   src        device, n elements of src_dtype, any alignment of 2 bytes (16-byte aligned
///              pointers take the vectorised path)
///   dst_e4m3   device, n bytes (may not alias src)
///   d_scale    device float: 448 / amax (or 1), the factor applied before rounding
///   d_descale  device float: 1 / scale, what an FP8 consumer multiplies by (cuDNN's
///              "descale", Fp8AttentionRun's q/k/v descales)
///   d_amax_ws  device float, caller-provided workspace; holds amax = max |src_i| afterwards
///              (NaN when the tensor holds a NaN)
/// n == 0 writes scale = descale = 1, amax = 0.
/// Errors: INVALID_ARGUMENT for a null pointer (with n > 0), n < 0, or a src_dtype other than
/// kFloat16/kBFloat16; INTERNAL naming the cudaError_t of a failed launch or memset.
Status Fp8QuantizePerTensor(const void* src, DType src_dtype, int64_t n, void* dst_e4m3,
                            float* d_scale, float* d_descale, float* d_amax_ws,
                            cudaStream_t stream);

/// Converts `n` E4M3 bytes back to `dst_dtype` (kFloat32, kFloat16 or kBFloat16) on `stream`:
/// dst_i = float(src_i) · (*d_descale) (d_descale a device float; null means 1). NaN bytes stay
/// NaN. For tests, FP8 tensors handed to non-FP8 backends and the cuDNN FP8 path's output.
/// Eight elements per thread and step when src is 8-byte and dst 16-byte aligned.
/// Errors: INVALID_ARGUMENT for null pointers (n > 0), n < 0 or an unsupported dtype; INTERNAL
/// for a failed launch.
Status Fp8Dequantize(const void* src_e4m3, int64_t n, const float* d_descale, DType dst_dtype,
                     void* dst, cudaStream_t stream);

// ---- Host-side E4M3 conversions (exact; tests and host reference code) --------------------

/// E4M3 byte -> float, exact (NaN for 0x7F/0xFF).
inline float E4M3ToFloat(uint8_t b) {
  const int sign = b >> 7;
  const int exp = (b >> 3) & 0xF;
  const int mant = b & 0x7;
  float v;
  if (exp == 0xF && mant == 0x7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant · 2^-9
  } else {
    v = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // 1.mmm · 2^(exp-7)
  }
  return sign ? -v : v;
}

/// float -> E4M3 byte, round to nearest even, saturating to ±448 (like cvt.rn.satfinite);
/// NaN -> 0x7F. Exact reference for the device conversion.
inline uint8_t FloatToE4M3Sat(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7E;
  // Spacing of representable values around a: 2^(e-3) for a in [2^e, 2^(e+1)), e >= -6;
  // 2^-9 in the subnormal range.
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : -7;
  if (a > 0 && std::ldexp(1.0, e) > a) --e;  // guard log2 rounding
  if (a > 0 && std::ldexp(1.0, e + 1) <= a) ++e;
  const int q_exp = e < -6 ? -9 : e - 3;
  const double units = a / std::ldexp(1.0, q_exp);  // exact (power-of-two division)
  double r = std::floor(units);
  const double frac = units - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  const double q = r * std::ldexp(1.0, q_exp);
  if (q >= 448.0) return sign | 0x7E;  // only reachable from a < 448: never above max
  // Encode q (exactly representable now).
  if (q == 0.0) return sign;
  int qe = static_cast<int>(std::floor(std::log2(q)));
  if (std::ldexp(1.0, qe) > q) --qe;
  if (std::ldexp(1.0, qe + 1) <= q) ++qe;
  if (qe < -6) {  // subnormal
    return sign | static_cast<uint8_t>(q / std::ldexp(1.0, -9));
  }
  const int mant = static_cast<int>(q / std::ldexp(1.0, qe - 3)) - 8;
  return sign | static_cast<uint8_t>(((qe + 7) << 3) | mant);
}

/// The per-tensor scale of the formula above for a given amax (host mirror of the device code).
inline float Fp8ScaleForAmax(float amax) {
  if (!(std::isfinite(amax) && amax > 0.f)) return 1.f;
  const float s = kE4M3Max / amax;
  return s < kFp8MaxScale ? s : kFp8MaxScale;
}

}  // namespace attn::kernels
