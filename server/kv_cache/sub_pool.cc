#include "kv_cache/sub_pool.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "attn/kernels/paged_kv_cpu.h"

namespace attn {

bool KvLayoutClass::operator<(const KvLayoutClass &o) const {
  return std::make_tuple(num_kv_heads, head_dim, static_cast<int>(kv_dtype)) <
         std::make_tuple(o.num_kv_heads, o.head_dim, static_cast<int>(o.kv_dtype));
}

bool KvLayoutClass::operator==(const KvLayoutClass &o) const {
  return num_kv_heads == o.num_kv_heads && head_dim == o.head_dim && kv_dtype == o.kv_dtype;
}

std::string KvLayoutClass::ToString() const {
  return "K=" + std::to_string(num_kv_heads) + " H=" + std::to_string(head_dim) + " " +
         kernels::DTypeName(kv_dtype);
}

SubPool::SubPool(const KvLayoutClass &cls, int32_t page_tokens, int64_t chunk_pages,
                 KvMemory *memory, bool poison)
    : cls_(cls), memory_(memory), poison_(poison), chunk_pages_(chunk_pages) {
  view_.page_tokens = page_tokens;
  view_.num_kv_heads = cls.num_kv_heads;
  view_.head_dim = cls.head_dim;
  view_.kv_dtype = cls.kv_dtype;
  page_bytes_ = kernels::PageBytes(view_);
  view_.num_pages = static_cast<int64_t>(memory->capacity()) / page_bytes_;
  view_.k_pages = memory->base();
  view_.v_pages = memory->base() + chunk_pages_ * page_bytes_;
}

StatusOr<std::unique_ptr<SubPool>> SubPool::Create(const KvLayoutClass &cls, int32_t page_tokens,
                                                   int32_t chunk_pages, KvMemory *memory,
                                                   bool poison) {
  if (cls.num_kv_heads <= 0 || cls.head_dim <= 0 || page_tokens <= 0 || chunk_pages <= 0 ||
      memory == nullptr) {
    return InvalidArgument("KV sub-pool: bad geometry for " + cls.ToString());
  }
  const int64_t page_bytes = static_cast<int64_t>(cls.num_kv_heads) * page_tokens * cls.head_dim *
                             kernels::DTypeSize(cls.kv_dtype);
  const int64_t capacity_pages = static_cast<int64_t>(memory->capacity()) / page_bytes;
  if (capacity_pages > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("KV sub-pool " + cls.ToString() + ": the pool holds " +
                           std::to_string(capacity_pages) +
                           " pages, more than int32 page ids address");
  }
  // A chunk takes (2n + 1) pages of bytes; shrink n for small pools.
  const int64_t n = std::min<int64_t>(chunk_pages, (capacity_pages - 1) / 2);
  if (n < 1) {
    return ResourceExhausted("KV cache: the pool (" + std::to_string(memory->capacity()) +
                             " bytes) cannot hold one page of " + cls.ToString() + " (" +
                             std::to_string(page_bytes) + " bytes for K and as many for V)");
  }
  return std::unique_ptr<SubPool>(new SubPool(cls, page_tokens, n, memory, poison));
}

SubPool::~SubPool() {
  for (auto &[first, c] : chunks_) memory_->Free(c->offset);
}

int64_t SubPool::AvailablePages() const {
  const int64_t chunk_bytes = (2 * chunk_pages_ + 1) * page_bytes_;
  const int64_t free_bytes = static_cast<int64_t>(memory_->capacity() - memory_->used());
  return (pages_total_ - pages_used_) + free_bytes / chunk_bytes * chunk_pages_;
}

Status SubPool::AddChunk() {
  const uint64_t bytes = static_cast<uint64_t>((2 * chunk_pages_ + 1) * page_bytes_);
  StatusOr<uint64_t> off = memory_->Allocate(bytes);
  if (!off.ok()) return off.status();
  const uint64_t pb = static_cast<uint64_t>(page_bytes_);
  const uint64_t aligned = (*off + pb - 1) / pb * pb;
  auto c = std::make_unique<Chunk>();
  c->offset = *off;
  c->first_page = static_cast<int32_t>(aligned / pb);
  c->refs.assign(static_cast<size_t>(chunk_pages_), 0);
  c->free_stack.reserve(static_cast<size_t>(chunk_pages_));
  for (int64_t i = chunk_pages_ - 1; i >= 0; --i) {
    c->free_stack.push_back(static_cast<int32_t>(i));
    if (poison_) PoisonPage(c->first_page + static_cast<int32_t>(i));
  }
  Chunk *raw = c.get();
  chunks_[c->first_page] = std::move(c);
  MarkNonfull(raw);
  pages_total_ += chunk_pages_;
  return Status::Ok();
}

void SubPool::PoisonPage(int32_t page) {
  const int64_t at = static_cast<int64_t>(page) * page_bytes_;
  memory_->Poison(static_cast<char *>(view_.k_pages) + at, static_cast<uint64_t>(page_bytes_));
  memory_->Poison(static_cast<char *>(view_.v_pages) + at, static_cast<uint64_t>(page_bytes_));
}

void SubPool::RemoveChunk(Chunk *c) {
  MarkFull(c);
  pages_total_ -= chunk_pages_;
  memory_->Free(c->offset);
  chunks_.erase(c->first_page);
}

void SubPool::MarkNonfull(Chunk *c) {
  if (c->nonfull_index >= 0) return;
  c->nonfull_index = static_cast<int64_t>(nonfull_.size());
  nonfull_.push_back(c);
}

void SubPool::MarkFull(Chunk *c) {
  if (c->nonfull_index < 0) return;
  Chunk *last = nonfull_.back();
  nonfull_[static_cast<size_t>(c->nonfull_index)] = last;
  last->nonfull_index = c->nonfull_index;
  nonfull_.pop_back();
  c->nonfull_index = -1;
}

SubPool::Chunk *SubPool::ChunkOf(int32_t page) const {
  auto it = chunks_.upper_bound(page);
  if (it == chunks_.begin()) return nullptr;
  --it;
  Chunk *c = it->second.get();
  if (page - c->first_page >= chunk_pages_) return nullptr;
  return c;
}

Status SubPool::Allocate(int64_t n, int32_t *out) {
  if (n <= 0) return Status::Ok();
  const int64_t free_carved = pages_total_ - pages_used_;
  // Carve the chunks still needed; on failure give back the chunks carved here
  // (all free).
  std::vector<int32_t> added;
  for (int64_t have = free_carved; have < n; have += chunk_pages_) {
    Status s = AddChunk();
    if (!s.ok()) {
      for (int32_t first : added) RemoveChunk(chunks_.at(first).get());
      const int64_t chunk_bytes = (2 * chunk_pages_ + 1) * page_bytes_;
      return ResourceExhausted(
          "KV cache full (layout class " + cls_.ToString() + ", page_tokens " +
          std::to_string(view_.page_tokens) + "): need " + std::to_string(n) + " pages, " +
          std::to_string(AvailablePages()) + " free; pages of this class are carved " +
          std::to_string(chunk_pages_) + " at a time (" + std::to_string(chunk_bytes) +
          " bytes, --kv-chunk-pages) and the pool's largest free block is " +
          std::to_string(memory_->largest_free()) + " bytes");
    }
    // The chunk just added is the last one marked nonfull.
    added.push_back(nonfull_.back()->first_page);
  }
  for (int64_t i = 0; i < n; ++i) {
    Chunk *c = nonfull_.back();
    const int32_t local = c->free_stack.back();
    c->free_stack.pop_back();
    if (c->free_stack.empty()) MarkFull(c);
    c->refs[static_cast<size_t>(local)] = 1;
    out[i] = c->first_page + local;
  }
  pages_used_ += n;
  return Status::Ok();
}

void SubPool::Retain(int32_t page) {
  Chunk *c = ChunkOf(page);
  if (c != nullptr && c->refs[static_cast<size_t>(page - c->first_page)] > 0) {
    ++c->refs[static_cast<size_t>(page - c->first_page)];
  }
}

bool SubPool::Release(int32_t page) {
  Chunk *c = ChunkOf(page);
  if (c == nullptr) return false;
  int32_t &ref = c->refs[static_cast<size_t>(page - c->first_page)];
  if (ref <= 0) return false;
  if (--ref > 0) return false;
  if (poison_) PoisonPage(page);
  c->free_stack.push_back(page - c->first_page);
  MarkNonfull(c);
  --pages_used_;
  if (static_cast<int64_t>(c->free_stack.size()) == chunk_pages_) RemoveChunk(c);
  return true;
}

int32_t SubPool::RefCount(int32_t page) const {
  Chunk *c = ChunkOf(page);
  return c == nullptr ? 0 : c->refs[static_cast<size_t>(page - c->first_page)];
}

}  // namespace attn
