#include "service/sequence_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <utility>

#include "backends/paged/extend_step.h"
#include "common/deadline.h"
#include "service/cancellable_reactor.h"
#include "service/extend_response.h"
#include "service/grpc_status.h"
#include "validation/attend_validator.h"
#include "validation/sequence_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;
using kernels::DType;

void FillInfo(const SequenceStore &store, const Sequence &s, pb::SequenceInfo *info) {
  const SequenceConfig &c = s.config;
  info->set_sequence_id(s.id);
  info->set_num_layers(c.num_layers);
  info->set_num_kv_heads(c.num_kv_heads);
  info->set_head_dim(c.head_dim);
  info->set_num_heads(c.num_heads);
  info->set_dtype(DTypeToProto(c.dtype));
  info->set_kv_cache_dtype(DTypeToProto(c.kv_dtype));
  int64_t pages = 0, reserved = 0;
  for (const LayerState &l : s.layers) {
    info->add_layer_lengths(l.table.length());
    pages += l.table.num_blocks();
    reserved += static_cast<int64_t>(l.spare.size());
    if (c.kv_dtype == DType::kFloat8E4M3) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        info->add_k_scales(l.k_scales.empty() ? 0.f : l.k_scales[h]);
        info->add_v_scales(l.v_scales.empty() ? 0.f : l.v_scales[h]);
      }
    }
  }
  info->set_pages(pages);
  info->set_reserved_pages(reserved);
  info->set_page_tokens(store.pool()->page_tokens());
  info->set_scale(c.scale);
  info->set_fp8_saturations(s.fp8_saturations);
  info->set_idle_us(std::max<int64_t>(0, store.now_us() - s.last_used_us));
  info->set_replica_address(store.options().replica_address);
}

/// The code the client saw of a call the server finished with `code`: when the client had
/// cancelled, or its deadline had passed, before the answer, it saw CANCELLED or
/// DEADLINE_EXCEEDED whatever the server computed (attn_requests_total counts that).
StatusCode SeenByClient(grpc::CallbackServerContext *context, StatusCode code) {
  return context->IsCancelled() ? CancelledCallCode(context->deadline()) : code;
}

}  // namespace

void FillKvCacheInfo(SequenceStore &store, pb::KvCacheInfo *info) {
  store.SweepExpired();
  const PagePool *pool = store.pool();
  info->set_page_tokens(pool->page_tokens());
  info->set_pool_bytes(static_cast<int64_t>(pool->pool_bytes()));
  info->set_pool_used_bytes(static_cast<int64_t>(pool->pool_used_bytes()));
  info->set_sequences(store.live_sequences());
  info->set_fp8_saturations(store.saturations());
  info->set_evictions(store.evictions());
  info->set_expirations(store.expirations());
  for (const KvClassStats &s : pool->Stats()) {
    auto *c = info->add_classes();
    c->set_num_kv_heads(s.layout.num_kv_heads);
    c->set_head_dim(s.layout.head_dim);
    c->set_kv_dtype(DTypeToProto(s.layout.kv_dtype));
    c->set_pages_total(s.pages_total);
    c->set_pages_used(s.pages_used);
    c->set_page_bytes(s.page_bytes);
  }
}

SequenceServiceImpl::SequenceServiceImpl(SequenceStore *store, PagedAttentionBackend *backend,
                                         WorkerPool *workers, const BatchSchedulerOptions &batching)
    : store_(store),
      backend_(backend),
      workers_(workers),
      steps_(std::make_unique<StepBatcher>(store, backend, batching)) {}

bool SequenceServiceImpl::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return in_flight_.load() == 0; });
}

bool SequenceServiceImpl::WaitSequencesGone(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    store_->SweepExpired();  // TTL expiry needs no lookup to happen while draining
    if (store_->live_sequences() == 0 && in_flight_.load() == 0) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
  }
}

grpc::ServerUnaryReactor *SequenceServiceImpl::RefuseNewSequence(
    grpc::CallbackServerContext *context) {
  grpc::ServerUnaryReactor *reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(
      Unavailable("server is draining for shutdown: it still serves the sequences it holds but "
                  "creates no new ones; create the sequence on another replica")));
  return reactor;
}

void SequenceServiceImpl::CallDone() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_cv_.notify_all();
  }
}

void SequenceServiceImpl::Observe(metrics::Method method, StatusCode code,
                                  Clock::time_point start) const {
  if (metrics_ == nullptr) return;
  metrics_->ObserveRequest(method, 0, code,
                           std::chrono::duration<double>(Clock::now() - start).count());
}

