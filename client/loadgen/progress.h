// The live progress line of a run: completions are recorded from any thread; a printer thread
// writes one line to stderr per second (rewritten in place on a TTY, plain lines otherwise).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "loadgen/hdr_histogram.h"

namespace attn::loadgen {

class Progress {
 public:
  /// `out` is where lines go (stderr normally); nothing is printed when `enabled` is false.
  /// `unit` names what Record counts in the line ("done 120 decode steps (...)"); empty: calls.
  explicit Progress(bool enabled, std::FILE* out = stderr, std::string unit = "");
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Starts the once-a-second printer (no-op when disabled).
  void Start();
  /// Stops the printer and, on a TTY, ends the in-place line. Idempotent.
  void Stop();

  /// One finished request (thread-safe). `latency_ms` is only used when `ok`.
  void Record(double latency_ms, bool ok);
  /// One request that found the in-flight cap full (thread-safe).
  void RecordOverload();

  /// The current line, e.g. "[3s] done 120 (40.0/s) p50 12.1 ms p99 30.2 ms errors 0".
  std::string Line() const;

 private:
  void Loop();

  const bool enabled_;
  std::FILE* const out_;
  const std::string unit_;
  const bool tty_;
  const std::chrono::steady_clock::time_point start_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
  HdrHistogram latency_us_;
  int64_t done_ = 0;
  int64_t errors_ = 0;
  int64_t overload_ = 0;
  int64_t last_done_ = 0;  // at the previous line (for the per-second rate)
  std::chrono::steady_clock::time_point last_time_;
};

}  // namespace attn::loadgen
