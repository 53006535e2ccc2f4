#include "service/attention_service.h"

#include <spdlog/spdlog.h>

#include <memory>

#include "metrics/metrics.h"
#include "metrics/shadow_checker.h"
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

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

struct AttentionServiceImpl::AttendCall {
  grpc::CallbackServerContext* context;
  const attention::v1::AttendRequest* request;
  attention::v1::AttendResponse* response;
  grpc::ServerUnaryReactor* reactor;
  ValidatedAttend validated;
  BackendChoice choice;
  Clock::time_point start;
  Clock::time_point enqueued;
  int64_t decode_us = 0;
  int metrics_backend = 0;  // Metrics backend index; 0 ("none") until a backend is chosen
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
      shadow_(shadow != nullptr && shadow->enabled() ? shadow : nullptr) {
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
  call->reactor->Finish(ToGrpc(status));
  delete call;
  CallDone();
}

grpc::ServerUnaryReactor* AttentionServiceImpl::Attend(
    grpc::CallbackServerContext* context, const attention::v1::AttendRequest* request,
    attention::v1::AttendResponse* response) {
  auto* call = new AttendCall{context, request, response, context->DefaultReactor(), {}, {},
                              Clock::now(), {}, 0};
  grpc::ServerUnaryReactor* reactor = call->reactor;
  in_flight_.fetch_add(1);
  if (draining_.load()) {
    Finish(call, Unavailable("server is draining for shutdown; retry on another replica"));
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
  for (const auto& [b, index] : metrics_backends_) {
    if (b == call->choice.backend) call->metrics_backend = index;
  }
  call->enqueued = Clock::now();
  call->decode_us = Us(call->start, call->enqueued);
  if (!workers_->TrySubmit([this, call] { RunAttend(call); })) {
    Finish(call, ResourceExhausted("request queue is full (--max-queue-requests=" +
                                   std::to_string(workers_->max_queued()) + ")"));
  }
  return reactor;
}

void AttentionServiceImpl::RunAttend(AttendCall* call) {
  const Clock::time_point dequeued = Clock::now();
  if (call->context->IsCancelled()) {
    Finish(call, Status(StatusCode::kCancelled, "cancelled by the client before it ran"));
    return;
  }
  if (std::chrono::system_clock::now() >= call->context->deadline()) {
    Finish(call, Status(StatusCode::kDeadlineExceeded, "deadline passed before the call ran"));
    return;
  }
  const ValidatedAttend& v = call->validated;
  const kernels::AttentionShape& shape = v.shape;
  auto* o = call->response->mutable_o();
  o->set_dtype(DTypeToProto(shape.dtype));
  for (int64_t d : v.o_shape) o->add_shape(d);
  std::string* o_data = o->mutable_data();
  o_data->resize(v.o_bytes);
  float* lse_ptr = nullptr;
  if (shape.return_lse) {
    auto* lse = call->response->mutable_lse();
    lse->set_dtype(attention::v1::FLOAT32);
    for (int64_t d : v.lse_shape) lse->add_shape(d);
    lse->mutable_data()->resize(static_cast<size_t>(shape.lse_elements()) * sizeof(float));
    lse_ptr = reinterpret_cast<float*>(lse->mutable_data()->data());
  }
  ExecuteTimes times;
  Status s = call->choice.backend->Execute(shape, v.Tensors(o_data->data(), lse_ptr), &times);
  if (!s.ok()) {
    call->response->Clear();
    if (s.code() == StatusCode::kInternal && on_fault_) on_fault_();
    Finish(call, s);
    return;
  }
  const Clock::time_point encode_start = Clock::now();
  auto* report = call->response->mutable_report();
  report->set_backend(call->choice.backend->name());
  report->set_backend_reason(call->choice.reason);
  report->set_batch_size(1);
  report->set_batch_tokens(v.query_tokens);
  report->set_flops(v.flops);
  for (const auto& [b, device] : backend_devices_) {
    if (b == call->choice.backend) report->set_device(device);
  }
  auto* t = report->mutable_times();
  t->set_decode_us(call->decode_us);
  const int64_t queue_us = Us(call->enqueued, dequeued);
  t->set_queue_us(queue_us);
  t->set_host_to_device_us(times.host_to_device_us);
  t->set_kernel_us(times.kernel_us);
  t->set_device_to_host_us(times.device_to_host_us);
  const Clock::time_point end = Clock::now();
  t->set_encode_us(Us(encode_start, end));
  t->set_total_us(Us(call->start, end));
  if (metrics_ != nullptr) {
    const int b = call->metrics_backend;
    metrics_->ObservePhase(b, metrics::Phase::kDecode, call->decode_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kQueue, queue_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kHostToDevice, times.host_to_device_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kKernel, times.kernel_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kDeviceToHost, times.device_to_host_us * 1e-6);
    metrics_->ObservePhase(b, metrics::Phase::kEncode, Seconds(encode_start, end));
    metrics_->ObserveLaunch(
        b, 1, v.query_tokens, v.flops,
        metrics::MinBytesMoved(shape.q_elements(), shape.kv_elements(),
                               kernels::DTypeSize(shape.dtype),
                               shape.return_lse ? shape.lse_elements() : 0),
        times.kernel_us * 1e-6);
  }
  // Shadow check: copies inputs and output before the call finishes (the request and response
  // go away with it); the recomputation runs on the checker's own thread.
  if (shadow_ != nullptr && shadow_->ShouldSample()) {
    shadow_->Submit(call->metrics_backend, v, o_data->data());
  }
  spdlog::debug("Attend ok: backend={} B={} T={} S={} N={} K={} H={} kernel_us={}",
                call->choice.backend->name(), shape.batch, shape.max_q_len, shape.max_kv_len,
                shape.num_heads, shape.num_kv_heads, shape.head_dim, times.kernel_us);
  Finish(call, Status::Ok());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context, const attention::v1::GetServerInfoRequest*,
    attention::v1::GetServerInfoResponse* r) {
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
  if (facts_.extra_info) facts_.extra_info(r);
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
  }
  auto* reactor = context->DefaultReactor();
  if (metrics_ != nullptr) {
    metrics_->ObserveRequest(metrics::Method::kGetServerInfo, 0, StatusCode::kOk,
                             Seconds(start, Clock::now()));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace attn
