// common/unix_socket.h: --listen unix:PATH address parsing, the mode flag, the stale / live /
// non-socket checks before binding, chmod/chgrp after, removal at stop.
#include "common/unix_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace attn {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/attn-unix-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A socket bound at `path`; listening when `listen` (else a stale file once closed).
int BindSocket(const std::string& path, bool listen) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (listen) EXPECT_EQ(::listen(fd, 4), 0);
  return fd;
}

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

TEST(UnixSocket, Addresses) {
  EXPECT_TRUE(IsUnixAddress("unix:/run/a.sock"));
  EXPECT_FALSE(IsUnixAddress("127.0.0.1:50051"));
  EXPECT_FALSE(IsUnixAddress("[::1]:1"));
  EXPECT_EQ(UnixSocketPath("unix:/run/a.sock"), "/run/a.sock");
  EXPECT_EQ(UnixSocketPath("unix:///run/a.sock"), "/run/a.sock");
  EXPECT_EQ(UnixSocketPath("unix:rel.sock"), "rel.sock");
  EXPECT_EQ(UnixSocketPath("localhost:1"), "");
}

TEST(UnixSocket, ParsesOctalModes) {
  EXPECT_EQ(*ParseSocketMode("0660", "--m"), 0660u);
  EXPECT_EQ(*ParseSocketMode("600", "--m"), 0600u);
  EXPECT_EQ(*ParseSocketMode("0777", "--m"), 0777u);
  for (const char* bad : {"", "0999", "rw", "01777", "7777", "-1", "0x1ff", "06600"}) {
    auto m = ParseSocketMode(bad, "--unix-socket-mode");
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("--unix-socket-mode"), std::string::npos);
  }
}

TEST(UnixSocket, PrepareRefusesBadPaths) {
  TempDir dir;
  EXPECT_EQ(PrepareUnixSocket("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PrepareUnixSocket(dir.path() + "/missing/a.sock").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PrepareUnixSocket(dir.path() + "/" + std::string(120, 'x')).code(),
            StatusCode::kInvalidArgument);
  const std::string file = dir.path() + "/plain";
  std::ofstream(file) << "keep";
  const Status s = PrepareUnixSocket(file);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a socket"), std::string::npos);
  EXPECT_EQ(::access(file.c_str(), F_OK), 0);  // never deleted
  RemoveUnixSocket(file);                      // not a socket: left alone too
  EXPECT_EQ(::access(file.c_str(), F_OK), 0);
  EXPECT_TRUE(PrepareUnixSocket(dir.path() + "/free.sock").ok());  // nothing there
}

TEST(UnixSocket, StaleReplacedLiveRefused) {
  TempDir dir;
  const std::string stale = dir.path() + "/stale.sock";
  ::close(BindSocket(stale, false));
  ASSERT_TRUE(IsSocket(stale));
  EXPECT_TRUE(PrepareUnixSocket(stale).ok());
  EXPECT_FALSE(IsSocket(stale));

  const std::string live = dir.path() + "/live.sock";
  const int fd = BindSocket(live, true);
  const Status s = PrepareUnixSocket(live);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("another server is listening"), std::string::npos);
  EXPECT_TRUE(IsSocket(live));
  ::close(fd);
  { UnixSocketFile guard(live); }
  EXPECT_FALSE(IsSocket(live));  // removed by the guard at scope exit
}

TEST(UnixSocket, AppliesModeAndGroup) {
  TempDir dir;
  const std::string path = dir.path() + "/a.sock";
  const int fd = BindSocket(path, true);
  ASSERT_TRUE(ApplyUnixSocketAccess(path, 0640, "", std::to_string(::getgid())).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_gid, ::getgid());
  EXPECT_EQ(ApplyUnixSocketAccess(path, 0600, "no-such-user-attn", "").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyUnixSocketAccess(path, 0600, "", "no-such-group-attn").code(),
            StatusCode::kInvalidArgument);
  ::close(fd);
}

TEST(UnixSocket, UmaskScoped) {
  const mode_t before = ::umask(022);
  {
    ScopedUmask m(0177);
    const mode_t inside = ::umask(0177);
    EXPECT_EQ(inside, 0177u);
  }
  EXPECT_EQ(::umask(before), 022u);
}

}  // namespace
}  // namespace attn
