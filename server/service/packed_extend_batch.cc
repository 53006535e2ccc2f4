// SequenceServiceImpl's packed ExtendBatch (sequence.proto PackedExtendBatch): the batch is
// validated whole (packed_batch_validator.h), each step becomes one StepRequest whose q/k/v
// alias its rows of the batch's tensors (so packed steps batch with steps of other calls in the
// step batcher), and each step's result is copied once into its rows of the one o ((total_tokens,
// N, H): the response's o data, or o_region's bytes), rows of failed steps zero. The response
// gets one PackedStepResult per step, in request order, and one ExecutionReport: the times of
// the slowest step that ran (the one answered last), batch_size = the request's steps,
// batch_tokens = total_tokens, flops summed over the steps.
// CUDA IPC regions (issue 18 item 3): the steps' flagged q/k/v/o are device addresses
// (ExtendArgs::device) that the GPU paged backend copies device to device after waiting on the
// client's event; rows of failed steps are zeroed on the device, and once the last step is
// recorded the server's event is recorded (and waited for) before the call is answered.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "service/call_regions.h"
#include "service/extend_response.h"
#include "service/sequence_service.h"
#include "validation/attend_validator.h"
#include "validation/sequence_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;

/// One packed batch in flight: its validated steps and what their results go into.
struct PackedCall {
  PackedCall(const shm::RegionRegistry *registry, const std::string &owner)
      : regions(registry, owner) {}
  // The region slices the batch names, pinned until the last step is recorded (its o rows
  // written); checked then: a region its client shrank fails the call.
  CallRegions regions;
  PackedBatch batch;
  pb::ExtendBatchResponse *response = nullptr;
  char *o = nullptr;  // rows of o: the response's o data or o_region's bytes (null: append-only)
  shm::DeviceRegion *device = nullptr;  // the call's CUDA IPC region (pinned by `regions`)
  bool o_on_device = false;             // `o` is a device address in `device`
  Status device_error;                  // the first failed zeroing of o rows (under mu)
  std::atomic<int> left{0};
  std::mutex mu;            // guards what follows and the response's report
  bool any_result = false;  // some step ran or failed on its own
  Status dropped;           // why the steps were dropped, when none ran
  int64_t slowest_us = -1;  // total_us of the step whose times the report carries
  double flops = 0;
};

/// Lays out the response: one (empty) result per step, o's dtype and shape, o's zeroed data
/// when it goes into the response. Returns where o's rows go (null: append-only).
char *PrepareResponse(const PackedBatch &b, pb::ExtendBatchResponse *response) {
  for (size_t i = 0; i < b.steps.size(); ++i) response->add_steps();
  pb::Tensor *o = response->mutable_o();
  o->set_dtype(DTypeToProto(b.dtype));
  o->add_shape(b.total_tokens);
  o->add_shape(b.num_heads);
  o->add_shape(b.head_dim);
  if (b.append_only) return nullptr;
  if (b.o != nullptr) return static_cast<char *>(b.o);
  o->mutable_data()->resize(static_cast<size_t>(b.total_tokens) * b.o_row_bytes);  // zeros
  return o->mutable_data()->data();
}

/// Flags the steps' tensors that lie in the call's CUDA IPC region (field names as the
/// validator resolved them) and points each step's device o at its rows.
void MarkDeviceSteps(PackedCall &c) {
  PackedBatch &b = c.batch;
  const bool q = c.regions.OnDevice("packed.q_region");
  const bool k = c.regions.OnDevice("packed.k_region");
  const bool v = c.regions.OnDevice("packed.v_region");
  c.o_on_device = c.o != nullptr && c.regions.OnDevice("packed.o_region");
  for (size_t i = 0; i < b.steps.size(); ++i) {
    DeviceStepIo &d = b.steps[i].device;
    d.q = q && !b.append_only;
    d.k = k;
    d.v = v;
    d.ready_event = d.inputs() ? c.device->client_event() : nullptr;
    d.o = c.o_on_device ? c.o + static_cast<uint64_t>(b.first_row[i]) * b.o_row_bytes : nullptr;
  }
}

/// Writes step `i`'s result into its PackedStepResult and its rows of o (zeros on error). Rows
/// in a CUDA IPC region: a step that ran wrote them on the device; a failed one's are zeroed.
void RecordStep(PackedCall &c, size_t i, const StepResult &step) {
  pb::PackedStepResult *r = c.response->mutable_steps(static_cast<int>(i));
  const PackedBatch &b = c.batch;
  const uint64_t row = static_cast<uint64_t>(b.first_row[i]);
  const uint64_t rows_bytes = static_cast<uint64_t>(b.steps[i].q_shape[0]) * b.o_row_bytes;
  if (!step.status.ok()) {
    r->set_code(static_cast<int32_t>(step.status.code()));
    // A protobuf string must be valid UTF-8, or the client cannot parse the whole response.
    r->set_message(Utf8SafeEcho(step.status.message(), std::numeric_limits<size_t>::max()));
    if (c.o_on_device) {
      Status z = c.device->Zero(reinterpret_cast<uint8_t *>(c.o + row * b.o_row_bytes),
                                static_cast<int64_t>(rows_bytes));
      std::lock_guard<std::mutex> lock(c.mu);
      if (!z.ok() && c.device_error.ok()) c.device_error = z;
    } else if (c.o != nullptr && b.o != nullptr) {
      std::memset(c.o + row * b.o_row_bytes, 0, rows_bytes);
    }
    return;
  }
  r->set_length(step.outcome.length);
  r->set_replayed(step.outcome.replayed);
  r->set_kv_len(step.outcome.kv_len);
  if (!c.o_on_device && c.o != nullptr && step.o.size() == rows_bytes) {
    std::memcpy(c.o + row * b.o_row_bytes, step.o.data(), rows_bytes);
  }
}

