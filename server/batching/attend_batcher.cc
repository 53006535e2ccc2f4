#include "batching/attend_batcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "batching/attend_coalescer.h"
#include "common/deadline.h"

namespace attn {

// One queued call: the work and its scheduler bookkeeping (BatchItem).
class AttendBatcher::AttendItem final : public BatchItem {
 public:
  explicit AttendItem(AttendWork w) : work(std::move(w)) {}
  bool Cancelled() const override { return work.cancelled && work.cancelled(); }
  std::chrono::system_clock::time_point deadline() const override { return work.deadline; }
  void Drop(const Status& status) override { Finish(status); }

  /// True when nobody waits for the result any more: cancelled, or past its deadline.
  bool Abandoned() const {
    return Cancelled() || std::chrono::system_clock::now() >= work.deadline;
  }
  /// Why a computation stopped for this call (after the backend returned CANCELLED).
  Status StopStatus() const {
    return AbandonedStatus(work.deadline, "while computing; the computation was stopped");
  }
  /// Sizes result.o (and result.lse) for the call's output; returns the lse buffer or null.
  float* AllocateOutput() {
    const ValidatedAttend& v = *work.validated;
    result.o.resize(v.o_bytes);
    if (!v.shape.return_lse) return nullptr;
    result.lse.resize(static_cast<size_t>(v.shape.lse_elements()) * sizeof(float));
    return reinterpret_cast<float*>(result.lse.data());
  }
  /// Answers the call with `status` (an error: no output).
  void Finish(const Status& status) {
    AttendResult r;
    r.status = status;
    work.done(std::move(r));
  }
  /// Answers the call OK with `result` and the launch's numbers.
  void FinishOk(const ExecuteTimes& times, int64_t batch_size, int64_t batch_tokens) {
    result.status = Status::Ok();
    result.times = times;
    result.batch_size = batch_size;
    result.batch_tokens = batch_tokens;
    result.queue_us = std::max<int64_t>(0, dequeued_us - enqueued_us);
    work.done(std::move(result));
  }

  AttendWork work;
  AttendResult result;  // output buffers while computing
};

AttendBatcher::AttendBatcher(const BatchSchedulerOptions& options, std::function<void()> on_fault,
                             std::function<int64_t()> now_us)
    : on_fault_(std::move(on_fault)) {
  scheduler_ = std::make_unique<BatchScheduler>(
      options, [this](std::vector<std::unique_ptr<BatchItem>>& batch) { RunBatch(batch); },
      std::move(now_us));
}

Status AttendBatcher::Enqueue(AttendWork work) {
  auto item = std::make_unique<AttendItem>(std::move(work));
  const ValidatedAttend& v = *item->work.validated;
  item->signature = AttendSignature(v, item->work.backend->name());
  // A call that may not share a launch (MayCoalesce) gets a signature of its own.
  if (!MayCoalesce(v, *item->work.backend)) {
    item->signature += "|call" + std::to_string(reinterpret_cast<uintptr_t>(item.get()));
  }
  item->tokens = v.query_tokens;
  std::unique_ptr<BatchItem> queued = std::move(item);
  return scheduler_->Enqueue(&queued);
}

void AttendBatcher::RunBatch(std::vector<std::unique_ptr<BatchItem>>& batch) {
  std::vector<AttendItem*> calls;
  calls.reserve(batch.size());
  for (auto& item : batch) calls.push_back(static_cast<AttendItem*>(item.get()));
  if (calls.size() > 1 && RunPacked(calls)) return;
  for (AttendItem* c : calls) {
    if (c->Cancelled()) {
      c->Finish(AbandonedStatus(c->work.deadline, "while queued; the call was not computed"));
      continue;
    }
    RunAlone(c);
  }
}

bool AttendBatcher::RunPacked(std::vector<AttendItem*>& calls) {
  std::vector<const ValidatedAttend*> parts;
  parts.reserve(calls.size());
  for (AttendItem* c : calls) parts.push_back(c->work.validated);
  Backend* backend = calls.front()->work.backend;
  auto packed = PackedAttend::Plan(parts);
  Status s = packed.ok() ? backend->Supports(packed->shape()) : packed.status();
  ExecuteTimes times;
  if (s.ok()) {
    // The outputs are sized here, before the backend holds its lane: unpack only copies.
    std::vector<float*> lse_out(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) lse_out[i] = calls[i]->AllocateOutput();
    StagedProblem problem;
    problem.index = packed->IndexTensors();
    problem.pack = [&](void* q, void* k, void* v) { packed->PackInto(parts, q, k, v); };
    problem.unpack = [&](const void* o, const float* lse) {
      for (size_t i = 0; i < calls.size(); ++i) {
        packed->ScatterFrom(i, *parts[i], o, lse, calls[i]->result.o.data(), lse_out[i]);
      }
    };
    // The launch stops (cpu reference) once every call in it is abandoned.
    problem.should_stop = [&calls] {
      for (const AttendItem* c : calls) {
        if (!c->Abandoned()) return false;
      }
      return true;
    };
    s = backend->ExecuteStaged(packed->shape(), problem, &times);
  }
  if (s.code() == StatusCode::kCancelled) {
    for (AttendItem* c : calls) c->Finish(c->StopStatus());
    return true;
  }
  if (s.code() == StatusCode::kInternal) {
    if (on_fault_) on_fault_();
    for (AttendItem* c : calls) c->Finish(s);
    return true;
  }
  if (!s.ok()) {
    // The packed problem cannot run as one launch here: each call runs on its own.
    spdlog::debug("Attend: batch of {} not launched together ({}); running them one by one",
                  calls.size(), s.ToString());
    return false;
  }
  const int64_t n = static_cast<int64_t>(calls.size());
  const int64_t tokens = packed->query_tokens();
  double flops = 0;
  for (AttendItem* c : calls) {
    flops += c->work.validated->flops;
    c->FinishOk(times, n, tokens);  // its output was scattered by unpack
  }
  if (on_launch_) on_launch_({backend, n, tokens, flops, &packed->shape(), times.kernel_us});
  return true;
}

void AttendBatcher::RunAlone(AttendItem* call) {
  const ValidatedAttend& v = *call->work.validated;
  float* lse = call->AllocateOutput();
  ExecuteTimes times;
  Status s = call->work.backend->ExecuteUntil(
      v.shape, v.Tensors(call->result.o.data(), lse), [call] { return call->Abandoned(); }, &times);
  if (s.code() == StatusCode::kCancelled) s = call->StopStatus();
  if (!s.ok()) {
    if (s.code() == StatusCode::kInternal && on_fault_) on_fault_();
    call->Finish(s);
    return;
  }
  if (on_launch_) {
    on_launch_({call->work.backend, 1, v.query_tokens, v.flops, &v.shape, times.kernel_us});
  }
  call->FinishOk(times, 1, v.query_tokens);
}

}  // namespace attn