void SequenceServiceImpl::SetMetrics(metrics::Metrics *metrics) {
  metrics_ = metrics;
  if (metrics == nullptr) {
    steps_->SetBatchObserver(nullptr);
    return;
  }
  metrics_backend_ = metrics->BackendIndex(backend_->name());
  steps_->SetBatchObserver([metrics, b = metrics_backend_](int64_t steps, int64_t tokens) {
    metrics->ObserveStepBatch(b, steps, tokens);
  });
}

void SequenceServiceImpl::InstrumentStep(metrics::Method method, StepRequest *r) const {
  if (metrics_ == nullptr) return;
  // A decode step: one query token that attends (the inter-token latency's server part).
  const bool decode = !r->args.append_only && r->args.q_shape[0] == 1;
  r->done = [m = metrics_, b = metrics_backend_, method, decode, received = r->received,
             done = std::move(r->done)](StepResult &&result) {
    m->ObserveStep(method, result.status.ok(),
                   std::chrono::duration<double>(Clock::now() - received).count(), decode);
    if (result.status.ok() && result.ran) {
      const ExtendOutcome &out = result.outcome;
      m->ObservePhase(b, metrics::Phase::kDecode, static_cast<double>(result.decode_us) * 1e-6);
      m->ObservePhase(b, metrics::Phase::kQueue, static_cast<double>(result.queue_us) * 1e-6);
      if (out.device_timed) {  // else not measured (--kv-timing-every)
        m->ObservePhase(b, metrics::Phase::kHostToDevice, static_cast<double>(out.h2d_us) * 1e-6);
        m->ObservePhase(b, metrics::Phase::kKernel, static_cast<double>(out.kernel_us) * 1e-6);
        m->ObservePhase(b, metrics::Phase::kDeviceToHost, static_cast<double>(out.d2h_us) * 1e-6);
      }
    }
    done(std::move(result));
  };
}

StepRequest SequenceServiceImpl::NewStep(grpc::CallbackServerContext *context,
                                         const std::string &owner, ExtendArgs args) {
  StepRequest r;
  r.cancelled = [context] { return context->IsCancelled(); };
  r.deadline = context->deadline();
  r.owner = owner;
  r.args = std::move(args);
  return r;
}

template <typename Fn>
grpc::ServerUnaryReactor *SequenceServiceImpl::Submit(grpc::CallbackServerContext *context,
                                                      metrics::Method method, Fn fn,
                                                      bool run_here_when_full) {
  grpc::ServerUnaryReactor *reactor = context->DefaultReactor();
  const Clock::time_point start = Clock::now();
  CallStarted();  // while draining, calls on existing sequences are still served
  auto task = [this, context, reactor, fn, method, start]() mutable {
    Status s;
    if (context->IsCancelled() || std::chrono::system_clock::now() >= context->deadline()) {
      s = AbandonedStatus(context->deadline(), "before the call ran");
    } else {
      s = fn();
    }
    if (!s.ok()) spdlog::debug("SequenceService call failed: {}", s.ToString());
    const StatusCode seen = SeenByClient(context, s.code());  // before Finish frees context
    reactor->Finish(ToGrpc(s));
    Observe(method, seen, start);
    CallDone();
  };
  if (run_here_when_full) {
    if (!workers_->TrySubmit(task)) task();  // a copy goes to the queue; this one runs here
    return reactor;
  }
  if (!workers_->TrySubmit(std::move(task))) {
    reactor->Finish(ToGrpc(ResourceExhausted("request queue is full (--max-queue-requests=" +
                                             std::to_string(workers_->max_queued()) + ")")));
    Observe(method, StatusCode::kResourceExhausted, start);
    CallDone();
  }
  return reactor;
}

grpc::ServerUnaryReactor *SequenceServiceImpl::CreateSequence(
    grpc::CallbackServerContext *context, const pb::CreateSequenceRequest *request,
    pb::CreateSequenceResponse *response) {
  if (draining_.load()) return RefuseNewSequence(context);
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  return Submit(
      context, metrics::Method::kCreateSequence, [this, owner, request, response]() -> Status {
        auto config = ValidateCreateSequence(*request);
        if (!config.ok()) return config.status();
        ATTN_RETURN_IF_ERROR(backend_->SupportsSequence(config->dtype, config->kv_dtype,
                                                        config->num_heads, config->num_kv_heads,
                                                        config->head_dim));
        auto seq = store_->Create(owner, std::move(*config));
        if (!seq.ok()) return seq.status();
        FillInfo(*store_, *seq->seq, response->mutable_sequence());
        return Status::Ok();
      });
}

