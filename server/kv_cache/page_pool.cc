#include "kv_cache/page_pool.h"

namespace attn {

PagePool::PagePool(KvMemory *memory, const PagePoolOptions &options)
    : memory_(memory), options_(options) {}

StatusOr<SubPool *> PagePool::GetClass(const KvLayoutClass &cls) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(cls);
  if (it != classes_.end()) return it->second.get();
  auto sub = SubPool::Create(cls, options_.page_tokens, options_.chunk_pages, memory_,
                             options_.poison_free_pages);
  if (!sub.ok()) return sub.status();
  SubPool *raw = sub->get();
  classes_[cls] = std::move(*sub);
  return raw;
}

Status PagePool::Allocate(SubPool *sub, int64_t n, int32_t *out) {
  std::lock_guard<std::mutex> lock(mu_);
  return sub->Allocate(n, out);
}

void PagePool::Retain(SubPool *sub, const int32_t *pages, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) sub->Retain(pages[i]);
}

int64_t PagePool::Release(SubPool *sub, const int32_t *pages, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t freed = 0;
  for (int64_t i = 0; i < n; ++i) freed += sub->Release(pages[i]) ? 1 : 0;
  return freed;
}

int32_t PagePool::RefCount(SubPool *sub, int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sub->RefCount(page);
}

int64_t PagePool::AvailablePages(SubPool *sub) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sub->AvailablePages();
}

std::vector<KvClassStats> PagePool::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvClassStats> out;
  for (const auto &[cls, sub] : classes_) {
    out.push_back({cls, sub->pages_total(), sub->pages_used(), sub->page_bytes()});
  }
  return out;
}

}  // namespace attn
