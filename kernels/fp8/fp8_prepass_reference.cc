// Fp8PrepassReference: the FP8 pre-pass on the host, bit for bit what fp8_prepass.cu computes
// (the same rows in the same order, the same fp32 operations, none contracted into FMAs).
#include <cmath>
#include <cstring>
#include <string>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "fp8_kmean.h"
#include "fp8_prepass_geometry.h"

namespace attn::kernels {
namespace {

using fp8::PrepassTensor;

float ToFloat(uint16_t bits, bool bf16) {
  if (bf16) {
    const uint32_t w = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return f;
  }
  // IEEE binary16 -> float, exact.
  const int sign = bits >> 15, exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant + 1024), exp - 25);
  }
  return sign ? -f : f;
}

// Volatile stores keep the compiler from fusing a multiply into a later add (FMA contraction).
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

/// x <- x·H_order·order^-1/2 per aligned block of `order` elements (HadamardRotate).
void Rotate(int64_t H, int order, float norm, float* x) {
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

/// One row of H elements at `src`, rotated with `order` (0: none), then minus `mean` (null:
/// none; the mean of the rotated rows), as LoadTransformed (fp8_prepass_device.cuh).
void Transformed(const uint16_t* src, bool bf16, int64_t H, const float* mean, int order,
                 float norm, float* x) {
  for (int64_t i = 0; i < H; ++i) x[i] = ToFloat(src[i], bf16);
  if (order != 0) Rotate(H, order, norm, x);
  if (mean)
    for (int64_t i = 0; i < H; ++i) x[i] = Sub(x[i], mean[i]);
}

/// Mean of the valid rotated rows per (entry, head) in the device's order (MeanPartialKernel +
/// MeanFinalKernel).
std::vector<float> Means(const uint16_t* k, bool bf16, const PrepassTensor& t, int order,
                         float norm) {
  const int64_t H = t.head_dim, chunks = fp8::Chunks(t.max_len);
  const int rpp = fp8::RowsPerPass(H);
  std::vector<float> mean(t.batch * t.heads * H, 0.f);
  std::vector<float> partial(chunks * H);
  std::vector<float> acc(rpp * H), x(H);
  for (int64_t b = 0; b < t.batch; ++b) {
    const int64_t len = t.Length(b);
    for (int64_t h = 0; h < t.heads; ++h) {
      for (int64_t c = 0; c < chunks; ++c) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int p = 0; p < kFp8PrepassChunk / rpp; ++p) {
          for (int r = 0; r < rpp; ++r) {
            const int64_t tok = c * kFp8PrepassChunk + p * rpp + r;
            if (tok >= len) continue;
            const uint16_t* row = k + ((t.RowBase(b) + tok) * t.heads + h) * H;
            Transformed(row, bf16, H, nullptr, order, norm, x.data());
            for (int64_t d = 0; d < H; ++d) acc[r * H + d] = Add(acc[r * H + d], x[d]);
          }
        }
        for (int64_t d = 0; d < H; ++d) {
          float s = 0.f;
          for (int r = 0; r < rpp; ++r) s = Add(s, acc[r * H + d]);
          partial[c * H + d] = s;
        }
      }
      for (int64_t d = 0; d < H; ++d) {
        // KFinalKernel's order: chunk c into stream c % 8 in increasing c, then the 8 streams.
        float lanes[8];
        for (int g = 0; g < 8; ++g) {
          lanes[g] = 0.f;
          for (int64_t c = g; c < chunks; c += 8) lanes[g] = Add(lanes[g], partial[c * H + d]);
        }
        float s = 0.f;
        for (int g = 0; g < 8; ++g) s = Add(s, lanes[g]);
        volatile float m = len > 0 ? s / static_cast<float>(len) : 0.f;
        mean[(b * t.heads + h) * H + d] = m;
      }
    }
  }
  return mean;
}

/// amax, then quantisation of one tensor; writes (scale, descale, amax) at sc[0..2].
void Quantize(const uint16_t* src, bool bf16, const PrepassTensor& t, const float* mean, int order,
              float norm, std::vector<uint8_t>* dst, float* sc) {
  const int64_t H = t.head_dim;
  int64_t rows = 0;
  for (int64_t b = 0; b < t.batch; ++b) rows = std::max(rows, t.RowBase(b) + t.WrittenRows(b));
  dst->assign(rows * t.heads * H, 0);
  std::vector<float> x(H);
  uint32_t amax_bits = 0;
  auto each_valid = [&](auto&& fn) {
    for (int64_t b = 0; b < t.batch; ++b) {
      for (int64_t tok = 0; tok < t.Length(b); ++tok) {
        for (int64_t h = 0; h < t.heads; ++h) {
          const int64_t at = ((t.RowBase(b) + tok) * t.heads + h) * H;
          Transformed(src + at, bf16, H, mean ? mean + (b * t.heads + h) * H : nullptr, order, norm,
                      x.data());
          fn(at);
        }
      }
    }
  };
  each_valid([&](int64_t) {
    for (int64_t d = 0; d < H; ++d) {
      const float a = std::fabs(x[d]);
      uint32_t bits;
      std::memcpy(&bits, &a, 4);
      amax_bits = std::max(amax_bits, bits);
    }
  });
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  const float scale = Fp8ScaleForAmax(amax);
  each_valid([&](int64_t at) {
    for (int64_t d = 0; d < H; ++d) (*dst)[at + d] = FloatToE4M3Sat(Mul(x[d], scale));
  });
  sc[0] = scale;
  volatile float descale = 1.f / scale;
  sc[1] = descale;
  sc[2] = amax;
}

}  // namespace

Status Fp8PrepassReference(const AttentionShape& s, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const AttentionTensors& index,
                           std::vector<uint8_t>* q8, std::vector<uint8_t>* k8,
                           std::vector<uint8_t>* v8, std::vector<float>* scalars,
                           std::vector<float>* mean_k) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return InvalidArgument("fp8 pre-pass reference: float16 or bfloat16 inputs only");
  }
  if (Fp8HadamardOrder(s.head_dim) == 0 || s.head_dim > 256) {
    return InvalidArgument("fp8 pre-pass reference: head_dim must be a multiple of 8 up to 256");
  }
  const bool bf16 = s.dtype == DType::kBFloat16;
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  const float norm = order ? fp8::HadamardNorm(order) : 1.f;
  const PrepassTensor qt = fp8::QTensor(s, index), kt = fp8::KvTensor(s, index);
  scalars->assign(kFp8NumScalars, 0.f);
  mean_k->clear();
  if (s.fp8.smooth_k) *mean_k = Means(k, bf16, kt, order, norm);
  const float* mean = s.fp8.smooth_k ? mean_k->data() : nullptr;
  Quantize(q, bf16, qt, nullptr, order, norm, q8, scalars->data() + kFp8ScaleQ);
  Quantize(k, bf16, kt, mean, order, norm, k8, scalars->data() + kFp8ScaleK);
  Quantize(v, bf16, kt, nullptr, 0, 1.f, v8, scalars->data() + kFp8ScaleV);
  return Status::Ok();
}

namespace fp8 {

std::vector<float> KMeanReference(const AttentionShape& s, const uint16_t* k,
                                  const AttentionTensors& host_index) {
  if (!s.fp8.smooth_k) return {};
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  return Means(k, s.dtype == DType::kBFloat16, KvTensor(s, host_index), order,
               order ? HadamardNorm(order) : 1.f);
}

}  // namespace fp8

}  // namespace attn::kernels
