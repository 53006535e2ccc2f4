// The memory the paged KV cache carves its pages from (DESIGN.md §6, §7): one contiguous
// region addressed by byte offsets from base(), in host memory (HostPool, the CPU path) or in
// device memory (DeviceKvMemory, carved once from the GPU pool for the GPU paged kernels).
// The page format does not depend on which. Running out is a RESOURCE_EXHAUSTED return.
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <mutex>

#include "attn/common/status.h"
#include "common/range_allocator.h"

namespace attn {

/// Sub-allocation (a RangeAllocator behind a mutex) is shared; where the region lives is the
/// subclass's.
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  KvMemory(const KvMemory &) = delete;
  KvMemory &operator=(const KvMemory &) = delete;

  /// Start of the region (a device pointer when on_device()); offsets are relative to it.
  virtual char *base() const = 0;
  /// True when base() is device memory (host code must not dereference it).
  virtual bool on_device() const = 0;
  /// Debug poisoning: sets `bytes` bytes at `ptr` (inside the region) to 0xFF, a NaN in every
  /// KV storage dtype (fp32, fp16, bf16 and E4M3 all read all-ones bits as NaN). Synchronous.
  virtual void Poison(char *ptr, uint64_t bytes) = 0;

  /// Reserves `bytes` and returns its offset; RESOURCE_EXHAUSTED with the numbers when full.
  StatusOr<uint64_t> Allocate(uint64_t bytes);
  /// Returns a block obtained from Allocate (unknown offsets are ignored).
  void Free(uint64_t offset);
  uint64_t capacity() const;
  uint64_t used() const;
  uint64_t largest_free() const;

 protected:
  /// A region of `bytes` carved in multiples of `alignment` (a power of two).
  KvMemory(uint64_t bytes, uint64_t alignment) : allocator_(bytes, alignment) {}

 private:
  mutable std::mutex mu_;
  RangeAllocator allocator_;
};

}  // namespace attn
