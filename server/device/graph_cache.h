// The CUDA graphs of one lane (DESIGN.md §7; issue 18 item 4): a small least-recently-used
// map from a round trip's graph key (RoundTrip::GraphKey, device/lane.h) to the instantiated
// graph that trip captured. A key names every node of the graph exactly (copy sizes and
// pointers, kernels, grids and every scalar kernel argument), so a hit replays the same work
// on new data and a trip whose plan differs in anything gets a key of its own: a replay can
// never run a stale split plan. The data a replay reads (q, new K/V, block tables, lengths,
// offsets) travels in the lane's buffers, which the key names by address.
// CUDA builds only. Thread-safety: none; the lane's holder uses it (LaneLease).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace attn {

/// Counters of one lane's graphs (cumulative since the lane was made).
struct GraphCounts {
  int64_t replays = 0;    ///< trips that launched a cached graph
  int64_t captures = 0;   ///< trips captured and instantiated (a miss)
  int64_t evictions = 0;  ///< graphs destroyed to stay within the capacity
  int64_t dropped = 0;    ///< graphs destroyed because a buffer they name moved (Clear)
};

/// Appends scalars (numbers, enums, pointers: types without padding) to a graph key, byte for
/// byte, in the order given.
class GraphKeyWriter {
 public:
  explicit GraphKeyWriter(std::string* key) : key_(key) {}
  template <class T>
  GraphKeyWriter& Put(const T& value) {
    static_assert(std::is_scalar_v<T>, "graph keys hold scalars only (no padding bytes)");
    key_->append(reinterpret_cast<const char*>(&value), sizeof value);
    return *this;
  }

 private:
  std::string* key_;
};

class GraphCache {
 public:
  /// Keeps at most `capacity` (>= 1) instantiated graphs.
  explicit GraphCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  ~GraphCache() { Clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  /// The graph captured under `key` (now the most recently used), or null.
  cudaGraphExec_t Find(const std::string& key);
  /// Takes ownership of `exec` under `key` (not present), evicting the least recently used
  /// graph when full.
  void Insert(const std::string& key, cudaGraphExec_t exec);
  /// Destroys every graph (a buffer that the keys name was freed or moved).
  void Clear();
  size_t size() const { return map_.size(); }
  GraphCounts& counts() { return counts_; }
  const GraphCounts& counts() const { return counts_; }

 private:
  struct Entry {
    std::string key;
    cudaGraphExec_t exec;
  };
  const size_t capacity_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> map_;
  GraphCounts counts_;
};

}  // namespace attn
