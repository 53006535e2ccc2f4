// `cpu`: the reference backend (kernels/cpu), always available. Float64 accumulation,
// threaded per call; fp32/fp16/bf16; every semantic of DESIGN.md §4; padded and varlen.
#pragma once

#include <string>

#include "backends/backend.h"

namespace attn {

class CpuBackend final : public Backend {
 public:
  /// `threads_per_call`: threads one Execute may use (0 = hardware concurrency).
  explicit CpuBackend(int threads_per_call) : threads_per_call_(threads_per_call) {}
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override;
  /// INVALID_ARGUMENT-class problems are reported as FAILED_PRECONDITION by the registry.
  Status Supports(const AttentionShape& shape) const override;
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override;
  /// Stops between chunks of rows when `should_stop` says so (CANCELLED).
  Status ExecuteUntil(const AttentionShape& shape, const AttentionTensors& host,
                      const std::function<bool()>& should_stop, ExecuteTimes* times) override;

 private:
  std::string name_ = "cpu";
  int threads_per_call_;
};

}  // namespace attn
