#include "service/attention_service.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <thread>

#include "common/client_text.h"
#include "metrics/metrics.h"
#include "service/shadow_checker.h"
#include "service/cancellable_reactor.h"
#include "service/grpc_status.h"
#include "service/load_report.h"
#include "validation/work_bound.h"
#include "version.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

attention::v1::CausalAlignment CausalToProto(CausalAlignment c) {
  switch (c) {
    case CausalAlignment::kTopLeft: return attention::v1::CAUSAL_TOP_LEFT;
    case CausalAlignment::kBottomRight: return attention::v1::CAUSAL_BOTTOM_RIGHT;
    default: return attention::v1::CAUSAL_NONE;
  }
}

}  // namespace

// One Attend call, from admission until Finish (the handler, or the completion callback once
// the call was queued, deletes it). The request and response belong to gRPC and live until
// Finish.
struct AttentionServiceImpl::AttendCall {
  grpc::CallbackServerContext* context = nullptr;
  const attention::v1::AttendRequest* request = nullptr;
  attention::v1::AttendResponse* response = nullptr;
  CancellableUnaryReactor* reactor = nullptr;
  ValidatedAttend validated;
  BackendChoice choice;
  Clock::time_point start;
  int64_t decode_us = 0;
  int metrics_backend = 0;    // Metrics backend index; 0 ("none") until a backend is chosen
  int64_t request_bytes = 0;  // counted in inflight_bytes_ from admission until OnDone
};

AttentionServiceImpl::AttentionServiceImpl(const ServerConfig& config,
                                           const BackendRegistry* registry, WorkerPool* workers,
                                           ServerFacts facts, std::function<void()> on_fault,
                                           metrics::Metrics* metrics,
                                           metrics::ShadowChecker* shadow)
    : config_(config),
      registry_(registry),
      workers_(workers),
      facts_(std::move(facts)),
      on_fault_(std::move(on_fault)),
      metrics_(metrics),
      shadow_(shadow != nullptr && shadow->enabled() ? shadow : nullptr),
      watchdog_(std::make_unique<WriteWatchdog>(
          std::chrono::milliseconds(static_cast<int64_t>(config.response_write_timeout_s * 1e3)),
          config.max_unsent_response_bytes)) {
  BatchSchedulerOptions batching;
  batching.policy.max_batch_tokens = config_.max_batch_tokens;
  batching.policy.max_batch_requests = config_.max_batch_requests;
  batching.policy.max_queue_delay_us = config_.max_queue_delay_us;
  batching.threads = config_.batch_threads > 0    ? config_.batch_threads
                     : config_.worker_threads > 0 ? config_.worker_threads
                                                  : static_cast<int>(std::max(
                                                        1u, std::thread::hardware_concurrency()));
  batching.max_queued = config_.max_queue_requests;
  batching.name = "Attend";
  batcher_ = std::make_unique<AttendBatcher>(batching, on_fault_);
  if (metrics_ != nullptr) {
    batcher_->SetLaunchObserver([this](const AttendLaunch& launch) { ObserveLaunch(launch); });
  }
  // Capabilities() builds vectors and strings: read each backend's device name once here,
  // not per request.
  for (Backend* b : registry_->All()) backend_devices_.emplace_back(b, b->Capabilities().device);
  if (metrics_ != nullptr) {
    for (Backend* b : registry_->All()) {
      metrics_backends_.emplace_back(b, metrics_->BackendIndex(b->name()));
    }
  }
}

void AttentionServiceImpl::StartDraining() { draining_.store(true); }

bool AttentionServiceImpl::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return in_flight_.load() == 0; });
}

void AttentionServiceImpl::CallDone() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_cv_.notify_all();
  }
}

