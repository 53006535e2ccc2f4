// Runs the calibration of `auto` (calibration.h) on real backends: for every grid bucket and
// every available backend that supports it, a parity check on a small instance of the bucket
// (T = S = min(length, parity_len)) against the float64 CPU reference with the dtype's
// tolerance (DESIGN.md §4; a backend that fails is excluded for that bucket), then one warm-up
// run (which also builds cuDNN graphs) and `reps` timed runs; the sample is the median of the
// backends' own kernel times (ExecuteTimes::kernel_us: device events on GPUs).
// The cpu backend is calibrated only when no other backend is available (on a GPU server it is
// orders of magnitude slower and would dominate the time budget).
// Bounded: grid size × backends × (1 + 1 + reps) runs; logs one line per bucket.
// Not thread-safe with concurrent traffic on the same backends' timings (run it at start).
#pragma once

#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/calibration.h"

namespace attn {

struct CalibrationOptions {
  CalibrationGrid grid;
  int reps = 5;               ///< timed runs per (bucket, backend)
  int64_t parity_len = 256;   ///< T = S of the parity instance (capped by the bucket length)
  uint64_t seed = 1;
};

/// Calibrates `backends` (see the file comment) and selects the fastest per bucket.
/// Errors: INTERNAL when a backend reports a device fault (the table is not built).
StatusOr<CalibrationTable> RunCalibration(const std::vector<Backend*>& backends,
                                          const CalibrationOptions& options,
                                          const std::string& device_key);

}  // namespace attn
