#include "service/sequence_service.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <set>
#include <utility>

#include "kv_cache/extend_step.h"
#include "service/attention_service.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;
using kernels::DType;

constexpr int32_t kMaxLayers = 4096;
constexpr int32_t kMaxHeads = 1024;
constexpr int32_t kMaxHeadDim = 1024;
constexpr int64_t kMaxReserveTokens = int64_t{1} << 24;

int64_t Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
}

Status Range(const char *field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return InvalidArgument(std::string(field) + ": expected [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + std::to_string(v));
  }
  return Status::Ok();
}

Status CheckId(const std::string &id) {
  if (id.size() != 32 || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return InvalidArgument("sequence_id: expected 32 lowercase hex digits, got \"" +
                           id.substr(0, 64) + "\"");
  }
  return Status::Ok();
}

/// Validates CreateSequenceRequest into a SequenceConfig.
StatusOr<SequenceConfig> ToConfig(const pb::CreateSequenceRequest &r) {
  SequenceConfig c;
  ATTN_RETURN_IF_ERROR(Range("num_layers", r.num_layers(), 1, kMaxLayers));
  ATTN_RETURN_IF_ERROR(Range("num_kv_heads", r.num_kv_heads(), 1, kMaxHeads));
  ATTN_RETURN_IF_ERROR(Range("head_dim", r.head_dim(), 1, kMaxHeadDim));
  ATTN_RETURN_IF_ERROR(Range("num_heads", r.num_heads(), 1, kMaxHeads));
  ATTN_RETURN_IF_ERROR(Range("reserve_tokens", r.reserve_tokens(), 0, kMaxReserveTokens));
  if (r.num_heads() % r.num_kv_heads() != 0) {
    return InvalidArgument("num_heads (" + std::to_string(r.num_heads()) +
                           ") must be a multiple of num_kv_heads (" +
                           std::to_string(r.num_kv_heads()) + ")");
  }
  auto dt = DTypeFromProto(r.dtype(), "dtype");
  if (!dt.ok()) return dt.status();
  if (*dt == DType::kFloat8E4M3) {
    return InvalidArgument(
        "dtype: expected FLOAT32, FLOAT16 or BFLOAT16, got FLOAT8_E4M3 "
        "(use kv_cache_dtype for FP8 storage)");
  }
  DType kv = *dt;
  if (r.kv_cache_dtype() != pb::DTYPE_UNSPECIFIED) {
    auto k = DTypeFromProto(r.kv_cache_dtype(), "kv_cache_dtype");
    if (!k.ok()) return k.status();
    if (*k != *dt && *k != DType::kFloat8E4M3) {
      return InvalidArgument(std::string("kv_cache_dtype: expected DTYPE_UNSPECIFIED, dtype (") +
                             kernels::DTypeName(*dt) + ") or FLOAT8_E4M3, got " +
                             kernels::DTypeName(*k));
    }
    kv = *k;
  }
  const int64_t n_scales = int64_t{r.num_layers()} * r.num_kv_heads();
  if (r.k_scales_size() > 0 || r.v_scales_size() > 0) {
    if (kv != DType::kFloat8E4M3) {
      return InvalidArgument("k_scales/v_scales: only for kv_cache_dtype FLOAT8_E4M3");
    }
    if (r.k_scales_size() != n_scales || r.v_scales_size() != n_scales) {
      return InvalidArgument(
          "k_scales/v_scales: expected num_layers * num_kv_heads = " + std::to_string(n_scales) +
          " each, got " + std::to_string(r.k_scales_size()) + " and " +
          std::to_string(r.v_scales_size()));
    }
    for (int i = 0; i < n_scales; ++i) {
      for (float s : {r.k_scales(i), r.v_scales(i)}) {
        if (!(s > 0.f) || !std::isfinite(s)) {
          return InvalidArgument("k_scales/v_scales[" + std::to_string(i) +
                                 "]: expected finite > 0, got " + std::to_string(s));
        }
      }
    }
    c.k_scales.assign(r.k_scales().begin(), r.k_scales().end());
    c.v_scales.assign(r.v_scales().begin(), r.v_scales().end());
  }
  if (r.has_scale() && !(r.scale() > 0.f && std::isfinite(r.scale()))) {
    return InvalidArgument("scale: expected finite > 0, got " + std::to_string(r.scale()));
  }
  c.num_layers = r.num_layers();
  c.num_kv_heads = r.num_kv_heads();
  c.head_dim = r.head_dim();
  c.num_heads = r.num_heads();
  c.dtype = *dt;
  c.kv_dtype = kv;
  c.reserve_tokens = r.reserve_tokens();
  c.scale = r.has_scale() ? r.scale() : static_cast<float>(1.0 / std::sqrt(double(r.head_dim())));
  return c;
}

