// KV cache memory on the GPU (DESIGN.md §6, §7): one block of --kv-cache-bytes carved from the
// server's device pool at start and sub-allocated in chunks by the page pool, so pages never
// cost a cudaMalloc. Thread-safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "attn/common/status.h"
#include "device/device_pool.h"
#include "kv_cache/kv_memory.h"

namespace attn {

class DeviceKvMemory final : public KvMemory {
 public:
  /// Takes `bytes` (> 0) from `pool` (which must outlive this). Errors: INVALID_ARGUMENT for
  /// bytes <= 0; RESOURCE_EXHAUSTED with the numbers when the pool cannot hold it.
  static StatusOr<std::unique_ptr<DeviceKvMemory>> Create(DevicePool *pool, int64_t bytes,
                                                          uint64_t alignment = 256);

  char *base() const override { return static_cast<char *>(block_.data()); }
  bool on_device() const override { return true; }
  /// cudaMemset to 0xFF and wait for it (debug only).
  void Poison(char *ptr, uint64_t bytes) override;

 private:
  DeviceKvMemory(DeviceAllocation block, uint64_t alignment)
      : KvMemory(block.bytes(), alignment), block_(std::move(block)) {}

  DeviceAllocation block_;
};

}  // namespace attn
