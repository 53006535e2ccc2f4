#include "common/range_allocator.h"

#include <string>

namespace attn {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  if (capacity_ > 0) free_[0] = capacity_;
}

uint64_t RangeAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [off, size] : free_) best = size > best ? size : best;
  return best;
}

StatusOr<uint64_t> RangeAllocator::Allocate(uint64_t bytes) {
  uint64_t need = bytes == 0 ? alignment_ : bytes;
  if (need > capacity_) {
    return ResourceExhausted("device pool: " + std::to_string(bytes) +
                             " bytes requested exceeds the pool capacity of " +
                             std::to_string(capacity_) + " bytes");
  }
  need = (need + alignment_ - 1) / alignment_ * alignment_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[offset + need] = rest;
    allocated_[offset] = need;
    used_ += need;
    return offset;
  }
  return ResourceExhausted("device pool: " + std::to_string(bytes) + " bytes requested, " +
                           std::to_string(capacity_ - used_) + " bytes free of " +
                           std::to_string(capacity_) + ", largest free range " +
                           std::to_string(largest_free()) + " bytes");
}

bool RangeAllocator::Free(uint64_t offset) {
  auto a = allocated_.find(offset);
  if (a == allocated_.end()) return false;
  uint64_t start = offset;
  uint64_t size = a->second;
  allocated_.erase(a);
  used_ -= size;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
  return true;
}

}  // namespace attn
