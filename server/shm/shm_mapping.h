// One client-created POSIX shared-memory object mapped into the server (issue 18,
// sequence.proto SharedMemoryLeaseRequest): opened by name with shm_open(3) (O_RDWR | O_CLOEXEC,
// never O_CREAT: the client creates, sizes and unlinks it), checked (a regular file of at least
// the registered size), its first `bytes` mapped MAP_SHARED read-write, and guarded against the
// client shrinking it later (fault_guard.h). The mapping lives as long as this object.
// Thread-safety: immutable after Open except the broken flag (atomic); data() may be read and
// written from any thread while the object lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attn/common/status.h"

namespace attn::shm {

/// Longest object name after the leading "/".
inline constexpr size_t kMaxShmNameChars = 200;

/// OK when `name` is "/" followed by 1..kMaxShmNameChars characters of [A-Za-z0-9._-] and is
/// neither "/." nor "/.." (those name directories). Errors: INVALID_ARGUMENT naming the rule
/// (the name is echoed cut to a bounded, UTF-8-safe length).
Status ValidateShmName(const std::string &name);

class ShmMapping {
 public:
  /// Opens `name` (valid: ValidateShmName) and maps its first `bytes` (>= 1) bytes.
  /// Errors: NOT_FOUND (no such object), PERMISSION_DENIED (the server may not open it
  /// read-write), INVALID_ARGUMENT (not a regular file, or smaller than `bytes`: both sizes
  /// named), RESOURCE_EXHAUSTED (out of file descriptors, address space, or guard slots),
  /// INTERNAL (another failure, errno named). Nothing stays open or mapped on error.
  static StatusOr<std::unique_ptr<ShmMapping>> Open(const std::string &name, int64_t bytes);
  ~ShmMapping();  ///< unguards and unmaps
  ShmMapping(const ShmMapping &) = delete;
  ShmMapping &operator=(const ShmMapping &) = delete;

  uint8_t *data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  const std::string &name() const { return name_; }
  /// True once the object shrank under a touched page: the mapping now holds zero pages,
  /// private to the server, and nothing read from it since the fault can be trusted.
  bool broken() const;

 private:
  ShmMapping(std::string name, uint8_t *data, int64_t bytes, int slot)
      : name_(std::move(name)), data_(data), bytes_(bytes), slot_(slot) {}

  const std::string name_;
  uint8_t *const data_;
  const int64_t bytes_;
  const int slot_;  // fault_guard.h slot
};

}  // namespace attn::shm