void AttentionServiceImpl::Finish(AttendCall* call, const Status& status) {
  if (!status.ok()) {
    if (status.code() == StatusCode::kInternal) {
      spdlog::error("Attend failed: {}", status.ToString());
    } else {
      spdlog::debug("Attend rejected: {}", status.ToString());
    }
  }
  if (metrics_ != nullptr) {
    metrics_->ObserveRequest(metrics::Method::kAttend, call->metrics_backend, status.code(),
                             Seconds(call->start, Clock::now()));
  }
  // The call stays in flight until its response is taken (OnDone). Until then it holds its
  // request and its response, as message and serialized: counted against
  // --max-unsent-response-bytes and bounded in time by the watchdog.
  const int64_t held =
      status.ok()
          ? static_cast<int64_t>(call->request->ByteSizeLong() + 2 * call->response->ByteSizeLong())
          : 0;
  const WriteWatchdog::Ticket ticket = held > 0 ? watchdog_->Arm(call->context, held) : 0;
  // Responses count from now on; the request was counted at admission.
  const int64_t response_bytes =
      status.ok() ? 2 * static_cast<int64_t>(call->response->ByteSizeLong()) : 0;
  const int64_t counted = call->request_bytes + response_bytes;
  inflight_bytes_.fetch_add(response_bytes);
  call->reactor->SetOnDone([this, ticket, counted] {
    watchdog_->Disarm(ticket);
    inflight_bytes_.fetch_sub(counted);
    CallDone();
  });
  call->reactor->Finish(ToGrpc(status));
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Attend(
    grpc::CallbackServerContext* context, const attention::v1::AttendRequest* request,
    attention::v1::AttendResponse* response) {
  std::string identity;
  const grpc::Status admitted = gate_->Admit(*context, request, &identity);
  if (!admitted.ok()) return security::Reject(context, admitted);
  auto owned = std::make_unique<AttendCall>();
  AttendCall* call = owned.get();
  call->context = context;
  call->request = request;
  call->response = response;
  AttendBatcher* batcher = batcher_.get();
  call->reactor = new CancellableUnaryReactor([batcher] { batcher->Notify(); });
  call->start = Clock::now();
  grpc::ServerUnaryReactor* reactor = call->reactor;
  in_flight_.fetch_add(1);
  if (draining_.load()) {
    Finish(call, Unavailable("server is draining for shutdown; retry on another replica"));
    return reactor;
  }
  // Memory bound: requests and responses held by calls in flight. Checked before this call
  // is added, so one call of any size is admitted while the total is under the bound.
  call->request_bytes = static_cast<int64_t>(request->ByteSizeLong());
  const int64_t held_before = inflight_bytes_.fetch_add(call->request_bytes);
  if (config_.max_inflight_bytes > 0 && held_before > config_.max_inflight_bytes) {
    Finish(call, ResourceExhausted("Attend calls in flight hold " + std::to_string(held_before) +
                                   " bytes of requests and responses, over --max-inflight-bytes=" +
                                   std::to_string(config_.max_inflight_bytes) + "; retry later"));
    return reactor;
  }
  auto validated = ValidateAttend(*request);
  if (!validated.ok()) {
    Finish(call, validated.status());
    return reactor;
  }
  call->validated = std::move(*validated);
  auto choice =
      registry_->Resolve(request->backend(), config_.default_backend, call->validated.shape);
  if (!choice.ok()) {
    Finish(call, choice.status());
    return reactor;
  }
  call->choice = *choice;
  call->metrics_backend = MetricsBackend(call->choice.backend);
  bool on_cpu = false;
  for (const auto& [b, device] : backend_devices_) {
    if (b == call->choice.backend) on_cpu = device == "cpu";
  }
  if (Status s = CheckWorkBound(call->validated, on_cpu,
                                {config_.max_cpu_score_pairs, config_.max_gpu_flops});
      !s.ok()) {
    Finish(call, s);
    return reactor;
  }
  call->decode_us = Us(call->start, Clock::now());
  AttendWork work;
  work.validated = &call->validated;
  work.backend = call->choice.backend;
  work.cancelled = [context] { return context->IsCancelled(); };
  work.deadline = context->deadline();
  work.done = [this, call](AttendResult&& result) { Complete(call, std::move(result)); };
  if (Status s = batcher_->Enqueue(std::move(work)); !s.ok()) {
    Finish(call, s);
    return reactor;
  }
  owned.release();  // the completion callback deletes it
  return reactor;
}

int AttentionServiceImpl::MetricsBackend(const Backend* backend) const {
  for (const auto& [b, index] : metrics_backends_) {
    if (b == backend) return index;
  }
  return 0;
}

void AttentionServiceImpl::ObserveLaunch(const AttendLaunch& launch) {
  const kernels::AttentionShape& ps = *launch.shape;
  metrics_->ObserveLaunch(MetricsBackend(launch.backend), launch.calls, launch.query_tokens,
                          launch.flops,
                          metrics::MinBytesMoved(ps.q_elements(), ps.kv_elements(),
                                                 kernels::DTypeSize(ps.dtype),
                                                 ps.return_lse ? ps.lse_elements() : 0),
                          launch.kernel_us * 1e-6);
}

void AttentionServiceImpl::Complete(AttendCall* call, AttendResult&& result) {
  std::unique_ptr<AttendCall> owned(call);
  if (!result.status.ok()) {
    Finish(call, result.status);
    return;
  }
  const ValidatedAttend& v = call->validated;
  auto* o = call->response->mutable_o();
  o->set_dtype(DTypeToProto(v.shape.dtype));
  if (v.shape.dtype == kernels::DType::kFloat8E4M3) o->set_scale(v.shape.fp8.v_descale);
  for (int64_t d : v.o_shape) o->add_shape(d);
  *o->mutable_data() = std::move(result.o);
  if (v.shape.return_lse) {
    auto* lse = call->response->mutable_lse();
    lse->set_dtype(attention::v1::FLOAT32);
    for (int64_t d : v.lse_shape) lse->add_shape(d);
    *lse->mutable_data() = std::move(result.lse);
  }
  Respond(call, result);
}

void AttentionServiceImpl::Respond(AttendCall* call, const AttendResult& result) {
  const ValidatedAttend& v = call->validated;
  const kernels::AttentionShape& shape = v.shape;
  const ExecuteTimes& times = result.times;
  const Clock::time_point encode_start = Clock::now();
  auto* report = call->response->mutable_report();
  report->set_backend(call->choice.backend->name());
  report->set_backend_reason(call->choice.reason);
  report->set_auto_bucket(call->choice.bucket);
  report->set_recipe(call->choice.backend->Recipe(shape));
  report->set_batch_size(static_cast<int32_t>(result.batch_size));
  report->set_batch_tokens(result.batch_tokens);
  report->set_flops(v.flops);
  for (const auto& [b, device] : backend_devices_) {
    if (b == call->choice.backend) report->set_device(device);
  }
  auto* t = report->mutable_times();
  t->set_decode_us(call->decode_us);
  t->set_queue_us(result.queue_us);
  t->set_host_to_device_us(times.host_to_device_us);
  t->set_kernel_us(times.kernel_us);
  t->set_device_to_host_us(times.device_to_host_us);
  const Clock::time_point end = Clock::now();
  t->set_encode_us(Us(encode_start, end));
  t->set_total_us(Us(call->start, end));
  if (metrics_ != nullptr) {
    const int b = call->metrics_backend;
    metrics_->ObservePhase(b, metrics::Phase::kDecode, call->decode_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kQueue, result.queue_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kHostToDevice, times.host_to_device_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kKernel, times.kernel_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kDeviceToHost, times.device_to_host_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kEncode, Seconds(encode_start, end));
  }
  // Shadow check: copies inputs and output before the call finishes (the request and response
  // go away with it); the recomputation runs on the checker's own thread.
  if (shadow_ != nullptr && shadow_->ShouldSample()) {
    shadow_->Submit(call->metrics_backend, v, call->response->o().data().data());
  }
  spdlog::debug("Attend ok: backend={} B={} T={} S={} N={} K={} H={} batch={} kernel_us={}",
                call->choice.backend->name(), shape.batch, shape.max_q_len, shape.max_kv_len,
                shape.num_heads, shape.num_kv_heads, shape.head_dim, result.batch_size,
                times.kernel_us);
  Finish(call, Status::Ok());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const attention::v1::GetServerInfoRequest* request,
    attention::v1::GetServerInfoResponse* r) {
  std::string identity;
  const grpc::Status admitted = gate_->Admit(*context, request, &identity);
  if (!admitted.ok()) return security::Reject(context, admitted);
  const Clock::time_point start = Clock::now();
  r->set_version(kAttnVersion);
  r->set_build(kAttnBuild);
  r->set_device_name(facts_.device_name);
  r->set_compute_capability(facts_.compute_capability);
  r->set_device_memory_bytes(facts_.device_memory_bytes);
  if (facts_.pool_usage) {
    auto [cap, used] = facts_.pool_usage();
    r->set_memory_pool_bytes(cap);
    r->set_memory_pool_used_bytes(used);
  }
  r->set_default_backend(config_.default_backend);
  r->set_max_message_bytes(config_.max_message_bytes);
  r->set_worker_threads(workers_->threads());
  r->set_cuda_driver_version(facts_.cuda_driver_version);
  if (load_ != nullptr) load_->FillReplica(r->mutable_replica());
  if (facts_.extra_info) facts_.extra_info(r);
  if (facts_.backend_info) facts_.backend_info(r);
  for (Backend* b : registry_->All()) {
    const BackendCapabilities c = b->Capabilities();
    auto* info = r->add_backends();
    info->set_name(b->name());
    info->set_available(b->available());
    info->set_unavailable_reason(b->unavailable_reason());
    for (DType d : c.dtypes) info->add_dtypes(DTypeToProto(d));
    for (int h : c.head_dims) info->add_head_dims(h);
    info->set_max_head_dim(c.max_head_dim);
    info->set_supports_varlen(c.varlen);
    info->set_supports_gqa(c.gqa);
    for (CausalAlignment a : c.causal) info->add_causal(CausalToProto(a));
    info->set_supports_window(c.window);
    info->set_supports_lse(c.lse);
    info->set_device(c.device);
    info->set_description(c.description);
    for (const std::string& recipe : c.recipes) info->add_recipes(recipe);
  }
  auto* reactor = context->DefaultReactor();
  if (metrics_ != nullptr) {
    metrics_->ObserveRequest(metrics::Method::kGetServerInfo, 0, StatusCode::kOk,
                             Seconds(start, Clock::now()));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetLoad(
    grpc::CallbackServerContext* context, const attention::v1::GetLoadRequest* request,
    attention::v1::GetLoadResponse* response) {
  std::string identity;
  const grpc::Status admitted = gate_->Admit(*context, request, &identity);
  if (!admitted.ok()) return security::Reject(context, admitted);
  const auto start = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (load_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "GetLoad: this server has no load reporter"));
    return reactor;
  }
  load_->Fill(response);
  reactor->Finish(grpc::Status::OK);
  if (metrics_ != nullptr) {
    metrics_->ObserveRequest(
        metrics::Method::kGetLoad, 0, StatusCode::kOk,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return reactor;
}


}  // namespace attn
