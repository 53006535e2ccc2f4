#include "shm/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/client_text.h"
#include "shm/fault_guard.h"

namespace attn::shm {
namespace {

bool NameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

std::string Quoted(const std::string &name) { return "\"" + EchoClientText(name) + "\""; }

std::string Errno(int e) { return std::string(std::strerror(e)); }

/// The status of a failed shm_open of `name` with errno `e`.
Status OpenError(const std::string &name, int e) {
  const std::string what = "shared-memory object " + Quoted(name);
  switch (e) {
    case ENOENT:
      return NotFound("no " + what + " (create it with shm_open(O_CREAT) and ftruncate first)");
    case EACCES:
    case EPERM:
      return Status(StatusCode::kPermissionDenied,
                    "the server may not open " + what + " read-write (" + Errno(e) +
                        "): create it with a mode that lets the server's user read and write");
    case EMFILE:
    case ENFILE:
      return ResourceExhausted("cannot open " + what + ": " + Errno(e));
    case EISDIR:
    case EINVAL:
      return InvalidArgument(what + " is not a regular file (" + Errno(e) + ")");
    default:
      return Internal("shm_open of " + what + " failed: " + Errno(e));
  }
}

}  // namespace

Status ValidateShmName(const std::string &name) {
  bool ok = name.size() >= 2 && name.size() <= kMaxShmNameChars + 1 && name[0] == '/';
  for (size_t i = 1; ok && i < name.size(); ++i) ok = NameChar(name[i]);
  if (ok && (name == "/." || name == "/..")) ok = false;
  if (ok) return Status::Ok();
  return InvalidArgument("name: expected \"/\" followed by 1.." +
                         std::to_string(kMaxShmNameChars) +
                         " characters of [A-Za-z0-9._-] (not \".\" or \"..\"), got " +
                         Quoted(name) + " (" + std::to_string(name.size()) + " bytes)");
}

StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Open(const std::string &name, int64_t bytes) {
  ATTN_RETURN_IF_ERROR(ValidateShmName(name));
  if (bytes < 1) return InvalidArgument("bytes: expected >= 1, got " + std::to_string(bytes));
  ATTN_RETURN_IF_ERROR(InstallFaultGuard());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return OpenError(name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return Internal("fstat of shared-memory object " + Quoted(name) + " failed: " + Errno(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgument("shared-memory object " + Quoted(name) + " is not a regular file");
  }
  if (st.st_size < bytes) {
    close(fd);
    return InvalidArgument("shared-memory object " + Quoted(name) + " has " +
                           std::to_string(st.st_size) + " bytes, fewer than the " +
                           std::to_string(bytes) + " requested (ftruncate it first)");
  }
  void *p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  close(fd);  // the mapping keeps the object
  if (p == MAP_FAILED) {
    return ResourceExhausted("cannot map " + std::to_string(bytes) +
                             " bytes of shared-memory object " + Quoted(name) + ": " +
                             Errno(map_errno));
  }
  const int slot = GuardMapping(p, static_cast<size_t>(bytes));
  if (slot < 0) {
    munmap(p, static_cast<size_t>(bytes));
    return ResourceExhausted("all " + std::to_string(kMaxGuardedMappings) +
                             " shared-memory guard slots of this process are in use");
  }
  return std::unique_ptr<ShmMapping>(
      new ShmMapping(name, static_cast<uint8_t *>(p), bytes, slot));
}

ShmMapping::~ShmMapping() {
  UnguardMapping(slot_);
  munmap(data_, static_cast<size_t>(bytes_));
}

bool ShmMapping::broken() const { return MappingBroken(slot_); }

}  // namespace attn::shm
