#include "service/write_watchdog.h"

#include <spdlog/spdlog.h>

namespace attn {

WriteWatchdog::WriteWatchdog(std::chrono::milliseconds limit, int64_t max_bytes)
    : limit_(limit), max_bytes_(max_bytes) {
  if (limit_.count() > 0) thread_ = std::thread([this] { Loop(); });
}

WriteWatchdog::~WriteWatchdog() {
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WriteWatchdog::CancelLocked(std::map<Ticket, Entry>::iterator it) {
  it->second.cancelled = true;
  cancelling_bytes_ += it->second.bytes;
  cancelled_.fetch_add(1);
  // Under the lock: a concurrent OnDone's Disarm waits, so the context is still alive. An
  // OnDone run inline by TryCancel re-enters (recursive mutex) and erases `it`: not used after.
  it->second.context->TryCancel();
}

WriteWatchdog::Ticket WriteWatchdog::Arm(grpc::ServerContextBase* context, int64_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const Ticket t = next_++;
  const bool was_empty = armed_.empty();
  armed_.emplace(t, Entry{std::chrono::steady_clock::now() + limit_, context, bytes, false});
  held_.fetch_add(bytes);
  if (was_empty) cv_.notify_all();
  // Over the byte bound: cancel the oldest calls still waiting for their client, never `t`.
  Ticket next_candidate = 0;
  while (max_bytes_ > 0 && held_.load() - cancelling_bytes_ > max_bytes_) {
    auto it = armed_.upper_bound(next_candidate);
    while (it != armed_.end() && it->second.cancelled) ++it;
    if (it == armed_.end() || it->first == t) break;
    next_candidate = it->first;
    spdlog::debug(
        "answered calls not read by their clients hold {} bytes (bound {}): "
        "cancelling the oldest",
        held_.load() - cancelling_bytes_, max_bytes_);
    CancelLocked(it);
  }
  return t;
}

void WriteWatchdog::Disarm(Ticket ticket) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const auto it = armed_.find(ticket);
  if (it == armed_.end()) return;
  held_.fetch_sub(it->second.bytes);
  if (it->second.cancelled) cancelling_bytes_ -= it->second.bytes;
  armed_.erase(it);
}

void WriteWatchdog::Loop() {
  std::unique_lock<std::recursive_mutex> lock(mu_);
  while (!stop_) {
    auto it = armed_.begin();
    while (it != armed_.end() && it->second.cancelled) ++it;
    if (it == armed_.end()) {
      cv_.wait_for(lock, limit_);  // woken by Arm; rescans cancelled entries now and then
      continue;
    }
    // A copy: wait_until reads its deadline again after waking, and a Disarm on another
    // thread may have erased the entry by then.
    const auto deadline = it->second.deadline;
    if (std::chrono::steady_clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    spdlog::debug("response not taken by its client within {} ms: cancelling the call",
                  limit_.count());
    CancelLocked(it);
  }
}

}  // namespace attn
