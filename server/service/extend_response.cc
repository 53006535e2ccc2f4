#include "service/extend_response.h"

#include <utility>

#include "validation/attend_validator.h"

namespace attn {

void FillExtendResponse(StepResult& result, const std::string& backend, const std::string& device,
                        std::chrono::steady_clock::time_point received,
                        attention::v1::ExtendResponse* response) {
  const ExtendOutcome& out = result.outcome;
  if (!out.append_only) {  // an append-only step has no o
    attention::v1::Tensor* o = response->mutable_o();
    o->set_dtype(DTypeToProto(out.dtype));
    o->add_shape(result.q_tokens);
    o->add_shape(out.num_heads);
    o->add_shape(out.head_dim);
    *o->mutable_data() = std::move(result.o);
  }
  response->set_length(out.length);
  response->set_replayed(out.replayed);
  FillExecutionReport(result, backend, device, received, response->mutable_report());
}

void FillExecutionReport(const StepResult& result, const std::string& backend,
                         const std::string& device, std::chrono::steady_clock::time_point received,
                         attention::v1::ExecutionReport* report) {
  const ExtendOutcome& out = result.outcome;
  report->set_backend(backend);
  report->set_backend_reason(out.replayed      ? "replay: stored result"
                             : out.append_only ? "paged KV cache, append only (nothing attended)"
                                               : "paged KV cache, batched sequence steps");
  report->set_batch_size(static_cast<int32_t>(out.replayed ? 1 : result.launch_size));
  report->set_batch_tokens(out.replayed ? result.q_tokens : result.launch_tokens);
  report->set_flops(
      out.replayed ? 0.0 : 2.0 * result.q_tokens * out.kv_len * out.num_heads * out.head_dim);
  report->set_device(device);
  auto* t = report->mutable_times();
  t->set_decode_us(result.decode_us);
  t->set_queue_us(result.queue_us);
  t->set_kernel_us(out.kernel_us);
  t->set_host_to_device_us(out.h2d_us);
  t->set_device_to_host_us(out.d2h_us);
  t->set_batch_us(result.batch_us);
  t->set_batch_kernel_us(result.batch_kernel_us);
  t->set_device_untimed(!out.device_timed);
  t->set_total_us(std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - received)
                      .count());
}

}  // namespace attn
