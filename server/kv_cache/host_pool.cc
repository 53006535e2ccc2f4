#include "kv_cache/host_pool.h"

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

void HostPool::Poison(char *ptr, uint64_t bytes) { std::memset(ptr, 0xff, bytes); }

}  // namespace attn
