#include "kv_cache/kv_memory.h"

namespace attn {

StatusOr<uint64_t> KvMemory::Allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.Allocate(bytes);
}

void KvMemory::Free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  allocator_.Free(offset);
}

uint64_t KvMemory::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.capacity();
}

uint64_t KvMemory::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.used();
}

uint64_t KvMemory::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.largest_free();
}

}  // namespace attn
