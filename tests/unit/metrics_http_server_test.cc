// MetricsHttpServer's addresses (server/metrics/metrics_http_server.h): the forms
// --metrics-address accepts (IPv4, [IPv6], names that resolve, an empty host) and refuses, and
// a GET /metrics over each family.
#include "metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace attn::metrics {
namespace {

// One HTTP/1.0 GET of /metrics on loopback of `family`; the whole answer ("" when the
// connection fails).
std::string Get(int family, int port) {
  const int fd = ::socket(family, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*a);
  }
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  ::close(fd);
  return out;
}

bool HaveIpv6Loopback() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

TEST(MetricsHttpServer, ServesOnIpv4AndANameThatResolves) {
  for (const char* address : {"127.0.0.1:0", "localhost:0"}) {
    MetricsHttpServer server([] { return std::string("attn_up 1\n"); });
    auto port = server.Start(address);
    ASSERT_TRUE(port.ok()) << address << ": " << port.status().ToString();
    const std::string answer = Get(AF_INET, *port);
    EXPECT_NE(answer.find("200 OK"), std::string::npos) << address << ": " << answer;
    EXPECT_NE(answer.find("attn_up 1"), std::string::npos) << address;
  }
}

TEST(MetricsHttpServer, ServesOnBracketedIpv6) {
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  MetricsHttpServer server([] { return std::string("attn_up 1\n"); });
  auto port = server.Start("[::1]:0");
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_NE(Get(AF_INET6, *port).find("attn_up 1"), std::string::npos);
}

TEST(MetricsHttpServer, RefusesMalformedAddressesWithTheReason) {
  struct Case {
    const char* address;
    const char* reason;
  };
  for (const Case& c : {Case{"nothost.invalid:9090", "does not resolve"},
                        Case{"1.2.3.4:x", "port must be in [0, 65535]"},
                        Case{"127.0.0.1:65536", "port must be in [0, 65535]"},
                        Case{"::1:0", "an IPv6 address goes in brackets"},
                        Case{"9464", "expected host:port"}}) {
    const Status s = MetricsHttpServer::CheckAddress(c.address);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.address;
    EXPECT_NE(s.message().find(c.reason), std::string::npos) << c.address << ": " << s.message();
    EXPECT_NE(s.message().find("--metrics-address"), std::string::npos) << c.address;
  }
  EXPECT_TRUE(MetricsHttpServer::CheckAddress(":0").ok());  // every IPv4 interface
}

}  // namespace
}  // namespace attn::metrics
