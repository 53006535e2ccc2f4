// The decode plans of one GPU (issue 18 item 4): kernels::PagedDecodePlanFor asks the CUDA
// runtime for the device's limits, sets the decode kernel's shared-memory attribute and queries
// its occupancy on every call, about ten runtime calls on the host path of every decode step;
// a plan is a value type that depends only on its shape and device ("cache it by shape",
// attn/kernels/paged_decode.h), so the GPU paged backend keeps the plans it made here.
// Shapes come in bands (max_kv_len rounded to 64 keys, batch sizes), so a workload uses a few
// dozen; the cache holds at most kCapacity and is emptied when full (a workload re-fills it with
// the ones it uses). Planning errors are returned, never kept.
// CUDA builds only. Thread-safety: thread-safe (one mutex; a miss plans outside it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attn/common/status.h"
#include "attn/kernels/paged_decode.h"

namespace attn {

class DecodePlanCache {
 public:
  static constexpr size_t kCapacity = 1024;
  /// Plans for CUDA device `device`.
  explicit DecodePlanCache(int device) : device_(device) {}
  int device() const { return device_; }
  /// The plan of `shape` on the device: kept from an earlier call, else
  /// kernels::PagedDecodePlanFor(shape, device) (its errors unchanged, not kept).
  StatusOr<kernels::PagedDecodePlan> Get(const kernels::PagedDecodeShape& shape);
  /// Calls answered from the cache, and calls that planned (tests, the shutdown log).
  int64_t hits() const;
  int64_t misses() const;

 private:
  const int device_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, kernels::PagedDecodePlan> plans_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace attn
