// First-fit allocator over an abstract byte range [0, capacity): the bookkeeping of the device
// memory pool (DESIGN.md §6), kept free of CUDA so it is unit-tested on any machine.
// Allocate and Free are O(log n) in the number of free ranges; adjacent free ranges coalesce.
// Thread-safety: not thread-safe; DevicePool serialises access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "attn/common/status.h"

namespace attn {

class RangeAllocator {
 public:
  /// `alignment` must be a power of two; every offset returned is a multiple of it.
  RangeAllocator(uint64_t capacity, uint64_t alignment);

  /// Reserves `bytes` (rounded up to the alignment; 0 becomes one alignment unit) and returns
  /// its offset. RESOURCE_EXHAUSTED naming the bytes asked, free bytes and largest free range.
  StatusOr<uint64_t> Allocate(uint64_t bytes);
  /// Returns a range obtained from Allocate. Offsets not allocated are ignored (returns false).
  bool Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t largest_free() const;
  size_t free_ranges() const { return free_.size(); }

 private:
  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;       // offset -> size
  std::map<uint64_t, uint64_t> allocated_;  // offset -> size
};

}  // namespace attn