/// Checks one rank-3 tensor's dtype and byte size; fills dtype and shape.
Status DecodeTensor(const pb::Tensor &t, const char *field, DType *dtype,
                    std::array<int64_t, 3> *shape) {
  if (t.shape_size() != 3) {
    return InvalidArgument(std::string(field) + ": expected rank 3, got rank " +
                           std::to_string(t.shape_size()));
  }
  auto dt = DTypeFromProto(t.dtype(), std::string(field) + ".dtype");
  if (!dt.ok()) return dt.status();
  int64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    const int64_t d = t.shape(i);
    if (d < 1 || d > (int64_t{1} << 24)) {
      return InvalidArgument(std::string(field) + ".shape[" + std::to_string(i) +
                             "]: expected [1, 2^24], got " + std::to_string(d));
    }
    (*shape)[i] = d;
    n *= d;
  }
  const uint64_t expected = static_cast<uint64_t>(n) * kernels::DTypeSize(*dt);
  if (t.data().size() != expected) {
    return InvalidArgument(std::string(field) + ".data: expected " + std::to_string(expected) +
                           " bytes, got " + std::to_string(t.data().size()));
  }
  *dtype = *dt;
  return Status::Ok();
}

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
}

}  // namespace

std::string CallerIdentity(const grpc::CallbackServerContext *context) {
  const auto &md = context->client_metadata();
  auto it = md.find("x-attn-identity");
  if (it == md.end()) return std::string();
  return std::string(it->second.data(), it->second.size());
}

void FillKvCacheInfo(const SequenceStore &store, pb::KvCacheInfo *info) {
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
                                         WorkerPool *workers)
    : store_(store), backend_(backend), workers_(workers) {}

bool SequenceServiceImpl::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return in_flight_.load() == 0; });
}

void SequenceServiceImpl::CallDone() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_cv_.notify_all();
  }
}

template <typename Fn>
grpc::ServerUnaryReactor *SequenceServiceImpl::Submit(grpc::CallbackServerContext *context, Fn fn) {
  grpc::ServerUnaryReactor *reactor = context->DefaultReactor();
  CallStarted();
  if (draining_.load()) {
    reactor->Finish(ToGrpc(Unavailable("server is draining for shutdown")));
    CallDone();
    return reactor;
  }
  auto task = [this, context, reactor, fn]() mutable {
    Status s;
    if (context->IsCancelled()) {
      s = Status(StatusCode::kCancelled, "cancelled by the client before it ran");
    } else if (std::chrono::system_clock::now() >= context->deadline()) {
      s = Status(StatusCode::kDeadlineExceeded, "deadline passed before the call ran");
    } else {
      s = fn();
    }
    if (!s.ok()) spdlog::debug("SequenceService call failed: {}", s.ToString());
    reactor->Finish(ToGrpc(s));
    CallDone();
  };
  if (!workers_->TrySubmit(std::move(task))) {
    reactor->Finish(ToGrpc(ResourceExhausted("request queue is full (--max-queue-requests=" +
                                             std::to_string(workers_->max_queued()) + ")")));
    CallDone();
  }
  return reactor;
}

grpc::ServerUnaryReactor *SequenceServiceImpl::CreateSequence(
    grpc::CallbackServerContext *context, const pb::CreateSequenceRequest *request,
    pb::CreateSequenceResponse *response) {
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    auto config = ToConfig(*request);
    if (!config.ok()) return config.status();
    auto seq = store_->Create(owner, std::move(*config));
    if (!seq.ok()) return seq.status();
    FillInfo(*store_, *seq->seq, response->mutable_sequence());
    return Status::Ok();
  });
}

Status SequenceServiceImpl::RunExtend(const std::string &owner, const pb::ExtendRequest &r,
                                      pb::ExtendResponse *response) {
  const Clock::time_point start = Clock::now();
  ATTN_RETURN_IF_ERROR(CheckId(r.sequence_id()));
  ExtendArgs a;
  a.sequence_id = r.sequence_id();
  a.layer = r.layer();
  a.position = r.position();
  ATTN_RETURN_IF_ERROR(DecodeTensor(r.q(), "q", &a.q_dtype, &a.q_shape));
  ATTN_RETURN_IF_ERROR(DecodeTensor(r.k(), "k", &a.k_dtype, &a.k_shape));
  ATTN_RETURN_IF_ERROR(DecodeTensor(r.v(), "v", &a.v_dtype, &a.v_shape));
  if (a.k_shape[0] != a.v_shape[0] || a.k_shape[0] != a.q_shape[0]) {
    return InvalidArgument("k, v and q must have the same T: q " + std::to_string(a.q_shape[0]) +
                           ", k " + std::to_string(a.k_shape[0]) + ", v " +
                           std::to_string(a.v_shape[0]));
  }
  a.q = r.q().data().data();
  a.k = r.k().data().data();
  a.v = r.v().data().data();
  a.q_bytes = r.q().data().size();
  a.k_bytes = r.k().data().size();
  a.v_bytes = r.v().data().size();
  const Clock::time_point decoded = Clock::now();
  ExtendOutcome out;
  pb::Tensor *o = response->mutable_o();
  Status s = ExtendStep(store_, backend_, owner, a, o->mutable_data(), &out);
  if (!s.ok()) {
    response->Clear();
    return s;
  }
  o->set_dtype(DTypeToProto(out.dtype));
  o->add_shape(a.q_shape[0]);
  o->add_shape(out.num_heads);
  o->add_shape(out.head_dim);
  response->set_length(out.length);
  response->set_replayed(out.replayed);
  auto *report = response->mutable_report();
  report->set_backend(backend_->name());
  report->set_backend_reason(out.replayed ? "replay: stored result"
                                          : "paged KV cache: host pages, cpu reference");
  report->set_batch_size(1);
  report->set_batch_tokens(a.q_shape[0]);
  report->set_flops(2.0 * a.q_shape[0] * out.kv_len * out.num_heads * out.head_dim);
  report->set_device("cpu");
  auto *t = report->mutable_times();
  t->set_decode_us(Us(start, decoded));
  t->set_kernel_us(out.kernel_us);
  t->set_total_us(Us(start, Clock::now()));
  return Status::Ok();
}

