#include "backends/cpu_backend.h"

#include <chrono>

#include "attn/kernels/cpu_attention.h"

namespace attn {

BackendCapabilities CpuBackend::Capabilities() const {
  BackendCapabilities c;
  c.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  c.max_head_dim = 1024;
  c.varlen = true;
  c.gqa = true;
  c.causal = {CausalAlignment::kNone, CausalAlignment::kTopLeft, CausalAlignment::kBottomRight};
  c.window = true;
  c.lse = true;
  c.device = "cpu";
  c.description = "reference: float64 accumulation, threaded, every semantic of DESIGN.md §4";
  return c;
}

Status CpuBackend::Supports(const AttentionShape& shape) const {
  if (shape.head_dim > 1024) return FailedPrecondition("head_dim > 1024 is not supported");
  return kernels::CpuSupports(shape);
}

Status CpuBackend::Execute(const AttentionShape& shape, const AttentionTensors& host,
                           ExecuteTimes* times) {
  return ExecuteUntil(shape, host, {}, times);
}

Status CpuBackend::ExecuteUntil(const AttentionShape& shape, const AttentionTensors& host,
                                const std::function<bool()>& should_stop, ExecuteTimes* times) {
  const auto start = std::chrono::steady_clock::now();
  Status s = kernels::CpuAttention(shape, host, threads_per_call_, should_stop);
  times->kernel_us = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count();
  return s;
}

}  // namespace attn
