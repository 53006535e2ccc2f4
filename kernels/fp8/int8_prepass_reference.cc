// Int8PrepassReference: the per-token INT8 pre-pass on the host, bit for bit what
// int8_prepass.cu computes (attn/kernels/int8_prepass.h): the same row transform as
// LoadTransformed (fp8_prepass_device.cuh; rotation stages in the same order, then the mean),
// the same fp32 operations, none contracted into FMAs (volatile results), the same rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/int8_prepass.h"
#include "fp8_kmean.h"
#include "fp8_prepass_geometry.h"

namespace attn::kernels {
namespace {

using fp8::PrepassTensor;

float Add(float a, float b) {
  volatile float r = a + b;
  return r;
}
float Sub(float a, float b) {
  volatile float r = a - b;
  return r;
}
float Mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
float Div(float a, float b) {
  volatile float r = a / b;
  return r;
}

/// One row: decode, rotate (order > 0: the fast Walsh-Hadamard transform per aligned block of
/// `order`, stages of stride 1, 2, 4, ... as the device's, then · norm), minus `mean` (if any).
/// Each butterfly stage touches distinct pairs, so the device's per-lane order within a stage
/// and this loop give identical values.
void Transformed(const uint16_t* src, bool bf16, int64_t H, const float* mean, int order,
                 float norm, float* x) {
  for (int64_t i = 0; i < H; ++i) x[i] = bf16 ? Bf16ToFloat(src[i]) : Fp16ToFloat(src[i]);
  if (order != 0) {
    for (int64_t base = 0; base < H; base += order) {
      for (int s = 1; s < order; s <<= 1) {
        for (int i = 0; i < order; ++i) {
          if ((i & s) == 0) {
            const float a = x[base + i], b = x[base + i + s];
            x[base + i] = Add(a, b);
            x[base + i + s] = Sub(a, b);
          }
        }
      }
    }
    for (int64_t i = 0; i < H; ++i) x[i] = Mul(x[i], norm);
  }
  if (mean != nullptr)
    for (int64_t i = 0; i < H; ++i) x[i] = Sub(x[i], mean[i]);
}

int64_t RowsOf(const PrepassTensor& t) {
  int64_t rows = 0;
  for (int64_t b = 0; b < t.batch; ++b) rows = std::max(rows, t.RowBase(b) + t.WrittenRows(b));
  return rows;
}

uint32_t AbsBits(float x) {
  const float a = std::fabs(x);
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  return bits;
}

/// Per-token INT8 of one tensor (PerTokenInt8Kernel).
void PerToken(const uint16_t* src, bool bf16, const PrepassTensor& t, const float* mean,
              int order, float norm, std::vector<int8_t>* dst, std::vector<float>* scale_out) {
  const int64_t H = t.head_dim, rows = RowsOf(t);
  dst->assign(rows * t.heads * H, 0);
  scale_out->assign(rows * t.heads, 0.f);  // padding rows: scale 0
  std::vector<float> x(H);
  for (int64_t b = 0; b < t.batch; ++b) {
    for (int64_t tok = 0; tok < t.Length(b); ++tok) {
      for (int64_t h = 0; h < t.heads; ++h) {
        const int64_t row = t.RowBase(b) + tok, at = (row * t.heads + h) * H;
        Transformed(src + at, bf16, H, mean ? mean + (b * t.heads + h) * H : nullptr, order,
                    norm, x.data());
        uint32_t m = 0;
        for (int64_t d = 0; d < H; ++d) m = std::max(m, AbsBits(x[d]));
        float scale;
        bool quantise = false;
        if (m >= 0x7f800000u) {
          uint32_t nan_bits = 0x7fffffffu;
          std::memcpy(&scale, &nan_bits, 4);
        } else {
          float amax;
          std::memcpy(&amax, &m, 4);
          scale = Div(amax, kInt8Max);
          quantise = scale > 0.f;
          if (!quantise) scale = 1.f;
        }
        (*scale_out)[row * t.heads + h] = scale;
        if (!quantise) continue;
        for (int64_t d = 0; d < H; ++d) {
          const float q = std::nearbyint(Div(x[d], scale));  // round half to even
          (*dst)[at + d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
        }
      }
    }
  }
}

/// V per-tensor E4M3 over valid rows (ValidAmaxKernel + E4M3Kernel).
void PerTensorE4M3(const uint16_t* src, bool bf16, const PrepassTensor& t,
                   std::vector<uint8_t>* dst, std::vector<float>* sc) {
  const int64_t H = t.head_dim;
  dst->assign(RowsOf(t) * t.heads * H, 0);
  uint32_t m = 0;
  std::vector<float> x(H);
  for (int pass = 0; pass < 2; ++pass) {
    float scale = 1.f;
    if (pass == 1) {
      float amax;
      std::memcpy(&amax, &m, 4);
      scale = Fp8ScaleForAmax(amax);
      *sc = {scale, Div(1.f, scale), amax};
    }
    for (int64_t b = 0; b < t.batch; ++b) {
      for (int64_t tok = 0; tok < t.Length(b); ++tok) {
        for (int64_t h = 0; h < t.heads; ++h) {
          const int64_t at = ((t.RowBase(b) + tok) * t.heads + h) * H;
          Transformed(src + at, bf16, H, nullptr, 0, 1.f, x.data());
          for (int64_t d = 0; d < H; ++d) {
            if (pass == 0) {
              m = std::max(m, AbsBits(x[d]));
            } else {
              (*dst)[at + d] = FloatToE4M3Sat(Mul(x[d], scale));
            }
          }
        }
      }
    }
  }
}

}  // namespace

// The names live here, in the host half of the pre-pass, so that host-only users (reports, the
// CPU tests) need none of the device code.
const char* Int8PvFormatName(Int8PvFormat pv) {
  return pv == Int8PvFormat::kE4M3 ? "e4m3" : "16-bit";
}

std::string Int8RecipeName(const Fp8Options& o, Int8PvFormat pv) {
  std::string name = "int8 per-token q/k";
  if (o.rotate) name += ", hadamard q/k";
  if (o.smooth_k) name += ", k-smoothing";
  return name + ", " + Int8PvFormatName(pv) + " p·v";
}

Status Int8PrepassReference(const AttentionShape& s, const uint16_t* q, const uint16_t* k,
                            const uint16_t* v, const AttentionTensors& index, Int8PvFormat pv,
                            Int8PrepassHost* out) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return InvalidArgument("int8 pre-pass reference: float16 or bfloat16 inputs only");
  }
  if (Fp8HadamardOrder(s.head_dim) == 0 || s.head_dim > 256) {
    return InvalidArgument("int8 pre-pass reference: head_dim must be a multiple of 8 up to 256");
  }
  if (pv != Int8PvFormat::kE4M3 && pv != Int8PvFormat::k16Bit) {
    return InvalidArgument("int8 pre-pass reference: unknown P·V format");
  }
  const bool bf16 = s.dtype == DType::kBFloat16;
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  const float norm = order ? fp8::HadamardNorm(order) : 1.f;
  const PrepassTensor qt = fp8::QTensor(s, index), kt = fp8::KvTensor(s, index);
  out->mean_k.clear();
  // K's mean in the device's order (EnqueueKMean's host twin); empty without smoothing.
  if (s.fp8.smooth_k) out->mean_k = fp8::KMeanReference(s, k, index);
  const float* mean = s.fp8.smooth_k ? out->mean_k.data() : nullptr;
  PerToken(q, bf16, qt, nullptr, order, norm, &out->q8, &out->q_scale);
  PerToken(k, bf16, kt, mean, order, norm, &out->k8, &out->k_scale);
  out->v8.clear();
  out->v_scalars.clear();
  if (pv == Int8PvFormat::kE4M3) {
    out->v_scalars = {1.f, 1.f, 0.f};
    PerTensorE4M3(v, bf16, kt, &out->v8, &out->v_scalars);
  }
  return Status::Ok();
}

}  // namespace attn::kernels
