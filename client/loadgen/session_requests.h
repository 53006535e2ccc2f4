// The Extend requests of the stateful workloads: the model shape they use and the token rows of
// q, k and v, regenerated from each token's key (token_keys.h) whenever they are needed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "attention/v1/sequence.pb.h"

namespace attn::loadgen {

/// A sequence's key function: the per-token key of the token at `position`.
using TokenKeyFn = std::function<uint64_t(int64_t position)>;

/// The shape of every sequence of a run: query heads, key/value heads, head dim, dtype.
struct SessionShape {
  int64_t n, k, h;
  attention::v1::DType dtype;
};

/// Token rows [first, first+count) of tensor `which` (0 q, 1 k, 2 v) on `layer`, `width`
/// values each, encoded in `dtype` (count × width values, row-major).
std::string TokenBytes(const TokenKeyFn& key, int layer, int which, int64_t first, int64_t count,
                       int64_t width, attention::v1::DType dtype);

/// Fills `r` (cleared first) with the Extend of sequence `id` on `layer` at `position` with `t`
/// tokens: q (t, n, h), k and v (t, k, h).
void BuildExtend(const SessionShape& s, const std::string& id, int layer, int64_t position,
                 int64_t t, const TokenKeyFn& key, attention::v1::ExtendRequest* r);

}  // namespace attn::loadgen
