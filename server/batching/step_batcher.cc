#include "batching/step_batcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <string_view>
#include <utility>

#include "backends/paged/extend_batch.h"
#include "common/deadline.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
}

/// The batching signature of a step: its q dtype (by number), N, K and H, e.g. "q2 N32 K8 H128",
/// short enough for std::string's inline buffer in the common shapes (no allocation per step).
std::string Signature(const ExtendArgs& a) {
  char buf[96];
  char* p = buf;
  char* const end = buf + sizeof(buf);
  const int64_t parts[4] = {static_cast<int64_t>(a.q_dtype), a.q_shape[1], a.k_shape[1],
                            a.q_shape[2]};
  const char tags[4] = {'q', 'N', 'K', 'H'};
  for (int i = 0; i < 4; ++i) {
    if (i > 0) *p++ = ' ';
    *p++ = tags[i];
    p = std::to_chars(p, end, parts[i]).ptr;  // 4 x (2 + at most 20 digits) fit in 96
  }
  return std::string(buf, static_cast<size_t>(p - buf));
}

/// Ok while `it` is wanted; else DEADLINE_EXCEEDED or CANCELLED saying it happened `when`.
Status StillWantedNow(const BatchItem& it, const char* when) {
  if (std::chrono::system_clock::now() >= it.deadline() || it.Cancelled()) {
    return AbandonedStatus(it.deadline(), std::string(when) + "; not applied");
  }
  return Status::Ok();
}

}  // namespace

class StepBatcher::StepItem final : public BatchItem {
 public:
  explicit StepItem(StepRequest r) : req(std::move(r)) {}
  bool Cancelled() const override { return req.cancelled && req.cancelled(); }
  // The sequence id, without a copy (the request lives as long as the item).
  std::string_view ExclusiveKey() const override { return req.args.sequence_id; }
  std::chrono::system_clock::time_point deadline() const override { return req.deadline; }
  void Drop(const Status& status) override {
    StepResult r;
    r.status = status;
    r.ran = false;
    req.done(std::move(r));
  }

  StepRequest req;
  StepResult result;  // the output buffer while the batch runs
  Clock::time_point queued_at;
};

/// A batch that ran, kept alive until its last response chunk is sent.
struct StepBatcher::Finished {
  std::vector<std::unique_ptr<BatchItem>> items;  // StepItem
  std::vector<BatchedExtend> steps;
  LaunchTimes total;
  int64_t batch_us = 0;
  bool decode_only = true;  // every step has T = 1
};

namespace {
// Responder threads per batch thread; chunks of at least kMinChunk responses per task.
constexpr int kRespondersPerBatchThread = 2;
constexpr size_t kMinChunk = 4;
}  // namespace

StepBatcher::StepBatcher(SequenceStore* store, PagedAttentionBackend* backend,
                         const BatchSchedulerOptions& options, std::function<int64_t()> now_us)
    : store_(store),
      backend_(backend),
      responders_(std::max(1, options.threads) * kRespondersPerBatchThread,
                  static_cast<size_t>(std::max<int64_t>(options.max_queued, 1))) {
  scheduler_ = std::make_unique<BatchScheduler>(
      options, [this](std::vector<std::unique_ptr<BatchItem>>& batch) { Run(batch); },
      std::move(now_us));
}

