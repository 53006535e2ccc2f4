// The backend interface (DESIGN.md §5): one attention implementation behind the service.
//
// A backend states what it can do (Capabilities), says whether it can run a given problem and
// why not (Supports), and executes a problem whose inputs and outputs live in host memory
// (Execute). GPU backends stage through their own device memory; the kernel they call follows
// the plan/run split (host decisions in plan, run only enqueues).
// Thread-safety: Capabilities, Supports and Execute may be called from many threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn {

using kernels::AttentionShape;
using kernels::AttentionTensors;
using kernels::CausalAlignment;
using kernels::DType;

/// What a backend supports, as reported by GetServerInfo.
struct BackendCapabilities {
  std::vector<DType> dtypes;
  std::vector<int> head_dims;  ///< empty: any head dim up to max_head_dim
  int max_head_dim = 0;
  bool varlen = false;
  bool gqa = false;
  std::vector<CausalAlignment> causal;
  bool window = false;
  bool lse = false;
  std::string device;       ///< "cpu" or the GPU's name
  std::string description;  ///< one line
};

/// Time spent by Execute in each phase, in microseconds.
struct ExecuteTimes {
  int64_t host_to_device_us = 0;
  int64_t kernel_us = 0;
  int64_t device_to_host_us = 0;
};

/// One attention implementation.
class Backend {
 public:
  virtual ~Backend() = default;
  /// Registry name, e.g. "cpu", "naive".
  virtual const std::string& name() const = 0;
  virtual BackendCapabilities Capabilities() const = 0;
  /// False when the backend exists in this build but cannot run here (e.g. no CUDA device).
  virtual bool available() const { return true; }
  /// Why available() is false; empty otherwise.
  virtual std::string unavailable_reason() const { return {}; }
  /// True when a call's output does not depend on which other calls share its launch, so the
  /// batcher may coalesce concurrent calls into one launch (DESIGN.md §8). False for backends
  /// whose numerics depend on the whole launch (fp8: per-tensor scales from the inputs' amax).
  virtual bool coalescable() const { return true; }
  /// Ok if this backend can run `shape`; otherwise FAILED_PRECONDITION (or RESOURCE_EXHAUSTED
  /// for size limits) with the reason.
  virtual Status Supports(const AttentionShape& shape) const = 0;
  /// Computes attention for `shape`. `host` points at host memory: q/k/v/lengths/offsets are
  /// read, o (and lse when shape.return_lse) are fully written. Blocks until done.
  /// Errors: whatever Supports returns; RESOURCE_EXHAUSTED when device memory or workspace
  /// cannot be had; INTERNAL on a device fault (the caller then marks the server unhealthy).
  virtual Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                         ExecuteTimes* times) = 0;
  /// Execute that gives up when `should_stop` (thread-safe, cheap; may be empty) returns
  /// true: the cpu reference asks it between chunks of rows and returns CANCELLED; backends
  /// whose launch cannot be interrupted run Execute (the default) and are stopped only
  /// before launch, by the batcher.
  virtual Status ExecuteUntil(const AttentionShape& shape, const AttentionTensors& host,
                              const std::function<bool()>& should_stop, ExecuteTimes* times) {
    (void)should_stop;
    return Execute(shape, host, times);
  }
};

}  // namespace attn