grpc::ServerUnaryReactor *SequenceServiceImpl::Extend(grpc::CallbackServerContext *context,
                                                      const pb::ExtendRequest *request,
                                                      pb::ExtendResponse *response) {
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    return RunExtend(owner, *request, response);
  });
}

grpc::ServerUnaryReactor *SequenceServiceImpl::ExtendBatch(grpc::CallbackServerContext *context,
                                                           const pb::ExtendBatchRequest *request,
                                                           pb::ExtendBatchResponse *response) {
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    if (request->steps_size() == 0) return InvalidArgument("steps: expected at least one step");
    std::set<std::string> ids;
    for (const pb::ExtendRequest &step : request->steps()) {
      if (step.layer() != request->steps(0).layer()) {
        return InvalidArgument("steps: every step must be on the same layer (" +
                               std::to_string(request->steps(0).layer()) + "), got " +
                               std::to_string(step.layer()));
      }
      if (!ids.insert(step.sequence_id()).second) {
        return InvalidArgument("steps: sequence " + step.sequence_id() + " appears twice");
      }
    }
    for (const pb::ExtendRequest &step : request->steps()) {
      pb::ExtendResult *result = response->add_results();
      Status s = RunExtend(owner, step, result->mutable_response());
      if (!s.ok()) {
        result->clear_response();
        result->set_code(static_cast<int32_t>(s.code()));
        result->set_message(s.message());
      }
    }
    return Status::Ok();
  });
}

grpc::ServerUnaryReactor *SequenceServiceImpl::TruncateSequence(
    grpc::CallbackServerContext *context, const pb::TruncateSequenceRequest *request,
    pb::TruncateSequenceResponse *response) {
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    ATTN_RETURN_IF_ERROR(CheckId(request->sequence_id()));
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
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    ATTN_RETURN_IF_ERROR(CheckId(request->sequence_id()));
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
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    ATTN_RETURN_IF_ERROR(CheckId(request->sequence_id()));
    int64_t freed = 0;
    ATTN_RETURN_IF_ERROR(store_->Release(request->sequence_id(), owner, &freed));
    response->set_pages_freed(freed);
    return Status::Ok();
  });
}

grpc::ServerUnaryReactor *SequenceServiceImpl::GetSequence(grpc::CallbackServerContext *context,
                                                           const pb::GetSequenceRequest *request,
                                                           pb::GetSequenceResponse *response) {
  const std::string owner = CallerIdentity(context);
  return Submit(context, [this, owner, request, response]() -> Status {
    ATTN_RETURN_IF_ERROR(CheckId(request->sequence_id()));
    auto seq = store_->Acquire(request->sequence_id(), owner);
    if (!seq.ok()) return seq.status();
    FillInfo(*store_, *seq->seq, response->mutable_sequence());
    return Status::Ok();
  });
}

// One stream: read a request, run it on a worker, write its result, read the
// next.
class SequenceServiceImpl::StreamReactor
    : public grpc::ServerBidiReactor<pb::ExtendRequest, pb::ExtendResult> {
 public:
  StreamReactor(SequenceServiceImpl *service, grpc::CallbackServerContext *context)
      : service_(service), owner_(CallerIdentity(context)) {
    service_->CallStarted();
    if (service_->draining_.load()) {
      Finish(ToGrpc(Unavailable("server is draining for shutdown")));
      return;
    }
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);  // the client closed its side
      return;
    }
    result_.Clear();
    if (!service_->workers_->TrySubmit([this] {
          Status s = service_->RunExtend(owner_, request_, result_.mutable_response());
          SetResult(s);
          StartWrite(&result_);
        })) {
      SetResult(ResourceExhausted("request queue is full"));
      StartWrite(&result_);
    }
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
      return;
    }
    StartRead(&request_);
  }
  void OnDone() override {
    service_->CallDone();
    delete this;
  }

 private:
  void SetResult(const Status &s) {
    if (s.ok()) return;
    result_.clear_response();
    result_.set_code(static_cast<int32_t>(s.code()));
    result_.set_message(s.message());
  }

  SequenceServiceImpl *service_;
  const std::string owner_;
  pb::ExtendRequest request_;
  pb::ExtendResult result_;
};

grpc::ServerBidiReactor<pb::ExtendRequest, pb::ExtendResult> *SequenceServiceImpl::ExtendStream(
    grpc::CallbackServerContext *context) {
  return new StreamReactor(this, context);
}

}  // namespace attn