Status StepBatcher::Enqueue(std::vector<StepRequest>* steps) {
  std::vector<std::unique_ptr<BatchItem>> items;
  items.reserve(steps->size());
  const Clock::time_point now = Clock::now();
  for (StepRequest& r : *steps) {
    auto item = std::make_unique<StepItem>(std::move(r));
    item->signature = Signature(item->req.args);
    item->tokens = item->req.args.q_shape[0];
    item->queued_at = now;
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
  responders_.Stop();  // after the scheduler: sends the responses of the last batches
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (all_.batches == 0 || summary_logged_) return;
  summary_logged_ = true;
  LogTotals("sequence steps", all_);
  if (decode_.batches > 0) LogTotals("sequence steps, decode-only batches", decode_);
}

void StepBatcher::LogTotals(const char* what, const Totals& t) {
  const double n = static_cast<double>(t.batches);
  auto us = [n](int64_t ns) { return static_cast<double>(ns) / n / 1e3; };
  const double timed = static_cast<double>(std::max<int64_t>(t.timed_batches, 1));
  auto timed_us = [timed](int64_t ns) { return static_cast<double>(ns) / timed / 1e3; };
  spdlog::info(
      "{}: {} batches, {:.1f} steps per batch; mean per batch (us): wall {:.1f}, kernels {:.1f}, "
      "copies {:.1f} (device times of the {} timed batches); host phases: prepare {:.1f}, launch "
      "call {:.1f} (in GPU lanes: pack {:.1f}, enqueue {:.1f} of which cudaGraphLaunch {:.1f}, "
      "wait {:.1f}, finish {:.1f}, graph captures {:.1f}), commit {:.1f}; responses (responder "
      "threads) {:.1f}",
      what, t.batches, static_cast<double>(t.steps) / n, us(t.wall_ns), timed_us(t.timed_kernel_ns),
      timed_us(t.timed_copy_ns), t.timed_batches, us(t.phases.prepare_ns), us(t.phases.launch_ns),
      us(t.launch.pack_ns), us(t.launch.enqueue_ns), us(t.launch.graph_launch_ns),
      us(t.launch.wait_ns), us(t.launch.finish_ns), us(t.launch.capture_ns),
      us(t.phases.commit_ns), us(t.respond_ns));
}

void StepBatcher::Run(std::vector<std::unique_ptr<BatchItem>>& batch) {
  const Clock::time_point started = Clock::now();
  auto f = std::make_shared<Finished>();
  f->steps.resize(batch.size());
  bool& decode_only = f->decode_only;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto* it = static_cast<StepItem*>(batch[i].get());
    BatchedExtend& s = f->steps[i];
    s.args = &it->req.args;
    s.owner = &it->req.owner;
    s.o = &it->result.o;
    s.outcome = &it->result.outcome;
    // Checked again once the sequence is locked: with several batch threads this step may
    // have waited there behind another batch's step on the same sequence.
    s.still_wanted = [it]() {
      return StillWantedNow(*it, "while the step waited for an earlier step of its sequence");
    };
    // Asked from the paged-cpu computation's threads: deadline() and Cancelled() are safe to
    // call from any thread (a time point set at enqueue; the gRPC context's IsCancelled).
    s.still_running = [it]() {
      return StillWantedNow(*it, "while the step's attention was computed (stopped part-way)");
    };
    decode_only = decode_only && it->req.args.q_shape[0] == 1;
  }
  StepPhases phases;
  RunExtendSteps(store_, backend_, f->steps.data(), f->steps.size(), &f->total, &phases);
  const Clock::time_point ran = Clock::now();
  f->batch_us = Us(started, ran);
  if (on_fault_) {
    for (const BatchedExtend& s : f->steps) {
      if (s.status.code() == StatusCode::kInternal) {
        on_fault_();
        break;
      }
    }
  }
  if (on_batch_) {
    int64_t tokens = 0;
    for (const BatchedExtend& s : f->steps) tokens += s.args->q_shape[0];
    on_batch_(static_cast<int64_t>(f->steps.size()), tokens);
  }
  const int64_t wall_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(ran - started).count();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    for (Totals* t : {&all_, decode_only ? &decode_ : nullptr}) {
      if (t == nullptr) continue;
      ++t->batches;
      t->steps += static_cast<int64_t>(batch.size());
      t->wall_ns += wall_ns;
      t->launch += f->total;
      t->phases += phases;
      if (f->total.device_timed()) {
        ++t->timed_batches;
        t->timed_kernel_ns += f->total.kernel_ns;
        t->timed_copy_ns += f->total.h2d_ns + f->total.d2h_ns;
      }
    }
  }
  spdlog::trace(
      "sequence steps: batch of {} ran in {} us ({} us in kernels; prepare {} launch call {} "
      "commit {} us)",
      batch.size(), f->batch_us, f->total.kernel_ns / 1000, phases.prepare_ns / 1000,
      phases.launch_ns / 1000, phases.commit_ns / 1000);
  // The batch's items move into `f`; the responders own them from here.
  f->items = std::move(batch);
  batch.clear();
  const size_t n = f->items.size();
  if (n <= kMinChunk) {
    // One small chunk (decode at small batch sizes): answering here costs a few microseconds
    // of the batch thread and saves a thread hand-off (a wake-up) on every call's latency.
    Respond(*f, 0, n);
    return;
  }
  const size_t per = std::max(kMinChunk, (n + static_cast<size_t>(responders_.threads()) - 1) /
                                             static_cast<size_t>(responders_.threads()));
  for (size_t begin = 0; begin < n; begin += per) {
    const size_t end = std::min(n, begin + per);
    if (!responders_.TrySubmit([this, f, begin, end] { Respond(*f, begin, end); })) {
      Respond(*f, begin, end);  // responder queue full or stopping: answer here
    }
  }
}

void StepBatcher::Respond(Finished& f, size_t begin, size_t end) {
  const Clock::time_point t0 = Clock::now();
  for (size_t i = begin; i < end; ++i) {
    auto* it = static_cast<StepItem*>(f.items[i].get());
    const BatchedExtend& s = f.steps[i];
    StepResult& r = it->result;
    r.status = s.status;
    r.ran = s.status.ok() || !s.dropped;
    if (!s.status.ok()) {
      r.o.clear();
      it->req.done(std::move(r));
      continue;
    }
    r.q_tokens = it->req.args.q_shape[0];
    r.launch_size = s.launch_size;
    r.launch_tokens = s.launch_tokens;
    r.decode_us = std::max<int64_t>(0, Us(it->req.received, it->queued_at));
    r.queue_us = std::max<int64_t>(0, it->dequeued_us - it->enqueued_us);
    r.batch_us = f.batch_us;
    r.batch_kernel_us = f.total.device_timed() ? f.total.kernel_ns / 1000 : 0;
    it->req.done(std::move(r));
  }
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(stats_mu_);
  all_.respond_ns += ns;
  if (f.decode_only) decode_.respond_ns += ns;
}

}  // namespace attn
