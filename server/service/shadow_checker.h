// Shadow checking (--shadow-check-fraction F): a sample of live Attend responses is recomputed
// on the cpu float64 reference off the hot path and compared (DESIGN.md §4 metric and
// tolerances).
//
// Hot path cost: when F = 0 nothing (enabled() is false); otherwise one atomic add per call to
// decide (FractionSampler), and for a sampled call a copy of its inputs and output into a job
// when the bounded queue has room; when it has none the call is counted in
// attn_shadow_dropped_total{backend} and nothing is copied. One low-priority thread (nice 19)
// runs the jobs one at a time with a single cpu thread each and records
// attn_shadow_relative_error{backend} (‖out − ref‖₂ / ‖ref‖₂ of o; lse is not compared) and
// attn_shadow_mismatches_total{backend} (over the dtype's tolerance, any row over 5× it, a
// masked row not exactly zero, or a NaN/inf), and logs each mismatch as a warning.
// Thread-safety: ShouldSample/Submit from any thread; Stop joins the thread (idempotent).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "metrics/metrics.h"
#include "validation/attend_validator.h"

namespace attn::metrics {

/// Picks calls deterministically: of the first n calls, exactly floor(n·F) are sampled, evenly
/// spread (call i is sampled when floor((i+1)·F) > floor(i·F)). F is clamped to [0, 1].
/// Thread-safe (one atomic add).
class FractionSampler {
 public:
  explicit FractionSampler(double fraction);
  bool Sample();
  double fraction() const { return fraction_; }

 private:
  double fraction_;
  std::atomic<uint64_t> calls_{0};
};

/// Result of comparing one output with its float64 reference.
struct ShadowComparison {
  double relative_error = 0;  ///< ‖out − ref‖₂ / ‖ref‖₂ (0 when both are 0; inf on NaN/inf)
  double worst_row_error = 0;  ///< max over rows (row_len values) of the same metric
  bool mismatch = false;       ///< over tolerance, a row over 5× it, or a masked row not zero
};

/// DESIGN.md §4 tolerance of `dtype`: fp32 1e-5, fp16 2e-3, bf16 1e-2, fp8 6e-2.
double ShadowTolerance(kernels::DType dtype);

/// Compares `elements` values of `out` (in `dtype`) with `ref`, in rows of `row_len`.
ShadowComparison CompareWithReference(const void* out, kernels::DType dtype, const double* ref,
                                      int64_t elements, int64_t row_len, double tolerance);

class ShadowChecker {
 public:
  struct Options {
    double fraction = 0;                       ///< share of Attend calls checked, [0, 1]
    size_t max_queued = 4;                     ///< jobs waiting; more are dropped
    uint64_t max_queued_bytes = 512ull << 20;  ///< bytes of copies waiting; more are dropped
  };
  /// `metrics` may be null (then only the log and the accessors report).
  ShadowChecker(Options options, Metrics* metrics);
  ~ShadowChecker();
  ShadowChecker(const ShadowChecker&) = delete;
  ShadowChecker& operator=(const ShadowChecker&) = delete;

  bool enabled() const { return enabled_; }
  /// Whether this call should be checked (false when disabled). Cheap.
  bool ShouldSample() { return enabled_ && sampler_.Sample(); }
  /// Queues a check of `o` (the response's output, v.o_bytes) for the validated request `v`
  /// that ran on `backend` (a Metrics backend index), copying what it needs; or counts a drop.
  void Submit(int backend, const ValidatedAttend& v, const void* o);
  /// Discards waiting jobs and joins the thread (idempotent).
  void Stop();
  /// Waits until no job is waiting or running, or `timeout` passes; true when idle (tests).
  bool WaitIdle(std::chrono::milliseconds timeout);

  int64_t checked() const { return checked_.load(); }
  int64_t dropped() const { return dropped_.load(); }
  int64_t mismatches() const { return mismatches_.load(); }

 private:
  struct Job;
  void Loop();
  void Check(const Job& job);
  void Drop(int backend);

  const Options options_;
  const bool enabled_;
  FractionSampler sampler_;
  Metrics* metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::unique_ptr<Job>> queue_;
  size_t reserved_ = 0;  // queued + being copied
  uint64_t reserved_bytes_ = 0;
  bool running_job_ = false;
  bool stopping_ = false;
  std::atomic<int64_t> checked_{0}, dropped_{0}, mismatches_{0};
  std::thread thread_;
};

}  // namespace attn::metrics
