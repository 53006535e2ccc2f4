// The paged KV cache's page pool (DESIGN.md §7): sub-pools per KV layout class,
// created on first use and carved from one memory pool in chunks, behind one
// lock.
//
// Admission is counted in pages: Allocate takes all the pages asked for or none
// and says how many were needed and free. Reference counts let forks share
// pages (copy-on-write is done by the caller, who asks RefCount before writing
// into a page). Memory: a KvMemory of --kv-cache-bytes, host (CPU path) or
// device (GPU paged kernels); the page format is the same in both.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"
#include "kv_cache/sub_pool.h"
#include "kv_cache/kv_memory.h"

namespace attn {

/// Configuration of the page pool.
struct PagePoolOptions {
  int32_t page_tokens = 16;        ///< tokens per page (power of two not required)
  int32_t chunk_pages = 64;        ///< pages carved from the memory pool at a time
  bool poison_free_pages = false;  ///< debug: fill unused and freed pages with NaN
};

/// Usage of one layout class.
struct KvClassStats {
  KvLayoutClass layout;
  int64_t pages_total = 0;
  int64_t pages_used = 0;
  int64_t page_bytes = 0;
};

class PagePool {
 public:
  /// `memory` is not owned and must outlive the pool.
  PagePool(KvMemory *memory, const PagePoolOptions &options);

  /// The sub-pool of `cls`, created on first use (handles stay valid for the
  /// pool's life). Errors: INVALID_ARGUMENT / RESOURCE_EXHAUSTED from
  /// SubPool::Create.
  StatusOr<SubPool *> GetClass(const KvLayoutClass &cls);
  /// All-or-nothing allocation of `n` pages of `sub` into out[0..n).
  /// Errors: RESOURCE_EXHAUSTED naming the class, pages needed and pages free.
  Status Allocate(SubPool *sub, int64_t n, int32_t *out);
  /// Adds one reference to each page.
  void Retain(SubPool *sub, const int32_t *pages, int64_t n);
  /// Drops one reference from each page; returns how many pages became free.
  int64_t Release(SubPool *sub, const int32_t *pages, int64_t n);
  int32_t RefCount(SubPool *sub, int32_t page) const;
  /// Pages `sub` could hand out now.
  int64_t AvailablePages(SubPool *sub) const;

  int32_t page_tokens() const { return options_.page_tokens; }
  uint64_t pool_bytes() const { return memory_->capacity(); }
  uint64_t pool_used_bytes() const { return memory_->used(); }
  /// Usage of every class created so far, ordered by class.
  std::vector<KvClassStats> Stats() const;

 private:
  KvMemory *const memory_;
  const PagePoolOptions options_;
  mutable std::mutex mu_;
  std::map<KvLayoutClass, std::unique_ptr<SubPool>> classes_;
};

}  // namespace attn
