// Bounds for answered calls whose response cannot be written (issue 16 item 4): a client that
// never reads (never opens its HTTP/2 flow-control window) keeps the call, its request and its
// response in server memory until the call ends. Arm() before a reactor's Finish() with the
// bytes the call holds; Disarm() from its OnDone. A call still armed `limit` later is
// cancelled (ServerContextBase::TryCancel ends it and frees what it holds), and while the
// armed calls hold more than `max_bytes`, the oldest are cancelled at once (never the newest
// one, so a single large response is always let through). Clients that read promptly are
// disarmed within milliseconds and are never the oldest, so the stalled readers pay.
// Thread-safety: all methods are thread-safe; one thread of its own fires the time limits.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

namespace attn {

class WriteWatchdog {
 public:
  using Ticket = uint64_t;
  /// `limit` <= 0: no time limit; `max_bytes` <= 0: no byte bound.
  WriteWatchdog(std::chrono::milliseconds limit, int64_t max_bytes);
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  /// Watches `context` (alive until the matching Disarm), which holds `bytes`; may cancel
  /// older calls to stay within max_bytes. Returns the ticket for Disarm.
  Ticket Arm(grpc::ServerContextBase* context, int64_t bytes);
  /// Ends the watch of `ticket` (unknown tickets are ignored). After it returns the watchdog
  /// no longer touches that context.
  void Disarm(Ticket ticket);
  /// Bytes held by armed calls (including cancelled ones not yet done).
  int64_t held_bytes() const { return held_.load(); }
  /// Calls cancelled (time limit or byte bound) since start.
  int64_t cancelled() const { return cancelled_.load(); }

 private:
  struct Entry {
    std::chrono::steady_clock::time_point deadline;
    grpc::ServerContextBase* context;
    int64_t bytes;
    bool cancelled;
  };
  void Loop();
  // mu_ held: cancels `it` (stays in armed_ until Disarm, marked cancelled).
  void CancelLocked(std::map<Ticket, Entry>::iterator it);

  const std::chrono::milliseconds limit_;
  const int64_t max_bytes_;
  // Recursive: TryCancel runs under it and may end the call (OnDone → Disarm) on this thread.
  std::recursive_mutex mu_;
  std::condition_variable_any cv_;
  std::map<Ticket, Entry> armed_;  // tickets grow with time: the first entry is the oldest
  Ticket next_ = 1;
  int64_t cancelling_bytes_ = 0;  // bytes of cancelled entries not yet disarmed
  bool stop_ = false;
  std::atomic<int64_t> held_{0};
  std::atomic<int64_t> cancelled_{0};
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace attn
