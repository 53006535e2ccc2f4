#include "loadgen/token_keys.h"

#include <cmath>

#include "loadgen/random_normal.h"

namespace attn::loadgen {

namespace {
uint64_t Mix(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}
}  // namespace

uint64_t SessionTokenKey(uint64_t seed, int64_t session, int64_t position) {
  return Mix(seed ^ 0x5e55105ull, static_cast<uint64_t>(session), static_cast<uint64_t>(position));
}

uint64_t MooncakeTokenKey(uint64_t seed, const MooncakeRequest& request, double token_scale,
                          int64_t context, int64_t request_index, int64_t position) {
  const double block_tokens = kMooncakeBlockTokens * token_scale;
  if (position < context && block_tokens > 0) {
    const auto block =
        static_cast<size_t>(std::floor(static_cast<double>(position) / block_tokens));
    if (block < request.hash_ids.size()) {
      return Mix(seed ^ 0x4a54ull, static_cast<uint64_t>(request.hash_ids[block]) * 2 + 1,
                 static_cast<uint64_t>(position));
    }
  }
  return Mix(seed ^ 0x4a55ull, static_cast<uint64_t>(request_index) * 2,
             static_cast<uint64_t>(position));
}

}  // namespace attn::loadgen
