// The fault latch of a GPU executor (DESIGN.md §13): the first CUDA error it sees marks it
// faulted for good, and every later call fails with INTERNAL naming that first cause (a CUDA
// context that saw a device fault cannot be trusted again; the server reports NOT_SERVING).
// Plain C++ (no CUDA types), so its rules are testable in a CPU-only build.
// Thread-safety: thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <utility>

#include "attn/common/status.h"

namespace attn {

class FaultLatch {
 public:
  /// `error_prefix` starts the INTERNAL message of the call that hits the fault ("CUDA error
  /// in "); `faulted_prefix` starts the message of every later call ("device is faulted after
  /// an earlier error: "). Both are followed by the cause ("what: CUDA's error string").
  FaultLatch(std::string error_prefix, std::string faulted_prefix)
      : error_prefix_(std::move(error_prefix)), faulted_prefix_(std::move(faulted_prefix)) {}

  /// Ok while no fault was latched; else INTERNAL: faulted_prefix + the first cause.
  Status Faulted() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!faulted_) return Status::Ok();
    return Internal(faulted_prefix_ + cause_);
  }
  bool faulted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return faulted_;
  }
  /// Latches `cause` (the first one is kept) and returns INTERNAL: error_prefix + cause.
  Status Trip(const std::string& cause) {
    Latch(cause);
    return Internal(error_prefix_ + cause);
  }
  /// Latches `cause` (the first one is kept) without building a status.
  void Latch(const std::string& cause) {
    std::lock_guard<std::mutex> lock(mu_);
    if (faulted_) return;
    faulted_ = true;
    cause_ = cause;
  }

 private:
  const std::string error_prefix_;
  const std::string faulted_prefix_;
  mutable std::mutex mu_;
  bool faulted_ = false;
  std::string cause_;
};

}  // namespace attn
