// A host memory pool for the paged KV cache on servers without GPU paged
// kernels (DESIGN.md §6, §7): one anonymous mapping of --kv-cache-bytes taken
// at start (pages are committed by the OS on first touch), carved with the same
// RangeAllocator as the device pool. Running out is a RESOURCE_EXHAUSTED
// return, never a crash. Thread-safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "attn/kernels/status.h"
#include "memory/range_allocator.h"

namespace attn {

class HostPool {
 public:
  /// Maps `bytes` (> 0, rounded down to `alignment`, a power of two) of host
  /// memory. Errors: INVALID_ARGUMENT for bytes <= 0; RESOURCE_EXHAUSTED when
  /// the mapping fails.
  static StatusOr<std::unique_ptr<HostPool>> Create(int64_t bytes, uint64_t alignment = 256);
  ~HostPool();
  HostPool(const HostPool &) = delete;
  HostPool &operator=(const HostPool &) = delete;

  /// Start of the pool; offsets from Allocate are relative to it.
  char *base() const { return base_; }
  /// Reserves `bytes` and returns its offset; RESOURCE_EXHAUSTED with the
  /// numbers when full.
  StatusOr<uint64_t> Allocate(uint64_t bytes);
  /// Returns a block obtained from Allocate (unknown offsets are ignored).
  void Free(uint64_t offset);
  uint64_t capacity() const;
  uint64_t used() const;
  uint64_t largest_free() const;

 private:
  HostPool(char *base, uint64_t bytes, uint64_t mapped, uint64_t alignment)
      : base_(base), mapped_(mapped), allocator_(bytes, alignment) {}

  char *base_;
  uint64_t mapped_;
  mutable std::mutex mu_;
  RangeAllocator allocator_;
};

}  // namespace attn
