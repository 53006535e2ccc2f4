#include "memory/host_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <string>

namespace attn {

StatusOr<std::unique_ptr<HostPool>> HostPool::Create(int64_t bytes, uint64_t alignment) {
  if (bytes <= 0) {
    return InvalidArgument("--kv-cache-bytes must be > 0, got " + std::to_string(bytes));
  }
  const uint64_t size = static_cast<uint64_t>(bytes);
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    return ResourceExhausted("host KV pool: cannot map " + std::to_string(size) + " bytes");
  }
  return std::unique_ptr<HostPool>(new HostPool(static_cast<char *>(p), size, size, alignment));
}

HostPool::~HostPool() { munmap(base_, mapped_); }

StatusOr<uint64_t> HostPool::Allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.Allocate(bytes);
}

void HostPool::Free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  allocator_.Free(offset);
}

uint64_t HostPool::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.capacity();
}

uint64_t HostPool::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.used();
}

uint64_t HostPool::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.largest_free();
}

void HostPool::Poison(char *ptr, uint64_t bytes) { std::memset(ptr, 0xff, bytes); }

}  // namespace attn
