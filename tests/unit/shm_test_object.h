// A POSIX shm object as a co-located client makes one (shm_open O_CREAT | O_EXCL, ftruncate,
// its own MAP_SHARED view), for the shared-memory unit tests; unlinked on destruction.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace attn::shm::testing {

class ShmObject {
 public:
  /// A fresh object of `bytes` bytes (unique name per process and call), mapped read-write.
  explicit ShmObject(int64_t bytes) : bytes_(bytes) {
    static std::atomic<int> counter{0};
    name_ = "/attn-unit-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ >= 0 && ftruncate(fd_, bytes) == 0) {
      void *p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                     fd_, 0);
      if (p != MAP_FAILED) view_ = static_cast<uint8_t *>(p);
    }
  }
  ~ShmObject() {
    if (view_ != nullptr) munmap(view_, static_cast<size_t>(bytes_));
    if (fd_ >= 0) close(fd_);
    shm_unlink(name_.c_str());
  }
  ShmObject(const ShmObject &) = delete;
  ShmObject &operator=(const ShmObject &) = delete;

  bool ok() const { return view_ != nullptr; }
  const std::string &name() const { return name_; }
  /// The client's own view of the bytes (nullptr if creation failed).
  uint8_t *view() const { return view_; }
  /// The hostile client's move: shrink the object (the client's view is dropped first).
  bool Truncate(int64_t bytes) {
    if (view_ != nullptr) munmap(view_, static_cast<size_t>(bytes_));
    view_ = nullptr;
    return ftruncate(fd_, bytes) == 0;
  }

 private:
  std::string name_;
  int64_t bytes_;
  int fd_ = -1;
  uint8_t *view_ = nullptr;
};

}  // namespace attn::shm::testing
