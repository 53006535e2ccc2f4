// Host implementation of the paged KV-cache page format (see paged_kv_cpu.h,
// paged_kv.h).
#include "attn/kernels/paged_kv_cpu.h"

#include <cmath>
#include <cstring>
#include <string>

#include "attn/kernels/host_dtype.h"

namespace attn::kernels {
namespace {

bool IsKvDType(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat8E4M3;
}

Status CheckPool(const PagedKvPool &pool) {
  if (pool.k_pages == nullptr || pool.v_pages == nullptr || pool.num_pages <= 0 ||
      pool.page_tokens <= 0 || pool.num_kv_heads <= 0 || pool.head_dim <= 0 ||
      !IsKvDType(pool.kv_dtype)) {
    return InvalidArgument("paged kv: invalid pool view");
  }
  return Status::Ok();
}

/// Checks that `block_table` covers `tokens` tokens with valid page indices.
Status CheckBlocks(const PagedKvPool &pool, const int32_t *block_table, int64_t num_blocks,
                   int64_t tokens) {
  const int64_t need = (tokens + pool.page_tokens - 1) / pool.page_tokens;
  if (need > num_blocks) {
    return InvalidArgument("paged kv: " + std::to_string(tokens) + " tokens need " +
                           std::to_string(need) + " blocks, the block table has " +
                           std::to_string(num_blocks));
  }
  if (need > 0 && block_table == nullptr) return InvalidArgument("paged kv: null block table");
  for (int64_t b = 0; b < need; ++b) {
    if (block_table[b] < 0 || block_table[b] >= pool.num_pages) {
      return InvalidArgument("paged kv: block " + std::to_string(b) + " names page " +
                             std::to_string(block_table[b]) + " outside [0, " +
                             std::to_string(pool.num_pages) + ")");
    }
  }
  return Status::Ok();
}

Status CheckScales(const PagedKvPool &pool, const float *k_scales, const float *v_scales) {
  if (pool.kv_dtype != DType::kFloat8E4M3) return Status::Ok();
  if (k_scales == nullptr || v_scales == nullptr) {
    return InvalidArgument("paged kv: FP8 pages need k_scales and v_scales");
  }
  for (int h = 0; h < pool.num_kv_heads; ++h) {
    if (!(k_scales[h] > 0.f) || !(v_scales[h] > 0.f) || !std::isfinite(k_scales[h]) ||
        !std::isfinite(v_scales[h])) {
      return InvalidArgument("paged kv: FP8 scales must be finite and > 0 (head " +
                             std::to_string(h) + ")");
    }
  }
  return Status::Ok();
}

/// Converts one row of H elements from `src` (index base si) into `dst` (index
/// base di).
void ConvertRow(const void *src, DType sd, int64_t si, void *dst, DType dd, int64_t di, int64_t n,
                float quant_scale, float dequant_scale, int64_t *saturations) {
  const int es = DTypeSize(sd);
  if (sd == dd) {
    std::memcpy(static_cast<char *>(dst) + di * es, static_cast<const char *>(src) + si * es,
                static_cast<size_t>(n * es));
    return;
  }
  for (int64_t d = 0; d < n; ++d) {
    float x = sd == DType::kFloat8E4M3
                  ? Fp8E4M3ToFloat(static_cast<const uint8_t *>(src)[si + d]) * dequant_scale
                  : LoadAsFloat(src, sd, si + d);
    if (dd == DType::kFloat8E4M3) {
      bool sat = false;
      static_cast<uint8_t *>(dst)[di + d] = FloatToFp8E4M3(x / quant_scale, &sat);
      if (sat && saturations != nullptr) ++*saturations;
    } else {
      StoreFromFloat(dst, dd, di + d, x);
    }
  }
}

}  // namespace

float Fp8E4M3ToFloat(uint8_t bits) {
  const bool neg = (bits & 0x80u) != 0;
  const int exp = (bits >> 3) & 0xf;
  const int mant = bits & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) {
    v = std::nanf("");
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant * 2^-9
  } else {
    v = std::ldexp(1.f + static_cast<float>(mant) / 8.f, exp - 7);
  }
  return neg ? -v : v;
}

uint8_t FloatToFp8E4M3(float x, bool *saturated) {
  if (saturated != nullptr) *saturated = false;
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a > kFp8E4M3Max) {
    if (saturated != nullptr) *saturated = true;
    return sign | 0x7e;  // 448
  }
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a = 1.f * 2^exp
  if (a == 0.f || exp < -6) {
    // Subnormal range: units of 2^-9; q == 8 is the smallest normal (bits
    // 0x08), still right.
    const float q = std::nearbyint(std::ldexp(a, 9));
    return sign | static_cast<uint8_t>(q);
  }
  float q = std::nearbyint((std::ldexp(a, -exp) - 1.f) * 8.f);
  if (q >= 8.f) {
    q = 0.f;
    ++exp;
  }
  // a <= 448 guarantees exp <= 8 and, at exp == 8, q <= 6 (never the NaN
  // encoding).
  return sign | static_cast<uint8_t>((exp + 7) << 3) | static_cast<uint8_t>(q);
}

