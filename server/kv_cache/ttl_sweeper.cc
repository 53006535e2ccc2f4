#include "kv_cache/ttl_sweeper.h"

#include <algorithm>

namespace attn {

std::chrono::milliseconds TtlSweepInterval(double ttl_s) {
  const double ms = std::clamp(ttl_s * 100.0, 10.0, 1000.0);  // ttl / 10, in ms
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

TtlSweeper::TtlSweeper(SequenceStore *store, std::chrono::milliseconds interval)
    : store_(store), interval_(interval), thread_([this] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
          lock.unlock();
          store_->SweepExpired();
          lock.lock();
        }
      }) {}

TtlSweeper::~TtlSweeper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace attn
