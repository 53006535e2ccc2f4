#include "backends/paged/decode_plan_cache.h"

#include "device/graph_cache.h"

namespace attn {
namespace {

// Every field of the shape PagedDecodePlanFor reads, byte for byte.
std::string ShapeKey(const kernels::PagedDecodeShape& s) {
  std::string key;
  key.reserve(80);
  GraphKeyWriter w(&key);
  w.Put(s.source).Put(s.dtype).Put(s.kv_dtype).Put(s.batch).Put(s.max_q_len).Put(s.max_kv_len);
  w.Put(s.num_heads).Put(s.num_kv_heads).Put(s.head_dim).Put(s.page_tokens).Put(s.scale);
  w.Put(s.return_lse);
  return key;
}

}  // namespace

StatusOr<kernels::PagedDecodePlan> DecodePlanCache::Get(const kernels::PagedDecodeShape& shape) {
  std::string key = ShapeKey(shape);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      return it->second;
    }
  }
  StatusOr<kernels::PagedDecodePlan> plan = kernels::PagedDecodePlanFor(shape, device_);
  std::lock_guard<std::mutex> lock(mu_);
  ++misses_;
  if (!plan.ok()) return plan;
  if (plans_.size() >= kCapacity) plans_.clear();
  plans_.emplace(std::move(key), *plan);
  return plan;
}

int64_t DecodePlanCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t DecodePlanCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace attn
