// The backend interface (DESIGN.md §5): one attention implementation behind the service.
//
// A backend states what it can do (Capabilities), says whether it can run a given problem and
// why not (Supports), and executes a problem whose inputs and outputs live in host memory
// (Execute). GPU backends stage through their own device memory; the kernel they call follows
// the plan/run split (host decisions in plan, run only enqueues). ExecuteStaged runs a problem
// whose caller writes the inputs where the backend wants them and reads the outputs where the
// backend left them (the coalesced Attend path: the GPU backends hand out their lane's pinned
// staging, so each direction costs one host copy); its default is the host-vector path.
// Thread-safety: Capabilities, Supports, Execute and ExecuteStaged may be called from many
// threads at once.
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
  /// The recipes ExecutionReport.recipe can name for this backend, the default first (fp8);
  /// empty for backends that compute in the request's dtype.
  std::vector<std::string> recipes;
};

/// Time spent by Execute in each phase, in microseconds.
struct ExecuteTimes {
  int64_t host_to_device_us = 0;
  int64_t kernel_us = 0;
  int64_t device_to_host_us = 0;
};

/// A problem for Backend::ExecuteStaged: its index arrays, and callbacks that write its inputs
/// into buffers the backend provides and read its outputs from where the backend left them.
struct StagedProblem {
  /// The index arrays in host memory, as Execute takes them: q_lengths/kv_lengths (B int32
  /// each) or null, q_offsets/kv_offsets (B+1 int64 each) for varlen. q, k, v, o and lse are
  /// ignored.
  AttentionTensors index;
  /// Writes the inputs in the shape's layout and dtype: shape.q_elements() values into `q`,
  /// shape.kv_elements() into each of `k` and `v`. The buffers are host memory at least that
  /// many bytes long (never null, even for 0 bytes), aligned at least as malloc aligns,
  /// contents undefined. Called at most once, before the launch; not called when the backend
  /// refuses the problem before it packs (e.g. a plan error or a faulted device).
  std::function<void(void* q, void* k, void* v)> pack;
  /// Reads the outputs: `o` holds shape.q_elements() values of shape.dtype in the layout of q,
  /// `lse` shape.lse_elements() float32 values ((N, total_q) for varlen; null unless
  /// shape.return_lse). Called exactly once when the launch succeeded, before ExecuteStaged
  /// returns (the buffers are the backend's: they are gone or reused after it); never when
  /// ExecuteStaged returns an error.
  std::function<void(const void* o, const float* lse)> unpack;
  /// As ExecuteUntil's `should_stop` (may be empty).
  std::function<bool()> should_stop;
};

/// Host buffers for one problem's q, k, v, o (and lse when shape.return_lse), sized for the
/// shape (q/o: q_elements, k/v: kv_elements values of shape.dtype; lse: lse_elements floats),
/// each at least 1 byte so that no pointer is null, even for empty problems. Contents start
/// zeroed.
class HostTensorBuffers {
 public:
  HostTensorBuffers() = default;
  explicit HostTensorBuffers(const AttentionShape& shape);
  char* q() { return q_.data(); }
  char* k() { return k_.data(); }
  char* v() { return v_.data(); }
  char* o() { return o_.data(); }
  const char* o() const { return o_.data(); }
  /// Null unless the shape had return_lse.
  float* lse() { return lse_.empty() ? nullptr : lse_.data(); }
  const float* lse() const { return lse_.empty() ? nullptr : lse_.data(); }
  /// `index`'s lengths and offsets with q, k, v, o and lse pointing at these buffers.
  AttentionTensors Tensors(const AttentionTensors& index);

 private:
  std::vector<char> q_, k_, v_, o_;
  std::vector<float> lse_;
};

/// The host-vector path of ExecuteStaged: HostTensorBuffers for `shape`, `problem.pack` into
/// them, `execute` over them (with problem.index), then `problem.unpack` from them when
/// `execute` returned OK. Returns what `execute` returned.
Status ExecuteStagedOnHost(const AttentionShape& shape, const StagedProblem& problem,
                           const std::function<Status(const AttentionTensors& host)>& execute);

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
  /// The numerical recipe this backend applies to `shape` beyond its dtype, named for
  /// ExecutionReport.recipe (fp8: e.g. "e4m3 per-tensor, hadamard q/k, k-smoothing"); empty
  /// when it computes in the request's dtype as given.
  virtual std::string Recipe(const AttentionShape& /*shape*/) const { return {}; }
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
  /// Computes `shape` like ExecuteUntil (with problem.should_stop), the inputs written by
  /// `problem.pack` into buffers this backend provides and the outputs read by
  /// `problem.unpack` from where it left them (see StagedProblem). The GPU backends hand out
  /// slices of their held lane's pinned staging (GpuContext::ExecuteStaged: one host copy each
  /// way); this default is ExecuteStagedOnHost over ExecuteUntil (host vectors, then the
  /// backend's own copies). Blocks until done. Errors: as ExecuteUntil (CANCELLED when it
  /// stopped); `unpack` is then not called.
  virtual Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                               ExecuteTimes* times);
};

}  // namespace attn
