// One stateful sequence of the paged KV cache: its configuration, one block
// table per layer, FP8 scales, the last step of each layer (for exact replays)
// and reserved pages. A plain data holder; SequenceStore and ExtendStep
// implement the behaviour. Thread-safety: `mu` guards every field below it;
// SequenceStore's lock guards the LRU fields.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "kv_cache/block_table.h"
#include "kv_cache/byte_budget.h"
#include "kv_cache/replay_output.h"
#include "kv_cache/sub_pool.h"

namespace attn {

/// The shape of a sequence, fixed at CreateSequence.
struct SequenceConfig {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;                             ///< K
  int32_t head_dim = 0;                                 ///< H
  int32_t num_heads = 0;                                ///< N, N % K == 0
  kernels::DType dtype = kernels::DType::kBFloat16;     ///< q, k, v, o
  kernels::DType kv_dtype = kernels::DType::kBFloat16;  ///< page storage
  float scale = 0.f;                                    ///< softmax scale (resolved)
  int64_t reserve_tokens = 0;                           ///< tokens per layer reserved at creation
  /// FP8: (num_layers, num_kv_heads) scales given at creation; empty: from the
  /// first prefill.
  std::vector<float> k_scales;
  std::vector<float> v_scales;
};

/// The last Extend on a layer, kept so that an exact replay returns the same
/// result. valid is false when there is none or its output did not fit the replay budget
/// (replay_output.h).
struct LastStep {
  bool valid = false;
  int64_t position = 0;
  int64_t tokens = 0;
  uint64_t digest = 0;  ///< XXH3 of the q, k, v bytes
  ReplayOutput o;       ///< the output bytes returned, charged to the store's replay budget
};

/// One layer's state.
struct LayerState {
  explicit LayerState(int32_t page_tokens) : table(page_tokens) {}
  BlockTable table;
  std::vector<int32_t> spare;   ///< reserved pages not yet in the table (count 1, owned)
  std::vector<float> k_scales;  ///< FP8: (K) dequantisation scales; empty until set
  std::vector<float> v_scales;
  LastStep last;
};

/// Why a sequence is gone (reported in NOT_FOUND to its owner).
enum class SequenceState { kLive, kReleased, kEvicted, kExpired, kRevoked };

struct Sequence {
  Sequence(std::string id_in, std::string owner_in, SequenceConfig config_in, SubPool *sub_in)
      : id(std::move(id_in)),
        owner(std::move(owner_in)),
        config(std::move(config_in)),
        sub(sub_in) {}

  std::string id;  ///< set once when registered, then constant
  const std::string owner;
  const SequenceConfig config;
  SubPool *const sub;  ///< the sub-pool of (K, H, kv dtype)

  /// Serialises every operation on this sequence (Extend, Truncate, Fork,
  /// Release, Get).
  std::mutex mu;
  std::vector<LayerState> layers;  ///< (num_layers)
  /// This sequence's host metadata (SequenceMetadataBytes), charged to the store's
  /// --sequence-metadata-bytes budget until the sequence is destroyed.
  BudgetCharge metadata;
  SequenceState state = SequenceState::kLive;
  int64_t fp8_saturations = 0;

  // Guarded by SequenceStore's lock.
  int64_t last_used_us = 0;
  std::list<Sequence *>::iterator lru_it;

  /// Pages referenced by the block tables plus spares.
  int64_t PagesHeld() const {
    int64_t n = 0;
    for (const LayerState &l : layers) {
      n += l.table.num_blocks() + static_cast<int64_t>(l.spare.size());
    }
    return n;
  }
};

/// Host bytes a sequence of `c` holds before it stores anything (its Sequence, one LayerState
/// per layer, FP8 scales): what --sequence-metadata-bytes is charged per sequence. Block tables
/// and stored outputs grow with the cache and are bounded by --kv-cache-bytes and
/// --replay-cache-bytes. (~170 bytes per layer: 4096 layers hold ~0.7 MB with no page at all.)
inline int64_t SequenceMetadataBytes(const SequenceConfig &c) {
  const int64_t layers = std::max<int32_t>(c.num_layers, 0);
  const int64_t kv_heads = std::max<int32_t>(c.num_kv_heads, 0);
  return static_cast<int64_t>(sizeof(Sequence)) +
         layers * (static_cast<int64_t>(sizeof(LayerState)) + 2 * 4 * kv_heads);
}

}  // namespace attn
