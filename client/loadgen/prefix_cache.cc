#include "loadgen/prefix_cache.h"

#include "loadgen/mooncake_trace.h"

namespace attn::loadgen {

std::optional<PrefixCache::Match> PrefixCache::Acquire(const std::vector<int64_t>& hashes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto best = entries_.end();
  int64_t best_shared = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t shared = SharedBlocks(it->hashes, hashes);
    if (shared > best_shared) {
      best_shared = shared;
      best = it;
    }
  }
  if (best == entries_.end()) return std::nullopt;
  ++best->pins;
  entries_.splice(entries_.begin(), entries_, best);
  return Match{best->sequence_id, best_shared, best->context_tokens};
}

void PrefixCache::Release(const std::string& sequence_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& e : entries_) {
    if (e.sequence_id == sequence_id && e.pins > 0) {
      --e.pins;
      return;
    }
  }
}

std::vector<std::string> PrefixCache::Insert(const std::vector<int64_t>& hashes,
                                             const std::string& sequence_id,
                                             int64_t context_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> released;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->hashes == hashes && it->pins == 0) {
      released.push_back(it->sequence_id);
      entries_.erase(it);
      break;
    }
  }
  entries_.push_front(Entry{hashes, sequence_id, context_tokens, 0});
  for (auto it = entries_.end(); entries_.size() > capacity_ && it != entries_.begin();) {
    --it;
    if (it->pins == 0) {
      released.push_back(it->sequence_id);
      it = entries_.erase(it);
    }
  }
  return released;
}

std::vector<std::string> PrefixCache::Drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& e : entries_) ids.push_back(e.sequence_id);
  entries_.clear();
  return ids;
}

size_t PrefixCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace attn::loadgen
