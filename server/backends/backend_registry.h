// The set of backends a server offers, and how a request's backend name is resolved
// (DESIGN.md §5): a named backend runs or is refused with the reason (never a silent
// fallback); "auto" picks the first backend in preference order that is available and
// supports the problem.
// Thread-safety: Add() before serving; Resolve() and accessors are then safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/calibration.h"

namespace attn {

/// A resolved choice: the backend and why it was chosen ("requested", "auto: ...").
struct BackendChoice {
  Backend* backend = nullptr;
  std::string reason;
  std::string bucket;  ///< auto with a calibration table: the request's bucket (calibration.h)
};

class BackendRegistry {
 public:
  /// Adds a backend. `auto_rank`: position in auto's preference order (lower first); negative
  /// keeps it out of auto.
  void Add(std::unique_ptr<Backend> backend, int auto_rank);
  /// Backend by name, or nullptr.
  Backend* Find(const std::string& name) const;
  /// All backends in registration order.
  std::vector<Backend*> All() const;
  /// Names, comma-separated, plus "auto", for error messages.
  std::string KnownNames() const;
  /// Test hook (--inject-backend-fault-after): wraps every backend added so far in a
  /// FaultInjectingBackend sharing one counter, so the `n`th Execute (n >= 1, counted over all
  /// backends) and every later one return INTERNAL as after a device fault. Call before serving.
  void InjectFaultAfter(int64_t n);

  /// Makes auto consult `table` (calibration.h) first: the bucket's fastest backend when it
  /// is available and supports the request, else the static preference order. Call before
  /// serving; null restores the static order.
  void SetCalibration(std::shared_ptr<const CalibrationTable> table) { calibration_ = table; }
  const CalibrationTable* calibration() const { return calibration_.get(); }

  /// Resolves `requested` ("" means `default_name`) for `shape`.
  /// Errors: INVALID_ARGUMENT for an unknown name; FAILED_PRECONDITION when a named backend is
  /// unavailable or does not support the problem (with its reason), or when auto finds none
  /// (listing each candidate's reason).
  StatusOr<BackendChoice> Resolve(const std::string& requested, const std::string& default_name,
                                  const AttentionShape& shape) const;

 private:
  struct Entry {
    std::unique_ptr<Backend> backend;
    int auto_rank;
  };
  std::vector<Entry> entries_;
  std::shared_ptr<const CalibrationTable> calibration_;
};

}  // namespace attn
