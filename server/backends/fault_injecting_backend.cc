#include "backends/fault_injecting_backend.h"

namespace attn {

Status FaultInjectingBackend::Execute(const AttentionShape& shape, const AttentionTensors& host,
                                      ExecuteTimes* times) {
  return ExecuteUntil(shape, host, {}, times);
}

Status FaultInjectingBackend::ExecuteUntil(const AttentionShape& shape,
                                           const AttentionTensors& host,
                                           const std::function<bool()>& should_stop,
                                           ExecuteTimes* times) {
  ATTN_RETURN_IF_ERROR(CountCall());
  return inner_->ExecuteUntil(shape, host, should_stop, times);
}

Status FaultInjectingBackend::ExecuteStaged(const AttentionShape& shape,
                                            const StagedProblem& problem, ExecuteTimes* times) {
  ATTN_RETURN_IF_ERROR(CountCall());
  return inner_->ExecuteStaged(shape, problem, times);
}

Status FaultInjectingBackend::CountCall() {
  const int64_t call = counter_->calls.fetch_add(1) + 1;
  if (call >= counter_->fault_at) {
    return Internal("backend \"" + name() + "\": injected device fault (Execute call " +
                    std::to_string(call) + ", --inject-backend-fault-after=" +
                    std::to_string(counter_->fault_at) + ")");
  }
  return Status::Ok();
}

}  // namespace attn
