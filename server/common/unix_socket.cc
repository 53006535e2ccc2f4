#include "common/unix_socket.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace attn {
namespace {

constexpr const char kPrefix[] = "unix:";

bool AllDigits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// A user name or decimal uid → uid; false when unknown.
bool LookupUser(const std::string& name, uid_t* uid) {
  if (AllDigits(name)) {
    *uid = static_cast<uid_t>(std::strtoul(name.c_str(), nullptr, 10));
    return true;
  }
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found) return false;
  *uid = found->pw_uid;
  return true;
}

// A group name or decimal gid → gid; false when unknown.
bool LookupGroup(const std::string& name, gid_t* gid) {
  if (AllDigits(name)) {
    *gid = static_cast<gid_t>(std::strtoul(name.c_str(), nullptr, 10));
    return true;
  }
  std::vector<char> buf(16384);
  group gr{};
  group* found = nullptr;
  if (getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || !found) return false;
  *gid = found->gr_gid;
  return true;
}

// connect() to the socket at `path`: 0 when some process accepts on it, else its errno
// (ECONNREFUSED: nobody does, the file is stale).
int ConnectErrno(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

bool IsUnixAddress(const std::string& address) { return address.rfind(kPrefix, 0) == 0; }

std::string UnixSocketPath(const std::string& address) {
  if (!IsUnixAddress(address)) return "";
  std::string rest = address.substr(sizeof(kPrefix) - 1);
  if (rest.rfind("//", 0) == 0) rest = rest.substr(2);  // unix:///abs/path → /abs/path
  return rest;
}

StatusOr<mode_t> ParseSocketMode(const std::string& text, const std::string& flag) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos) {
    return InvalidArgument(flag +
                           ": expected an octal mode such as 0660 (digits 0-7, at most "
                           "0777), got \"" +
                           text + "\"");
  }
  const unsigned long value = std::strtoul(text.c_str(), nullptr, 8);
  if (value > 0777) {
    return InvalidArgument(flag + ": mode " + text + " is over 0777 (no setuid/sticky bits)");
  }
  return static_cast<mode_t>(value);
}

Status PrepareUnixSocket(const std::string& path) {
  if (path.empty()) return InvalidArgument("--listen unix:PATH: the path is empty");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return InvalidArgument("--listen unix:" + path + ": path is " + std::to_string(path.size()) +
                           " bytes, a Unix socket path holds at most " +
                           std::to_string(sizeof(sockaddr_un{}.sun_path) - 1));
  }
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument("--listen unix:" + path + ": directory " + dir + " does not exist");
  }
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return InvalidArgument("--listen unix:" + path + ": " + std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return InvalidArgument("--listen unix:" + path +
                           ": the path exists and is not a socket; refusing to replace it");
  }
  const int err = ConnectErrno(path);
  if (err == 0) {
    return FailedPrecondition("--listen unix:" + path +
                              ": another server is listening on this socket");
  }
  if (err != ECONNREFUSED) {  // e.g. EACCES: cannot tell whether it is live; leave it alone
    return FailedPrecondition("--listen unix:" + path + ": cannot check the existing socket (" +
                              std::strerror(err) + "); remove it or pick another path");
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return FailedPrecondition("--listen unix:" + path +
                              ": cannot remove the stale socket: " + std::strerror(errno));
  }
  spdlog::warn("--listen unix:{}: removed a stale socket file (nobody was listening on it)", path);
  return Status::Ok();
}

Status ApplyUnixSocketAccess(const std::string& path, mode_t mode, const std::string& owner,
                             const std::string& group) {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  if (!owner.empty() && !LookupUser(owner, &uid)) {
    return InvalidArgument("--unix-socket-owner: no such user \"" + owner + "\"");
  }
  if (!group.empty() && !LookupGroup(group, &gid)) {
    return InvalidArgument("--unix-socket-group: no such group \"" + group + "\"");
  }
  if ((!owner.empty() || !group.empty()) && ::chown(path.c_str(), uid, gid) != 0) {
    return FailedPrecondition("--unix-socket-owner/--unix-socket-group: chown " + path + ": " +
                              std::strerror(errno));
  }
  if (::chmod(path.c_str(), mode) != 0) {
    return FailedPrecondition("--unix-socket-mode: chmod " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

void RemoveUnixSocket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && ::unlink(path.c_str()) != 0) {
    spdlog::warn("could not remove the socket {}: {}", path, std::strerror(errno));
  }
}

ScopedUmask::ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
ScopedUmask::~ScopedUmask() { ::umask(old_); }

}  // namespace attn
