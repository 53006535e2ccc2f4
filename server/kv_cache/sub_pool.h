// One sub-pool of the paged KV cache (DESIGN.md §7): the pages of one KV layout
// class (num_kv_heads, head_dim, kv dtype), carved from the KV memory pool in
// chunks.
//
// Page format: kernels/include/attn/kernels/paged_kv.h. Page ids index two
// arrays of identical shape [num_pages, K, page_tokens, H] based at the memory
// pool:
//   K of page p at  base + p * page_bytes
//   V of page p at  base + (p + chunk_pages) * page_bytes
// A chunk of n = chunk_pages pages is one pool block of (2n + 1) page_bytes
// whose start is rounded up to a multiple of page_bytes: its K pages come
// first, then its V pages, so every chunk honours the same (k_pages, v_pages)
// pair and one PagedKvPool view covers them all. Page ids are int32 (the pool
// must hold fewer than 2^31 pages of this class).
//
// Free pages: one LIFO stack per chunk plus a list of chunks with free pages,
// so allocation and freeing are O(1); a chunk whose pages are all free goes
// back to the memory pool. Reference counts: a page is allocated with count 1;
// forks Retain it, owners Release it; at zero the page is free again (and
// poisoned with NaN when `poison` is set). Thread-safety: none; PagePool
// serialises every call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"
#include "kv_cache/kv_memory.h"

namespace attn {

/// What pages of one sub-pool share: the K/V geometry and storage dtype.
struct KvLayoutClass {
  int32_t num_kv_heads = 0;  ///< K
  int32_t head_dim = 0;      ///< H
  kernels::DType kv_dtype = kernels::DType::kBFloat16;

  bool operator<(const KvLayoutClass &o) const;
  bool operator==(const KvLayoutClass &o) const;
  /// "K=8 H=128 bfloat16".
  std::string ToString() const;
};

class SubPool {
 public:
  /// A sub-pool of `cls` with pages of `page_tokens` tokens, carving
  /// `chunk_pages` pages at a time (fewer when the memory pool is small) from
  /// `memory` (not owned; outlives this). Errors: INVALID_ARGUMENT for bad
  /// geometry or when the pool cannot hold one chunk.
  static StatusOr<std::unique_ptr<SubPool>> Create(const KvLayoutClass &cls, int32_t page_tokens,
                                                   int32_t chunk_pages, KvMemory *memory,
                                                   bool poison);
  ~SubPool();  ///< returns every chunk to the memory pool
  SubPool(const SubPool &) = delete;
  SubPool &operator=(const SubPool &) = delete;

  const KvLayoutClass &layout() const { return cls_; }
  /// The page arrays for kernels (host or device pointers, as the memory is);
  /// valid for the sub-pool's lifetime.
  const kernels::PagedKvPool &view() const { return view_; }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t chunk_pages() const { return chunk_pages_; }
  int64_t pages_total() const { return pages_total_; }  ///< carved pages
  int64_t pages_used() const { return pages_used_; }    ///< pages with a count > 0
  /// Pages that Allocate can hand out now: free carved pages plus whole chunks
  /// that fit in the memory pool's free bytes (an upper bound when the pool is
  /// fragmented).
  int64_t AvailablePages() const;

  /// Takes `n` pages (count 1 each) into out[0..n). All or nothing:
  /// RESOURCE_EXHAUSTED with "need n pages, m free" when they cannot all be had
  /// (nothing changes then).
  Status Allocate(int64_t n, int32_t *out);
  /// Adds a reference to an allocated page (a fork shares it).
  void Retain(int32_t page);
  /// Drops a reference; returns true when the page became free.
  bool Release(int32_t page);
  /// The page's reference count (0 when free or unknown).
  int32_t RefCount(int32_t page) const;

 private:
  struct Chunk {
    uint64_t offset = 0;              ///< block offset in the memory pool
    int32_t first_page = 0;           ///< page id of local page 0
    std::vector<int32_t> refs;        ///< (n) reference counts
    std::vector<int32_t> free_stack;  ///< local indices of free pages (LIFO)
    int64_t nonfull_index = -1;       ///< position in nonfull_, -1 when full
  };

  SubPool(const KvLayoutClass &cls, int32_t page_tokens, int64_t chunk_pages, KvMemory *memory,
          bool poison);
  Status AddChunk();
  void RemoveChunk(Chunk *c);
  Chunk *ChunkOf(int32_t page) const;
  void MarkNonfull(Chunk *c);
  void MarkFull(Chunk *c);
  /// Fills the K and V bytes of `page` with NaN (debug poisoning).
  void PoisonPage(int32_t page);

  const KvLayoutClass cls_;
  KvMemory *const memory_;
  const bool poison_;
  const int64_t chunk_pages_;
  int64_t page_bytes_ = 0;
  kernels::PagedKvPool view_;
  std::map<int32_t, std::unique_ptr<Chunk>> chunks_;  ///< by first page
  std::vector<Chunk *> nonfull_;                      ///< chunks with a free page
  int64_t pages_total_ = 0;
  int64_t pages_used_ = 0;
};

}  // namespace attn
