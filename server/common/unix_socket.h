// `--listen unix:PATH`: gRPC over a Unix-domain socket (README "Unix-domain socket").
//
// gRPC itself binds "unix:PATH" addresses, but it unlinks whatever file is at PATH first (a live
// server's socket included) and creates the socket with the process umask. This module adds
// what a deployment needs around that:
//   - PrepareUnixSocket (before binding): a stale socket file (nobody accepts on it: a crashed
//     server's leftover) is removed; a socket some process still accepts on, or a PATH that is
//     not a socket (a regular file, a directory), is refused, so a second server never steals
//     a live one's socket and no other file is ever deleted. The parent directory must exist.
//   - ApplyUnixSocketAccess (after binding): chmod to the requested mode (default 0660) and
//     optionally chown to an owner and/or group (names or numeric ids). The socket is created
//     under umask 0177 (owner-only) so it is never more open than asked, even briefly.
//   - RemoveUnixSocket (clean stop): unlinks PATH if it is still a socket.
// Thread-safety: call from the main thread during start-up/shutdown (umask is process-wide).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>

#include "attn/common/status.h"

namespace attn {

/// True for "unix:PATH" listen addresses (the gRPC URI form; "unix:///abs" is also accepted).
bool IsUnixAddress(const std::string& address);

/// The filesystem path of a "unix:PATH" or "unix:///PATH" address ("" when not a unix address).
std::string UnixSocketPath(const std::string& address);

/// Parses an octal file mode such as "0660" or "660" (digits 0-7 only, value <= 0777).
/// InvalidArgument naming `flag` otherwise.
StatusOr<mode_t> ParseSocketMode(const std::string& text, const std::string& flag);

/// Checks PATH before binding: InvalidArgument for an empty path, a path longer than a
/// sockaddr_un holds (107 bytes), a missing parent directory or a PATH that exists and is not a
/// socket; FailedPrecondition when a process accepts connections on the socket at PATH
/// ("another server is listening"). A stale socket (connect refused) is unlinked, logged.
Status PrepareUnixSocket(const std::string& path);

/// Sets the mode of the socket at PATH and, when non-empty, its owner and group (a user/group
/// name or a decimal id). InvalidArgument for an unknown user/group; PermissionDenied-like
/// failures of chmod/chown come back as FailedPrecondition with strerror.
Status ApplyUnixSocketAccess(const std::string& path, mode_t mode, const std::string& owner,
                             const std::string& group);

/// Unlinks PATH if it is a socket (clean stop). Missing: nothing to do.
void RemoveUnixSocket(const std::string& path);

/// Removes the socket at `path` (RemoveUnixSocket) when destroyed; "" does nothing.
class UnixSocketFile {
 public:
  explicit UnixSocketFile(std::string path) : path_(std::move(path)) {}
  ~UnixSocketFile() {
    if (!path_.empty()) RemoveUnixSocket(path_);
  }
  UnixSocketFile(const UnixSocketFile&) = delete;
  UnixSocketFile& operator=(const UnixSocketFile&) = delete;

 private:
  std::string path_;
};

/// RAII umask: sets `mask` for its lifetime (socket creation), restores the old one after.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask);
  ~ScopedUmask();
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

}  // namespace attn
