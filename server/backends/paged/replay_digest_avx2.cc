// ReplayDigest's AVX2 path: this file alone is compiled with -mavx2 (server/CMakeLists.txt, on
// x86-64 only), so XXH3 (inlined here, XXH_INLINE_ALL: every function static to this file)
// picks its AVX2 accumulator; it runs only after the CPU was checked (HaveAvx2Digest).
#include "backends/paged/replay_digest.h"

#if defined(ATTN_REPLAY_DIGEST_AVX2) && defined(__AVX2__)
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace attn {
namespace internal {

uint64_t ReplayDigestAvx2(const void *q, size_t q_bytes, const void *k, size_t k_bytes,
                          const void *v, size_t v_bytes) {
#if defined(ATTN_REPLAY_DIGEST_AVX2) && defined(__AVX2__)
  uint64_t d = XXH3_64bits(q, q_bytes);
  d = XXH3_64bits_withSeed(k, k_bytes, d);
  return XXH3_64bits_withSeed(v, v_bytes, d);
#else
  return ReplayDigestBaseline(q, q_bytes, k, k_bytes, v, v_bytes);
#endif
}

}  // namespace internal
}  // namespace attn
