#include "backends/backend.h"

#include <algorithm>

namespace attn {

HostTensorBuffers::HostTensorBuffers(const AttentionShape& shape) {
  const size_t es = static_cast<size_t>(kernels::DTypeSize(shape.dtype));
  const size_t q_bytes = static_cast<size_t>(shape.q_elements()) * es;
  const size_t kv_bytes = static_cast<size_t>(shape.kv_elements()) * es;
  q_.resize(std::max<size_t>(1, q_bytes));
  o_.resize(std::max<size_t>(1, q_bytes));
  k_.resize(std::max<size_t>(1, kv_bytes));
  v_.resize(std::max<size_t>(1, kv_bytes));
  if (shape.return_lse) lse_.resize(std::max<size_t>(1, shape.lse_elements()));
}

AttentionTensors HostTensorBuffers::Tensors(const AttentionTensors& index) {
  AttentionTensors t = index;
  t.q = q();
  t.k = k();
  t.v = v();
  t.o = o();
  t.lse = lse();
  return t;
}

Status ExecuteStagedOnHost(const AttentionShape& shape, const StagedProblem& problem,
                           const std::function<Status(const AttentionTensors& host)>& execute) {
  HostTensorBuffers buffers(shape);
  problem.pack(buffers.q(), buffers.k(), buffers.v());
  Status s = execute(buffers.Tensors(problem.index));
  if (s.ok()) problem.unpack(buffers.o(), buffers.lse());
  return s;
}

Status Backend::ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                              ExecuteTimes* times) {
  return ExecuteStagedOnHost(shape, problem, [&](const AttentionTensors& host) {
    return ExecuteUntil(shape, host, problem.should_stop, times);
  });
}

}  // namespace attn
