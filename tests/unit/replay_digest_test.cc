// ReplayDigest (server/backends/paged/replay_digest.h): the AVX2 path and the baseline path give
// XXH3-64's own value (q, then k and v seeded with the digest so far) for every length around
// XXH3's size classes and stripe/block boundaries, and the digest changes when any one byte of
// q, k or v changes or when bytes move from one tensor to the next (what replay detection needs:
// a step that is not an exact replay must not be taken for one).
#include "backends/paged/replay_digest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace attn {
namespace {

uint64_t Reference(const std::vector<uint8_t> &q, const std::vector<uint8_t> &k,
                   const std::vector<uint8_t> &v) {
  uint64_t d = XXH3_64bits(q.data(), q.size());
  d = XXH3_64bits_withSeed(k.data(), k.size(), d);
  return XXH3_64bits_withSeed(v.data(), v.size(), d);
}

std::vector<uint8_t> Bytes(size_t n, std::mt19937 &rng) {
  std::vector<uint8_t> b(n);
  for (uint8_t &x : b) x = static_cast<uint8_t>(rng());
  return b;
}

uint64_t Digest(const std::vector<uint8_t> &q, const std::vector<uint8_t> &k,
                const std::vector<uint8_t> &v) {
  return ReplayDigest(q.data(), q.size(), k.data(), k.size(), v.data(), v.size());
}

TEST(ReplayDigest, BothPathsGiveXxh3sValueAtEveryLength) {
  std::mt19937 rng(7);
  std::vector<size_t> lengths = {0, 1, 3, 16, 17, 128, 129, 240, 241, 255, 256, 1023, 1024, 1025,
                                 2048, 8192, 12288, 65536 + 7};
  for (size_t i = 0; i < 40; ++i) lengths.push_back(rng() % 20000);
  int avx2_checked = 0;
  for (size_t n : lengths) {
    const auto q = Bytes(n, rng), k = Bytes(n / 4 + 1, rng), v = Bytes(n / 4 + 1, rng);
    const uint64_t want = Reference(q, k, v);
    EXPECT_EQ(internal::ReplayDigestBaseline(q.data(), q.size(), k.data(), k.size(), v.data(),
                                             v.size()),
              want)
        << n;
    EXPECT_EQ(Digest(q, k, v), want) << n;
    if (internal::HaveAvx2Digest()) {
      EXPECT_EQ(internal::ReplayDigestAvx2(q.data(), q.size(), k.data(), k.size(), v.data(),
                                           v.size()),
                want)
          << n;
      ++avx2_checked;
    }
  }
  if (avx2_checked == 0) GTEST_SKIP() << "no AVX2 path here: only the baseline was checked";
}

TEST(ReplayDigest, AnyChangedOrMovedByteChangesIt) {
  std::mt19937 rng(11);
  auto q = Bytes(8192, rng), k = Bytes(2048, rng), v = Bytes(2048, rng);
  const uint64_t base = Digest(q, k, v);
  for (std::vector<uint8_t> *t : {&q, &k, &v}) {
    for (size_t at : {size_t{0}, t->size() / 2, t->size() - 1}) {
      (*t)[at] ^= 1;
      EXPECT_NE(Digest(q, k, v), base) << at;
      (*t)[at] ^= 1;
    }
  }
  EXPECT_EQ(Digest(q, k, v), base);
  // The last byte of q moved to the front of k: same bytes in the same order, other tensors.
  std::vector<uint8_t> q2(q.begin(), q.end() - 1), k2 = k;
  k2.insert(k2.begin(), q.back());
  EXPECT_NE(Digest(q2, k2, v), base);
  // An append-only step (no q) is not the step whose q was empty bytes elsewhere.
  EXPECT_EQ(ReplayDigest(nullptr, 0, k.data(), k.size(), v.data(), v.size()),
            Digest({}, k, v));
}

}  // namespace
}  // namespace attn
