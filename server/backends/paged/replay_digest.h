// The replay digest of a sequence step (DESIGN.md §3): an exact replay of a layer's last step
// (same position, same T, same q/k/v bytes) is answered from the stored result, and the digest
// is how "same bytes" is checked without keeping them. XXH3-64 over q, then k and v each seeded
// with the digest so far; on x86-64 CPUs with AVX2 the same function runs with XXH3's AVX2
// accumulator (the value is identical: XXH3 is defined independently of its vector width),
// about twice the SSE2 speed (~12 KB per N32 K8 H128 bf16 decode step, every step).
// Thread-safety: pure.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn {

/// The digest of (q, k, v): XXH3-64 of q, then of k seeded with it, then of v seeded with that.
/// Null pointers are allowed with 0 bytes (an append-only step has no q).
uint64_t ReplayDigest(const void *q, size_t q_bytes, const void *k, size_t k_bytes, const void *v,
                      size_t v_bytes);

namespace internal {
/// ReplayDigest on XXH3's baseline (SSE2 on x86-64) path.
uint64_t ReplayDigestBaseline(const void *q, size_t q_bytes, const void *k, size_t k_bytes,
                              const void *v, size_t v_bytes);
/// ReplayDigest on XXH3's AVX2 path; only when HaveAvx2Digest() (baseline otherwise).
uint64_t ReplayDigestAvx2(const void *q, size_t q_bytes, const void *k, size_t k_bytes,
                          const void *v, size_t v_bytes);
/// True when this build has the AVX2 path and the CPU runs it.
bool HaveAvx2Digest();
}  // namespace internal

}  // namespace attn