grpc::ServerUnaryReactor *SequenceServiceImpl::Extend(grpc::CallbackServerContext *context,
                                                      const pb::ExtendRequest *request,
                                                      pb::ExtendResponse *response) {
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  // Continuous batching: the step waits in the step batcher with steps of other calls.
  auto *reactor = new CancellableUnaryReactor([this] { steps_->Notify(); });
  CallStarted();
  auto finish = [this, context, reactor, start = Clock::now()](const Status &s) {
    if (!s.ok()) spdlog::debug("Extend failed: {}", s.ToString());
    const StatusCode seen = SeenByClient(context, s.code());  // before Finish frees context
    reactor->Finish(ToGrpc(s));
    Observe(metrics::Method::kExtend, seen, start);
    CallDone();
  };
  auto args = ValidateStep(*request);
  if (!args.ok()) {
    finish(args.status());
    return reactor;
  }
  if (Status w = CheckWork(StepScorePairs(*args), args->q_shape[2]); !w.ok()) {
    finish(w);
    return reactor;
  }
  std::vector<StepRequest> steps;
  steps.push_back(NewStep(context, owner, std::move(*args)));
  steps[0].done = [this, finish, response, received = steps[0].received](StepResult &&r) {
    if (r.status.ok())
      FillExtendResponse(r, backend_->name(), backend_->device(), received, response);
    finish(r.status);
  };
  InstrumentStep(metrics::Method::kExtend, &steps[0]);
  if (Status s = steps_->Enqueue(&steps); !s.ok()) finish(s);
  return reactor;
}

grpc::ServerUnaryReactor *SequenceServiceImpl::ExtendBatch(grpc::CallbackServerContext *context,
                                                           const pb::ExtendBatchRequest *request,
                                                           pb::ExtendBatchResponse *response) {
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  auto *reactor = new CancellableUnaryReactor([this] { steps_->Notify(); });
  CallStarted();
  auto finish = [this, context, reactor, start = Clock::now()](const Status &s) {
    if (!s.ok()) spdlog::debug("ExtendBatch failed: {}", s.ToString());
    const StatusCode seen = SeenByClient(context, s.code());  // before Finish frees context
    reactor->Finish(ToGrpc(s));
    Observe(metrics::Method::kExtendBatch, seen, start);
    CallDone();
  };
  RunExtendBatch(context, owner, metrics::Method::kExtendBatch, request, response,
                 std::move(finish));
  return reactor;
}

void SequenceServiceImpl::RunExtendBatch(grpc::CallbackServerContext *context,
                                         const std::string &owner, metrics::Method method,
                                         const pb::ExtendBatchRequest *request,
                                         pb::ExtendBatchResponse *response, BatchDone done) {
  response->set_tag(request->tag());
  if (Status v = ValidateExtendBatch(*request); !v.ok()) {
    done(v);
    return;
  }
  if (request->has_packed()) {
    RunPackedBatch(context, owner, method, request, response, std::move(done));
  } else {
    RunStepBatch(context, owner, method, request, response, std::move(done));
  }
}

void SequenceServiceImpl::RunStepBatch(grpc::CallbackServerContext *context,
                                       const std::string &owner, metrics::Method method,
                                       const pb::ExtendBatchRequest *request,
                                       pb::ExtendBatchResponse *response, BatchDone finish) {
  // Each entry is one step in the step batcher, so entries batch with steps of other calls.
  // The call ends when its last entry does: OK with per-entry results, or, when no entry ran
  // or failed on its own (all dropped before launch), the status they were dropped with.
  struct Pending {
    std::atomic<int> left{0};
    std::mutex mu;
    bool any_result = false;  // some entry ran or failed validation
    Status dropped;
  };
  auto set_error = [](pb::ExtendResult *result, const Status &s) {
    result->clear_response();
    result->set_code(static_cast<int32_t>(s.code()));
    // A protobuf string must be valid UTF-8, or the client cannot parse the whole response
    // (and loses the results of the steps that were applied).
    result->set_message(Utf8SafeEcho(s.message(), std::numeric_limits<size_t>::max()));
  };
  for (int i = 0; i < request->steps_size(); ++i) response->add_results();
  auto pending = std::make_shared<Pending>();
  std::vector<StepRequest> steps;
  double pairs = 0;
  int64_t head_dim = 0;
  for (int i = 0; i < request->steps_size(); ++i) {
    pb::ExtendResult *result = response->mutable_results(i);
    auto args = ValidateStep(request->steps(i));
    if (!args.ok()) {
      set_error(result, args.status());
      pending->any_result = true;
      continue;
    }
    pairs += StepScorePairs(*args);
    head_dim = std::max(head_dim, args->q_shape[2]);
    StepRequest r = NewStep(context, owner, std::move(*args));
    r.done = [this, pending, result, finish, set_error, received = r.received](StepResult &&step) {
      const Status &s = step.status;
      if (s.ok()) {
        FillExtendResponse(step, backend_->name(), backend_->device(), received,
                           result->mutable_response());
      } else {
        set_error(result, s);
      }
      {
        std::lock_guard<std::mutex> lock(pending->mu);
        if (step.ran) {
          pending->any_result = true;
        } else if (pending->dropped.ok()) {
          pending->dropped = s;
        }
      }
      if (pending->left.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(pending->mu);
        finish(pending->any_result ? Status::Ok() : pending->dropped);
      }
    };
    InstrumentStep(method, &r);
    steps.push_back(std::move(r));
  }
  if (steps.empty()) {
    finish(Status::Ok());
    return;
  }
  if (Status w = CheckWork(pairs, head_dim); !w.ok()) {
    finish(w);  // the call as a whole: nothing queued, no step applied
    return;
  }
  pending->left.store(static_cast<int>(steps.size()));
  if (Status s = steps_->Enqueue(&steps); !s.ok()) finish(s);
}

