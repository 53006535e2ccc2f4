// A minimal HTTP/1.1 server for Prometheus scrapes: GET /metrics answers 200 with the text
// exposition format (version 0.0.4) produced by a render callback; any other path gets 404,
// any other method 405. One thread accepts; each connection is served on its own short-lived
// thread. A request has a total deadline (kRequestDeadlineMs to arrive, kWriteDeadlineMs for
// the answer), not an idle timeout that a byte every few seconds restarts. At most
// kMaxConnections are served at once; when a new connection comes and all are taken, the
// oldest one still reading its request is shed (shut down), so clients trickling bytes can
// never keep a scrape out (issue 16 item 6). Only when every connection is already writing its
// answer is the new one closed.
//
// Why not prometheus-cpp's Exposer: it runs civetweb, whose worker threads get a fixed
// 100 KB stack; in CUDA builds the static TLS of cuBLAS/cuBLASLt alone is ~107 KB, so
// pthread_create fails with EINVAL and the exposer cannot start. Threads here use the default
// stack size. Thread-safety: Start/Stop from one thread; the render callback is called on the
// server thread.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "attn/common/status.h"

namespace attn::metrics {

class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::function<std::string()> render) : render_(std::move(render)) {}
  ~MetricsHttpServer() { Stop(); }
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  /// Listens on "host:port" (IPv4 literal, "[IPv6]" literal, a name that resolves, or an empty
  /// host for every IPv4 interface; port 0 picks a free one) and starts
  /// serving. Returns the bound port. Errors: INVALID_ARGUMENT for a malformed address,
  /// UNAVAILABLE when the socket cannot be bound.
  StatusOr<int> Start(const std::string& address);
  /// Start's address checks alone (binds nothing), for start-up to refuse a malformed
  /// --metrics-address before anything heavy starts. OK or Start's INVALID_ARGUMENT.
  static Status CheckAddress(const std::string& address);
  /// Stops serving and joins the thread (idempotent).
  void Stop();

 private:
  /// One connection being served; `done` is set by its thread when it finishes.
  struct Connection {
    std::thread thread;
    int fd = -1;                      ///< closed by the accept thread after the join
    std::atomic<bool> reading{true};  ///< still reading its request (may be shed)
    std::atomic<bool> done{false};
    bool shed = false;  ///< accept thread only
  };
  static constexpr size_t kMaxConnections = 64;

  /// Accept thread: makes room for one more connection by shedding the oldest one still
  /// reading; false when every served connection is writing its answer.
  bool MakeRoom();

  void Loop();
  void Serve(Connection* c);
  /// Joins connections whose thread has finished (all when `all`).
  void Reap(bool all);

  std::function<std::string()> render_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::list<std::unique_ptr<Connection>> connections_;  // accept thread only
};

}  // namespace attn::metrics
