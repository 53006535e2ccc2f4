#include "batching/step_batcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "kv_cache/extend_batch.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
}

}  // namespace

class StepBatcher::StepItem final : public BatchItem {
 public:
  explicit StepItem(StepRequest r) : req(std::move(r)) {}
  bool Cancelled() const override { return req.context->IsCancelled(); }
  std::chrono::system_clock::time_point deadline() const override {
    return req.context->deadline();
  }
  void Drop(const Status& status) override {
    req.response->Clear();
    req.done(status, false);
  }

  StepRequest req;
  Clock::time_point queued_at;
};

StepBatcher::StepBatcher(SequenceStore* store, PagedAttentionBackend* backend,
                         const BatchSchedulerOptions& options)
    : store_(store), backend_(backend) {
  scheduler_ = std::make_unique<BatchScheduler>(
      options, [this](std::vector<std::unique_ptr<BatchItem>>& batch) { Run(batch); });
}

Status StepBatcher::Enqueue(std::vector<StepRequest>* steps) {
  std::vector<std::unique_ptr<BatchItem>> items;
  items.reserve(steps->size());
  for (StepRequest& r : *steps) {
    const ExtendArgs& a = r.args;
    std::string sig = std::string(kernels::DTypeName(a.q_dtype)) + "|N" +
                      std::to_string(a.q_shape[1]) + "|K" + std::to_string(a.k_shape[1]) +
                      "|H" + std::to_string(a.q_shape[2]);
    auto item = std::make_unique<StepItem>(std::move(r));
    item->signature = std::move(sig);
    item->tokens = item->req.args.q_shape[0];
    item->exclusive_key = item->req.args.sequence_id;
    item->queued_at = Clock::now();
    items.push_back(std::move(item));
  }
  Status s = scheduler_->Enqueue(&items);
  if (!s.ok()) {
    // Give the requests back untouched (their `done` is not called).
    for (size_t i = 0; i < items.size(); ++i) {
      (*steps)[i] = std::move(static_cast<StepItem*>(items[i].get())->req);
    }
    return s;
  }
  steps->clear();
  return Status::Ok();
}

void StepBatcher::Stop() {
  scheduler_->Stop();
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (batches_ == 0 || summary_logged_) return;
  summary_logged_ = true;
  const double n = static_cast<double>(batches_);
  auto us = [n](int64_t ns) { return static_cast<double>(ns) / n / 1e3; };
  spdlog::info(
      "sequence steps: {} batches, {:.1f} steps per batch; mean per batch (us): wall {:.1f}, "
      "kernels {:.1f}, copies {:.1f}; host phases: prepare {:.1f}, append call {:.1f}, attend "
      "call {:.1f}, commit {:.1f}",
      batches_, static_cast<double>(steps_) / n, us(wall_ns_), us(launch_totals_.kernel_ns),
      us(launch_totals_.h2d_ns + launch_totals_.d2h_ns), us(phase_totals_.prepare_ns),
      us(phase_totals_.append_ns), us(phase_totals_.attend_ns), us(phase_totals_.commit_ns));
}

void StepBatcher::Run(std::vector<std::unique_ptr<BatchItem>>& batch) {
  const Clock::time_point started = Clock::now();
  std::vector<StepItem*> items;
  std::vector<BatchedExtend> steps(batch.size());
  std::vector<ExtendOutcome> outcomes(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto* it = static_cast<StepItem*>(batch[i].get());
    items.push_back(it);
    BatchedExtend& s = steps[i];
    s.args = &it->req.args;
    s.owner = &it->req.owner;
    s.o = it->req.response->mutable_o()->mutable_data();
    s.outcome = &outcomes[i];
  }
  LaunchTimes total;
  StepPhases phases;
  RunExtendSteps(store_, backend_, steps.data(), steps.size(), &total, &phases);
  const Clock::time_point ran = Clock::now();
  const int64_t batch_us = Us(started, ran);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++batches_;
    steps_ += static_cast<int64_t>(batch.size());
    wall_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(ran - started).count();
    launch_totals_ += total;
    phase_totals_ += phases;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    StepItem* it = items[i];
    const BatchedExtend& s = steps[i];
    const ExtendOutcome& out = outcomes[i];
    attention::v1::ExtendResponse* response = it->req.response;
    if (!s.status.ok()) {
      response->Clear();
      it->req.done(s.status, true);
      continue;
    }
    const ExtendArgs& a = it->req.args;
    attention::v1::Tensor* o = response->mutable_o();
    o->set_dtype(DTypeToProto(out.dtype));
    o->add_shape(a.q_shape[0]);
    o->add_shape(out.num_heads);
    o->add_shape(out.head_dim);
    response->set_length(out.length);
    response->set_replayed(out.replayed);
    auto* report = response->mutable_report();
    report->set_backend(backend_->name());
    report->set_backend_reason(out.replayed ? "replay: stored result"
                                            : "paged KV cache, batched sequence steps");
    report->set_batch_size(static_cast<int32_t>(out.replayed ? 1 : s.launch_size));
    report->set_batch_tokens(out.replayed ? a.q_shape[0] : s.launch_tokens);
    report->set_flops(out.replayed ? 0.0
                                   : 2.0 * a.q_shape[0] * out.kv_len * out.num_heads *
                                         out.head_dim);
    report->set_device(backend_->name());
    auto* t = report->mutable_times();
    t->set_decode_us(std::max<int64_t>(0, Us(it->req.received, it->queued_at)));
    t->set_queue_us(std::max<int64_t>(0, it->dequeued_us - it->enqueued_us));
    t->set_kernel_us(out.kernel_us);
    t->set_host_to_device_us(out.h2d_us);
    t->set_device_to_host_us(out.d2h_us);
    t->set_batch_us(batch_us);
    t->set_batch_kernel_us(total.kernel_ns / 1000);
    t->set_total_us(Us(it->req.received, Clock::now()));
    it->req.done(Status::Ok(), true);
  }
  spdlog::trace(
      "sequence steps: batch of {} ran in {} us ({} us in kernels; prepare {} append {} attend {} "
      "commit {} us)",
      items.size(), batch_us, total.kernel_ns / 1000, phases.prepare_ns / 1000,
      phases.append_ns / 1000, phases.attend_ns / 1000, phases.commit_ns / 1000);
}

}  // namespace attn