Status PagedAppendCpu(const PagedKvPool &pool, const int32_t *block_table, int64_t num_blocks,
                      int64_t start, int64_t num_tokens, const void *k, const void *v,
                      DType src_dtype, const float *k_scales, const float *v_scales,
                      int64_t *saturations) {
  ATTN_RETURN_IF_ERROR(CheckPool(pool));
  if (start < 0 || num_tokens < 0) return InvalidArgument("paged kv: negative start or length");
  if (num_tokens == 0) return Status::Ok();
  if (k == nullptr || v == nullptr) return InvalidArgument("paged kv: null k or v");
  if (src_dtype == DType::kFloat8E4M3 || !IsKvDType(src_dtype)) {
    return InvalidArgument("paged kv: append source must be float32, float16 or bfloat16");
  }
  ATTN_RETURN_IF_ERROR(CheckBlocks(pool, block_table, num_blocks, start + num_tokens));
  ATTN_RETURN_IF_ERROR(CheckScales(pool, k_scales, v_scales));
  const int64_t K = pool.num_kv_heads;
  const int64_t H = pool.head_dim;
  const bool fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = start + t;
    const int64_t page = block_table[pos / pool.page_tokens];
    const int64_t slot = pos % pool.page_tokens;
    for (int64_t h = 0; h < K; ++h) {
      const int64_t src = (t * K + h) * H;
      const int64_t dst = pool.Offset(page, h, slot);
      ConvertRow(k, src_dtype, src, pool.k_pages, pool.kv_dtype, dst, H, fp8 ? k_scales[h] : 1.f,
                 1.f, saturations);
      ConvertRow(v, src_dtype, src, pool.v_pages, pool.kv_dtype, dst, H, fp8 ? v_scales[h] : 1.f,
                 1.f, saturations);
    }
  }
  return Status::Ok();
}

Status PagedGatherCpu(const PagedKvPool &pool, const int32_t *block_table, int64_t num_blocks,
                      int64_t kv_len, const float *k_scales, const float *v_scales, DType out_dtype,
                      void *k_out, void *v_out) {
  ATTN_RETURN_IF_ERROR(CheckPool(pool));
  if (kv_len < 0) return InvalidArgument("paged kv: negative length");
  if (kv_len == 0) return Status::Ok();
  if (k_out == nullptr || v_out == nullptr) return InvalidArgument("paged kv: null output");
  if (out_dtype == DType::kFloat8E4M3 || !IsKvDType(out_dtype)) {
    return InvalidArgument("paged kv: gather output must be float32, float16 or bfloat16");
  }
  ATTN_RETURN_IF_ERROR(CheckBlocks(pool, block_table, num_blocks, kv_len));
  ATTN_RETURN_IF_ERROR(CheckScales(pool, k_scales, v_scales));
  const int64_t K = pool.num_kv_heads;
  const int64_t H = pool.head_dim;
  const bool fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  for (int64_t j = 0; j < kv_len; ++j) {
    const int64_t page = block_table[j / pool.page_tokens];
    const int64_t slot = j % pool.page_tokens;
    for (int64_t h = 0; h < K; ++h) {
      const int64_t src = pool.Offset(page, h, slot);
      const int64_t dst = (j * K + h) * H;
      ConvertRow(pool.k_pages, pool.kv_dtype, src, k_out, out_dtype, dst, H, 1.f,
                 fp8 ? k_scales[h] : 1.f, nullptr);
      ConvertRow(pool.v_pages, pool.kv_dtype, src, v_out, out_dtype, dst, H, 1.f,
                 fp8 ? v_scales[h] : 1.f, nullptr);
    }
  }
  return Status::Ok();
}

Status PagedCopyPageCpu(const PagedKvPool &pool, int32_t src, int32_t dst, int64_t tokens) {
  ATTN_RETURN_IF_ERROR(CheckPool(pool));
  if (src < 0 || src >= pool.num_pages || dst < 0 || dst >= pool.num_pages || tokens < 0 ||
      tokens > pool.page_tokens) {
    return InvalidArgument("paged kv: bad page copy");
  }
  const int64_t row = static_cast<int64_t>(pool.head_dim) * DTypeSize(pool.kv_dtype);
  for (int64_t h = 0; h < pool.num_kv_heads; ++h) {
    const int64_t s = pool.Offset(src, h, 0) * DTypeSize(pool.kv_dtype);
    const int64_t d = pool.Offset(dst, h, 0) * DTypeSize(pool.kv_dtype);
    std::memcpy(static_cast<char *>(pool.k_pages) + d, static_cast<const char *>(pool.k_pages) + s,
                static_cast<size_t>(tokens * row));
    std::memcpy(static_cast<char *>(pool.v_pages) + d, static_cast<const char *>(pool.v_pages) + s,
                static_cast<size_t>(tokens * row));
  }
  return Status::Ok();
}

void PagedPoisonPageCpu(const PagedKvPool &pool, int32_t page) {
  if (!CheckPool(pool).ok() || page < 0 || page >= pool.num_pages) return;
  const int64_t n = static_cast<int64_t>(pool.num_kv_heads) * pool.page_tokens * pool.head_dim;
  const int64_t base = pool.Offset(page, 0, 0);
  for (void *arr : {pool.k_pages, pool.v_pages}) {
    for (int64_t i = 0; i < n; ++i) {
      switch (pool.kv_dtype) {
        case DType::kFloat32:
          static_cast<float *>(arr)[base + i] = std::nanf("");
          break;
        case DType::kFloat16:
          static_cast<uint16_t *>(arr)[base + i] = 0x7e00;
          break;
        case DType::kBFloat16:
          static_cast<uint16_t *>(arr)[base + i] = 0x7fc0;
          break;
        case DType::kFloat8E4M3:
          static_cast<uint8_t *>(arr)[base + i] = 0x7f;
          break;
      }
    }
  }
}

}  // namespace attn::kernels
