// Fault injection for tests (issue 8): a Backend decorator that forwards everything to the
// backend it wraps, except that from the Nth execute on (Execute, ExecuteUntil or ExecuteStaged,
// counted over every backend sharing one FaultCounter, in call order) it returns INTERNAL
// without running, as a backend does after a device fault (a sticky CUDA error fails every
// later launch too). The service's device-fault path then turns health NOT_SERVING. Enabled by
// the hidden server flag --inject-backend-fault-after=N (BackendRegistry::InjectFaultAfter);
// never on by default.
// Thread-safety: as the wrapped backend; the counter is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"

namespace attn {

/// Executes counted across backends; the fault starts at call number `fault_at` (1-based).
struct FaultCounter {
  explicit FaultCounter(int64_t fault_at_in) : fault_at(fault_at_in) {}
  const int64_t fault_at;
  std::atomic<int64_t> calls{0};
};

class FaultInjectingBackend final : public Backend {
 public:
  /// `inner` is owned; `counter` is shared with the other wrapped backends.
  FaultInjectingBackend(std::unique_ptr<Backend> inner, std::shared_ptr<FaultCounter> counter)
      : inner_(std::move(inner)), counter_(std::move(counter)) {}

  const std::string& name() const override { return inner_->name(); }
  BackendCapabilities Capabilities() const override { return inner_->Capabilities(); }
  bool available() const override { return inner_->available(); }
  std::string unavailable_reason() const override { return inner_->unavailable_reason(); }
  Status Supports(const AttentionShape& shape) const override { return inner_->Supports(shape); }
  /// The wrapped Execute, or INTERNAL ("injected device fault ...") from call fault_at on.
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override;
  /// The same, forwarding `should_stop` to the wrapped backend.
  Status ExecuteUntil(const AttentionShape& shape, const AttentionTensors& host,
                      const std::function<bool()>& should_stop, ExecuteTimes* times) override;
  /// The wrapped ExecuteStaged (so a GPU backend keeps its staged path), or INTERNAL as
  /// Execute; `problem`'s callbacks are then not called.
  Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                       ExecuteTimes* times) override;

 private:
  /// Counts one execute: INTERNAL ("injected device fault ...") from call fault_at on.
  Status CountCall();

  std::unique_ptr<Backend> inner_;
  std::shared_ptr<FaultCounter> counter_;
};

}  // namespace attn