grpc::ServerUnaryReactor *SequenceServiceImpl::TruncateSequence(
    grpc::CallbackServerContext *context, const pb::TruncateSequenceRequest *request,
    pb::TruncateSequenceResponse *response) {
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  return Submit(
      context, metrics::Method::kTruncateSequence, [this, owner, request, response]() -> Status {
        ATTN_RETURN_IF_ERROR(ValidateSequenceId(request->sequence_id()));
        if (request->length() < 0) {
          return InvalidArgument("length: expected >= 0, got " + std::to_string(request->length()));
        }
        auto seq = store_->Acquire(request->sequence_id(), owner);
        if (!seq.ok()) return seq.status();
        store_->Truncate(seq->seq.get(), request->length());
        FillInfo(*store_, *seq->seq, response->mutable_sequence());
        return Status::Ok();
      });
}

grpc::ServerUnaryReactor *SequenceServiceImpl::ForkSequence(grpc::CallbackServerContext *context,
                                                            const pb::ForkSequenceRequest *request,
                                                            pb::ForkSequenceResponse *response) {
  if (draining_.load()) return RefuseNewSequence(context);
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  return Submit(context, metrics::Method::kForkSequence,
                [this, owner, request, response]() -> Status {
                  ATTN_RETURN_IF_ERROR(ValidateSequenceId(request->sequence_id()));
                  std::optional<int64_t> length;
                  if (request->has_length()) length = request->length();
                  auto child = store_->Fork(request->sequence_id(), owner, length);
                  if (!child.ok()) return child.status();
                  FillInfo(*store_, *child->seq, response->mutable_sequence());
                  return Status::Ok();
                });
}

grpc::ServerUnaryReactor *SequenceServiceImpl::ReleaseSequence(
    grpc::CallbackServerContext *context, const pb::ReleaseSequenceRequest *request,
    pb::ReleaseSequenceResponse *response) {
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  return Submit(
      context, metrics::Method::kReleaseSequence,
      [this, owner, request, response]() -> Status {
        ATTN_RETURN_IF_ERROR(ValidateSequenceId(request->sequence_id()));
        int64_t freed = 0;
        ATTN_RETURN_IF_ERROR(store_->Release(request->sequence_id(), owner, &freed));
        response->set_pages_freed(freed);
        return Status::Ok();
      },
      /*run_here_when_full=*/true);
}

grpc::ServerUnaryReactor *SequenceServiceImpl::GetSequence(grpc::CallbackServerContext *context,
                                                           const pb::GetSequenceRequest *request,
                                                           pb::GetSequenceResponse *response) {
  std::string owner;
  const grpc::Status admitted = gate_->Admit(*context, request, &owner);
  if (!admitted.ok()) return security::Reject(context, admitted);
  return Submit(context, metrics::Method::kGetSequence,
                [this, owner, request, response]() -> Status {
                  ATTN_RETURN_IF_ERROR(ValidateSequenceId(request->sequence_id()));
                  auto seq = store_->Acquire(request->sequence_id(), owner);
                  if (!seq.ok()) return seq.status();
                  FillInfo(*store_, *seq->seq, response->mutable_sequence());
                  return Status::Ok();
                });
}

}  // namespace attn
