#include "device/graph_cache.h"

namespace attn {

cudaGraphExec_t GraphCache::Find(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->exec;
}

void GraphCache::Insert(const std::string& key, cudaGraphExec_t exec) {
  while (map_.size() >= capacity_ && !order_.empty()) {
    (void)cudaGraphExecDestroy(order_.back().exec);
    map_.erase(order_.back().key);
    order_.pop_back();
    ++counts_.evictions;
  }
  order_.push_front(Entry{key, exec});
  map_[key] = order_.begin();
}

void GraphCache::Clear() {
  for (Entry& e : order_) (void)cudaGraphExecDestroy(e.exec);
  counts_.dropped += static_cast<int64_t>(order_.size());
  order_.clear();
  map_.clear();
}

}  // namespace attn
