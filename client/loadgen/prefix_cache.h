// The mooncake workload's prefix cache: which live sequence holds a request's hash-id prefix, so
// that a later request sharing it forks that sequence instead of prefilling it again.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace attn::loadgen {

/// A bounded, thread-safe LRU map from a request's hash-id prefix to the live sequence that
/// holds it. Entries being forked are pinned and never evicted.
class PrefixCache {
 public:
  explicit PrefixCache(size_t capacity) : capacity_(capacity) {}

  struct Match {
    std::string sequence_id;
    int64_t shared_blocks = 0;
    int64_t context_tokens = 0;  // the parent's context (its hash-backed tokens)
  };

  /// The entry sharing the most leading hash ids with `hashes` (at least one), pinned and
  /// marked most recently used; nullopt if none.
  std::optional<Match> Acquire(const std::vector<int64_t>& hashes);
  /// Unpins an entry returned by Acquire.
  void Release(const std::string& sequence_id);
  /// Adds a sequence under `hashes` (replacing an entry with the same hashes) and returns the
  /// sequence ids the caller must release: the replaced entry, and least recently used unpinned
  /// entries beyond the capacity.
  std::vector<std::string> Insert(const std::vector<int64_t>& hashes,
                                  const std::string& sequence_id, int64_t context_tokens);
  /// Removes every entry and returns their sequence ids.
  std::vector<std::string> Drain();
  size_t size() const;

 private:
  struct Entry {
    std::vector<int64_t> hashes;
    std::string sequence_id;
    int64_t context_tokens = 0;
    int pins = 0;
  };
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace attn::loadgen