/// The call's end on its CUDA IPC region: the first zeroing error, else the server's event
/// recorded and waited for (OK when the call names no such region).
Status SignalDevice(PackedCall &c) {
  if (c.device == nullptr) return Status::Ok();
  ATTN_RETURN_IF_ERROR(c.device_error);
  return c.device->SignalWritten();
}

}  // namespace

void SequenceServiceImpl::RunPackedBatch(grpc::CallbackServerContext *context,
                                         const std::string &owner, metrics::Method method,
                                         const pb::ExtendBatchRequest *request,
                                         pb::ExtendBatchResponse *response, BatchDone done) {
  auto call = std::make_shared<PackedCall>(shm_regions_, owner);
  CallRegions *regions = &call->regions;
  auto batch = ValidatePackedExtendBatch(
      request->packed(),
      [regions](const char *field, const pb::RegionSlice &slice, uint64_t bytes, bool writable) {
        return regions->Resolve(("packed." + std::string(field)).c_str(), slice, bytes, writable);
      });
  if (!batch.ok()) {
    done(batch.status());
    return;
  }
  double pairs = 0;
  int64_t head_dim = 0;
  for (const ExtendArgs &a : batch->steps) {
    if (Status r = CheckReach(a); !r.ok()) {
      done(r);  // as one piece, like the batch's validation
      return;
    }
    pairs += StepScorePairs(a);
    head_dim = std::max(head_dim, a.q_shape[2]);
  }
  if (Status w = CheckWork(pairs, head_dim); !w.ok()) {
    done(w);  // the packed batch as one piece: nothing queued, no step applied
    return;
  }
  call->batch = std::move(*batch);
  call->response = response;
  call->o = PrepareResponse(call->batch, response);
  call->device = call->regions.device();
  if (call->device != nullptr) MarkDeviceSteps(*call);
  const auto n_steps = static_cast<int32_t>(call->batch.steps.size());
  std::vector<StepRequest> steps;
  steps.reserve(call->batch.steps.size());
  for (size_t i = 0; i < call->batch.steps.size(); ++i) {
    StepRequest r = NewStep(context, owner, call->batch.steps[i]);
    r.done = [this, call, i, done, n_steps, received = r.received](StepResult &&step) {
      RecordStep(*call, i, step);
      {
        std::lock_guard<std::mutex> lock(call->mu);
        if (step.ran) {
          call->any_result = true;
        } else if (call->dropped.ok()) {
          call->dropped = step.status;
        }
        if (step.status.ok()) {
          const ExtendOutcome &out = step.outcome;
          if (!out.replayed) {
            call->flops += 2.0 * step.q_tokens * out.kv_len * out.num_heads * out.head_dim;
          }
          const int64_t total_us =
              std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - received)
                  .count();
          if (total_us >= call->slowest_us) {
            call->slowest_us = total_us;
            FillExecutionReport(step, backend_->name(), backend_->device(), received,
                                call->response->mutable_report());
          }
        }
      }
      if (call->left.fetch_sub(1) != 1) return;
      std::lock_guard<std::mutex> lock(call->mu);
      pb::ExecutionReport *report = call->response->mutable_report();
      report->set_backend(backend_->name());
      report->set_device(backend_->device());
      report->set_backend_reason("paged KV cache, packed batch of sequence steps");
      report->set_batch_size(n_steps);
      report->set_batch_tokens(call->batch.total_tokens);
      report->set_flops(call->flops);
      // Every read of q/k/v and write of o is over (on the device: once the event is waited
      // for); trust none of it if a region shrank.
      if (Status signalled = SignalDevice(*call); !signalled.ok()) {
        done(signalled);
        return;
      }
      if (Status intact = call->regions.CheckIntact(); !intact.ok()) {
        done(Status(intact.code(), intact.message() +
                                       "; the batch's steps that ran were applied with the "
                                       "bytes read (zeros past the cut): truncate or recreate "
                                       "those sequences"));
        return;
      }
      done(call->any_result ? Status::Ok() : call->dropped);
    };
    InstrumentStep(method, &r);
    steps.push_back(std::move(r));
  }
  call->left.store(n_steps);
  if (Status s = steps_->Enqueue(&steps); !s.ok()) done(s);
}

}  // namespace attn
