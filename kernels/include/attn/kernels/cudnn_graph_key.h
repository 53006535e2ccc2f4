// Which cuDNN SDPA graph serves an attention problem (DESIGN.md §5): bucketing and graph keys.
//
// Building a cuDNN graph costs ~0.1-0.5 s, so graphs are cached by a *bucketed* signature, not
// by the exact request shape:
//   - ragged graphs (the default): q/k/v/o are addressed through per-batch ragged offsets and
//     per-batch sequence lengths (padding mask), both runtime tensors, so one graph with extents
//     (B_bucket, T_bucket, S_bucket) serves every request with B <= B_bucket, T <= T_bucket,
//     S <= S_bucket, padded or varlen alike: padded (B,T,N,H) entry b starts at row b·T, varlen
//     entry b at row q_offsets[b]; batch entries past B get length 0. Buckets are powers of two
//     (at least CudnnBucketOptions::min_len / min_batch).
//   - dense graphs: the exact padded shape with no lengths and no padding mask (cuDNN's fastest
//     path); used first when the shape already sits on its bucket (B, T, S powers of two) and
//     the mask needs no padding, as in benchmarks.
//   - paged graphs: K/V read from a page pool [pages, K, page_tokens, H] through a block table
//     (paged_kv.h), queries ragged as above.
// The key also holds dtype, heads, head dim, the mask (alignment and window), whether stats
// (LSE) are produced, and the target SM. The softmax scale is a runtime value, not in the key.
// Pure functions; thread-safe; compiled in every build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"

namespace attn::kernels {

/// Which cuDNN graph family.
enum class CudnnGraphKind : int {
  kSdpa = 0,   ///< fp16/bf16 q, k, v, o
  kFp8 = 1,    ///< E4M3 q, k, v with descales, E4M3 o with scale (Hopper), amax outputs
  kPaged = 2,  ///< fp16/bf16 q, o; K/V from a page pool through block tables
};
const char* CudnnGraphKindName(CudnnGraphKind kind);

/// How lengths are bucketed.
struct CudnnBucketOptions {
  int64_t min_len = 64;   ///< smallest T/S bucket
  int64_t min_batch = 1;  ///< smallest B bucket
};

/// The smallest power of two >= max(x, minimum) (x, minimum >= 1; values above 2^62 are
/// returned unchanged).
int64_t BucketPow2(int64_t x, int64_t minimum);

/// Everything that determines one cuDNN graph. Two problems with equal specs share a graph.
struct CudnnGraphSpec {
  CudnnGraphKind kind = CudnnGraphKind::kSdpa;
  DType dtype = DType::kBFloat16;  ///< q/k/v/o (kSdpa, kPaged); kFloat8E4M3 for kFp8
  bool ragged = true;              ///< ragged offsets + padding mask (false: exact dims)
  bool padding = false;            ///< non-ragged: padding mask with per-entry lengths
  int64_t batch = 0;               ///< graph extents: B, T, S (buckets when ragged)
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  MaskSpec mask;
  bool stats = false;              ///< produce softmax stats (the LSE)
  int64_t page_tokens = 0;         ///< kPaged: tokens per page
  int64_t num_pages = 0;           ///< kPaged: pages in the pool (the K/V container's extent)
  int64_t max_pages_per_seq = 0;   ///< kPaged: block-table width (bucketed)
  int sm = 0;                      ///< target SM version, e.g. 90

  /// Canonical text form, the cache key, e.g.
  /// "sdpa bf16 ragged B4 T1024 S1024 N32 K8 H128 causal=top_left wl=-1 wr=-1 stats sm90".
  std::string Key() const;
};

/// The graph specs that can serve `shape` (kind kSdpa, or kFp8 when `fp8`), best first.
/// kSdpa: the dense spec first when the shape sits on its buckets with no lengths and T <= S,
/// then the ragged bucketed spec, then (if not first already and allowed) the dense exact spec.
/// kFp8 (cuDNN's FP8 kernels on Hopper fault on ragged offsets, seen with 9.19 on an H200):
/// one exact-dims spec for padded shapes, with a padding mask when the shape has lengths;
/// none for varlen. Pure.
std::vector<CudnnGraphSpec> CudnnSpecCandidates(const AttentionShape& shape, int sm, bool fp8,
                                                const CudnnBucketOptions& options = {});

}  // namespace attn::kernels
