// The compute behind stateful sequences: append new K/V into a layer's pages
// and attend over them. The CPU implementation (CpuPagedAttention) serves every
// build today; the GPU paged append/decode kernels (kernels/decode/, same page
// format) plug in here as a second implementation once they land, together with
// a device-memory page pool. Thread-safety: implementations must allow
// concurrent calls on different sequences.
#pragma once

#include <cstdint>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/paged_kv.h"
#include "attn/kernels/status.h"

namespace attn {

/// One (sequence, layer) as the compute sees it.
struct PagedLayerView {
  kernels::PagedKvPool pool;  ///< the sub-pool's page arrays
  const int32_t *block_table = nullptr;
  int64_t num_blocks = 0;
  int64_t kv_len = 0;               ///< tokens in the cache (after the append, for Attend)
  const float *k_scales = nullptr;  ///< (K) FP8 only
  const float *v_scales = nullptr;  ///< (K) FP8 only
};

/// What one Attend call is asked to compute: q (T, N, H) of `dtype` against the
/// layer's kv_len tokens, bottom-right causal (query i sees keys j <= kv_len -
/// T + i), softmax `scale`.
struct PagedQuery {
  const void *q = nullptr;
  int64_t tokens = 0;     ///< T
  int64_t num_heads = 0;  ///< N
  kernels::DType dtype = kernels::DType::kBFloat16;
  float scale = 0.f;
};

class PagedAttentionBackend {
 public:
  virtual ~PagedAttentionBackend() = default;
  virtual const std::string &name() const = 0;
  /// Writes k, v ((T, K, H) of `src_dtype`) at tokens [start, start + T) of the
  /// layer. FP8 pages add their saturated element count to *saturations.
  virtual Status Append(const PagedLayerView &layer, int64_t start, int64_t tokens, const void *k,
                        const void *v, kernels::DType src_dtype, int64_t *saturations) = 0;
  /// Copies slots [0, tokens) of page src to page dst (copy-on-write).
  virtual Status CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                          int64_t tokens) = 0;
  /// Computes o ((T, N, H) of q.dtype) over the layer's cache.
  virtual Status Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) = 0;
};

}  // namespace attn
