// A fixed set of worker threads over a bounded FIFO queue. The gRPC callback threads hand
// validated requests here so they never block on computation; a full queue is reported to the
// caller (RESOURCE_EXHAUSTED at the service), never grown without bound.
// Thread-safety: TrySubmit/queued are thread-safe; Stop joins all workers (idempotent).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attn {

class WorkerPool {
 public:
  /// Starts `threads` workers (>= 1) with room for `max_queued` waiting tasks (>= 1).
  WorkerPool(int threads, size_t max_queued);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Enqueues `task`; false when the queue is full or the pool is stopping.
  bool TrySubmit(std::function<void()> task);
  /// Runs every queued task, then joins the workers.
  void Stop();
  size_t queued() const;
  size_t max_queued() const { return max_queued_; }
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void Loop();

  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace attn
