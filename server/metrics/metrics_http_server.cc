#include "metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace attn::metrics {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kRequestDeadlineMs = 5000;  // from accept to the end of the request headers
constexpr int kWriteDeadlineMs = 10000;   // for the whole answer

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

void WriteAll(int fd, const std::string& data) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kWriteDeadlineMs);
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    const int left = MsLeft(deadline);
    if (left == 0 || ::poll(&p, 1, left) <= 0) return;  // a reader too slow: give up
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

std::string Response(const char* status, const char* content_type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

namespace {

// "host:port" as Start binds it: host an IPv4 literal, "[IPv6]" literal, a name that resolves
// now (getaddrinfo, the first address) or empty (0.0.0.0, every IPv4 interface); port in
// [0, 65535].
struct BindAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

StatusOr<BindAddress> ParseAddress(const std::string& address) {
  const std::string got = ", got \"" + address + "\"";
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("--metrics-address: expected host:port (IPv6: [addr]:port)" + got);
  }
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) > 65535) {
    return InvalidArgument("--metrics-address: port must be in [0, 65535], got \"" + port_text +
                           "\"");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return InvalidArgument("--metrics-address: an IPv6 address goes in brackets ([addr]:port)" +
                           got);
  }
  if (host.empty()) host = "0.0.0.0";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    if (found != nullptr) freeaddrinfo(found);
    return InvalidArgument("--metrics-address: host \"" + host + "\" does not resolve (" +
                           gai_strerror(rc) +
                           "); use an address of this machine, a name that resolves, or "
                           "0.0.0.0 / [::] for every interface" + got);
  }
  BindAddress out;
  std::memcpy(&out.addr, found->ai_addr, found->ai_addrlen);
  out.len = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

}  // namespace

Status MetricsHttpServer::CheckAddress(const std::string& address) {
  return ParseAddress(address).status();
}

StatusOr<int> MetricsHttpServer::Start(const std::string& address) {
  auto parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  BindAddress bind = *parsed;
  listen_fd_ = ::socket(bind.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Unavailable(std::string("metrics: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&bind.addr), bind.len) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    return Unavailable("metrics: cannot listen on " + address + ": " + why);
  }
  socklen_t len = sizeof(bind.addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bind.addr), &len);
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
  const uint16_t port = bind.addr.ss_family == AF_INET6
                            ? reinterpret_cast<const sockaddr_in6*>(&bind.addr)->sin6_port
                            : reinterpret_cast<const sockaddr_in*>(&bind.addr)->sin_port;
  return static_cast<int>(ntohs(port));
}

void MetricsHttpServer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsHttpServer::Reap(bool all) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (all || (*it)->done.load()) {
      (*it)->thread.join();
      ::close((*it)->fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void MetricsHttpServer::Loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, 200);  // wake up regularly to notice Stop()
    Reap(/*all=*/false);
    if (ready <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (!MakeRoom()) {
      ::close(fd);  // every connection is writing an answer: refuse rather than queue
      continue;
    }
    auto conn = std::make_unique<Connection>();
    Connection* c = conn.get();
    c->fd = fd;
    c->thread = std::thread([this, c] {
      Serve(c);
      c->done = true;
    });
    connections_.push_back(std::move(conn));
  }
  Reap(/*all=*/true);
}

bool MetricsHttpServer::MakeRoom() {
  size_t live = 0;
  Connection* oldest_reading = nullptr;
  for (const auto& c : connections_) {  // oldest first: connections_ is in accept order
    if (c->shed || c->done.load()) continue;
    ++live;
    if (oldest_reading == nullptr && c->reading.load()) oldest_reading = c.get();
  }
  if (live < kMaxConnections) return true;
  if (oldest_reading == nullptr) return false;
  // Its thread's poll/recv returns at once; the fd stays open until Reap joins the thread.
  ::shutdown(oldest_reading->fd, SHUT_RDWR);
  oldest_reading->shed = true;
  return true;
}

void MetricsHttpServer::Serve(Connection* c) {
  const int fd = c->fd;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    pollfd p{fd, POLLIN, 0};
    const int left = MsLeft(deadline);  // a total deadline: trickled bytes do not extend it
    if (left == 0 || ::poll(&p, 1, left) <= 0) return;  // slow or silent client: drop it
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  c->reading = false;
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    WriteAll(fd, Response("400 Bad Request", "text/plain", "bad request\n"));
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    WriteAll(fd, Response("405 Method Not Allowed", "text/plain", "only GET\n"));
  } else if (path != "/metrics") {
    WriteAll(fd, Response("404 Not Found", "text/plain", "metrics are at /metrics\n"));
  } else {
    std::string body = render_();
    std::string r = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body);
    if (method == "HEAD") r.resize(r.size() - body.size());
    WriteAll(fd, r);
  }
}

}  // namespace attn::metrics
