// Expires idle sequences on a timer (--sequence-ttl-s; issue 16 item 5): without it, sequences
// past their TTL were dropped only when some call looked a sequence up, so an idle server kept
// expired sequences (and their pages) forever, refusing new ones for lack of pages.
//
// A thread calls SequenceStore::SweepExpired every `interval` until destroyed. The interval the
// server uses is TtlSweepInterval(ttl): a tenth of the TTL within [10 ms, 1 s], so a sequence
// is dropped at most that long after its TTL passed (lookups, GetLoad, metrics and a refusal
// for lack of pages also sweep first). Thread-safety: constructor and destructor from one
// thread; the sweeps are as thread-safe as SequenceStore.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "kv_cache/sequence_store.h"

namespace attn {

/// The sweep period for a TTL of `ttl_s` seconds (> 0): ttl_s / 10 clamped to [10 ms, 1 s].
std::chrono::milliseconds TtlSweepInterval(double ttl_s);

class TtlSweeper {
 public:
  /// Starts sweeping `store` (not owned; must outlive this) every `interval` (> 0).
  TtlSweeper(SequenceStore *store, std::chrono::milliseconds interval);
  /// Stops the thread (waits for a sweep in progress).
  ~TtlSweeper();
  TtlSweeper(const TtlSweeper &) = delete;
  TtlSweeper &operator=(const TtlSweeper &) = delete;

 private:
  SequenceStore *const store_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the fields above are set
};

}  // namespace attn
