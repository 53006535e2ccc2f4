// A host memory pool for the paged KV cache on servers without GPU paged
// kernels (DESIGN.md §6, §7): one anonymous mapping of --kv-cache-bytes taken
// at start (pages are committed by the OS on first touch), carved with the same
// RangeAllocator as the device pool. Running out is a RESOURCE_EXHAUSTED
// return, never a crash. Thread-safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "attn/common/status.h"
#include "kv_cache/kv_memory.h"

namespace attn {

class HostPool final : public KvMemory {
 public:
  /// Maps `bytes` (> 0, rounded down to `alignment`, a power of two) of host
  /// memory. Errors: INVALID_ARGUMENT for bytes <= 0; RESOURCE_EXHAUSTED when
  /// the mapping fails.
  static StatusOr<std::unique_ptr<HostPool>> Create(int64_t bytes, uint64_t alignment = 256);
  ~HostPool() override;

  /// Start of the pool; offsets from Allocate are relative to it.
  char *base() const override { return base_; }
  bool on_device() const override { return false; }
  void Poison(char *ptr, uint64_t bytes) override;

 private:
  HostPool(char *base, uint64_t bytes, uint64_t mapped, uint64_t alignment)
      : KvMemory(bytes, alignment), base_(base), mapped_(mapped) {}

  char *base_;
  uint64_t mapped_;
};

}  // namespace attn
