// The server's device memory pool (DESIGN.md §6): one cudaMalloc at start of a fraction of the
// device's free memory; request buffers and workspaces are carved from it, so the request path
// never calls cudaMalloc/cudaFree. Running out is a RESOURCE_EXHAUSTED return, not a crash.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "attn/common/status.h"
#include "common/range_allocator.h"

namespace attn {

class DevicePool;

/// A block of pool memory; returns itself to the pool on destruction. Move-only.
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  DeviceAllocation(DevicePool* pool, uint64_t offset, void* data, uint64_t bytes)
      : pool_(pool), offset_(offset), data_(data), bytes_(bytes) {}
  DeviceAllocation(DeviceAllocation&& o) noexcept { *this = std::move(o); }
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  ~DeviceAllocation() { Reset(); }

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  void Reset();

 private:
  DevicePool* pool_ = nullptr;
  uint64_t offset_ = 0;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class DevicePool {
 public:
  /// Reserves floor(fraction × free memory of `device`) bytes (fraction in (0, 1]).
  /// Errors: INVALID_ARGUMENT for a bad fraction; UNAVAILABLE/INTERNAL for CUDA failures.
  static StatusOr<std::unique_ptr<DevicePool>> Create(int device, double fraction);
  ~DevicePool();

  /// A 256-byte aligned block of `bytes`. RESOURCE_EXHAUSTED with the numbers when full.
  StatusOr<DeviceAllocation> Allocate(uint64_t bytes);
  uint64_t capacity() const;
  uint64_t used() const;

 private:
  friend class DeviceAllocation;
  DevicePool(void* base, uint64_t bytes) : base_(base), allocator_(bytes, 256) {}
  void Release(uint64_t offset);

  void* base_;
  mutable std::mutex mu_;
  RangeAllocator allocator_;
};

}  // namespace attn
