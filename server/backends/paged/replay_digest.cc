#include "backends/paged/replay_digest.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace attn {
namespace internal {

uint64_t ReplayDigestBaseline(const void *q, size_t q_bytes, const void *k, size_t k_bytes,
                              const void *v, size_t v_bytes) {
  uint64_t d = XXH3_64bits(q, q_bytes);
  d = XXH3_64bits_withSeed(k, k_bytes, d);
  return XXH3_64bits_withSeed(v, v_bytes, d);
}

bool HaveAvx2Digest() {
#if defined(ATTN_REPLAY_DIGEST_AVX2)
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
#else
  return false;
#endif
}

}  // namespace internal

uint64_t ReplayDigest(const void *q, size_t q_bytes, const void *k, size_t k_bytes, const void *v,
                      size_t v_bytes) {
  using Fn = uint64_t (*)(const void *, size_t, const void *, size_t, const void *, size_t);
  static const Fn fn = internal::HaveAvx2Digest() ? &internal::ReplayDigestAvx2
                                                  : &internal::ReplayDigestBaseline;
  return fn(q, q_bytes, k, k_bytes, v, v_bytes);
}

}  // namespace attn
