#include "metrics/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <exception>

#include "metrics/metrics_http_server.h"
#include "metrics/scrape_collector.h"

namespace attn::metrics {
Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = o.owner_;
    id_ = o.id_;
    o.owner_ = nullptr;
    o.id_ = -1;
  }
  return *this;
}

void Registration::Reset() {
  if (owner_ != nullptr) owner_->RemoveSource(id_);
  owner_ = nullptr;
  id_ = -1;
}

namespace {

// attn_sequence_steps_total{method,result}, attn_sequence_step_duration_seconds{method},
// attn_sequence_decode_step_duration_seconds{method} and
// attn_sequence_batch_size_steps: their children, one per step method.
template <size_t N>
void RegisterStepFamilies(prometheus::Registry& reg, std::array<prometheus::Counter*, N>* ok,
                          std::array<prometheus::Counter*, N>* error,
                          std::array<prometheus::Histogram*, N>* duration,
                          std::array<prometheus::Histogram*, N>* decode_duration,
                          prometheus::Histogram** batch_size) {
  auto& steps = prometheus::BuildCounter()
                    .Name("attn_sequence_steps_total")
                    .Help(
                        "Sequence steps that ended (an Extend, an ExtendBatch entry, an "
                        "ExtendStream message, an ExtendBatchStream request's step), by method and result "
                        "(ok, error).")
                    .Register(reg);
  auto& step_duration =
      prometheus::BuildHistogram()
          .Name("attn_sequence_step_duration_seconds")
          .Help("Time from a sequence step's arrival to its result, successful steps, by method.")
          .Register(reg);
  auto& decode_duration_family =
      prometheus::BuildHistogram()
          .Name("attn_sequence_decode_step_duration_seconds")
          .Help("Time from a decode step's arrival to its result (successful steps of one "
                "query token that attend; prefills and append-only steps excluded): the "
                "server's part of the inter-token latency, by method.")
          .Register(reg);
  static constexpr Method kStepMethods[] = {Method::kExtend, Method::kExtendBatch,
                                            Method::kExtendStream, Method::kExtendBatchStream};
  static_assert(N == sizeof(kStepMethods) / sizeof(kStepMethods[0]));
  for (size_t i = 0; i < N; ++i) {
    const char* name = MethodName(kStepMethods[i]);
    (*ok)[i] = &steps.Add({{"method", name}, {"result", "ok"}});
    (*error)[i] = &steps.Add({{"method", name}, {"result", "error"}});
    (*duration)[i] = &step_duration.Add({{"method", name}}, RequestDurationBuckets());
    (*decode_duration)[i] =
        &decode_duration_family.Add({{"method", name}}, RequestDurationBuckets());
  }
  *batch_size = &prometheus::BuildHistogram()
                     .Name("attn_sequence_batch_size_steps")
                     .Help("Sequence steps per step batch.")
                     .Register(reg)
                     .Add({}, BatchSizeBuckets());
}

// attn_build_info{labels} = 1.
void RegisterBuildInfo(prometheus::Registry& reg,
                       const std::vector<std::pair<std::string, std::string>>& build_info) {
  auto& info = prometheus::BuildGauge()
                   .Name("attn_build_info")
                   .Help("Build and configuration of this server (value is always 1).")
                   .Register(reg);
  prometheus::Labels info_labels;
  for (const auto& [k, v] : build_info) info_labels[k] = v;
  info.Add(info_labels).Set(1);
}

}  // namespace

// ---- Metrics ----

Metrics::Metrics(const std::vector<std::string>& backends,
                 const std::vector<std::pair<std::string, std::string>>& build_info,
                 const std::vector<std::string>& step_only_backends)
    : registry_(std::make_shared<prometheus::Registry>()),
      collector_(std::make_shared<ScrapeCollector>()) {
  backends_.push_back("none");
  for (const auto& b : backends) {
    if (b != "none") backends_.push_back(b);
  }
  const int attend_backends = static_cast<int>(backends_.size());  // [1, this): Attend runs there
  for (const auto& b : step_only_backends) {
    if (std::find(backends_.begin(), backends_.end(), b) == backends_.end()) backends_.push_back(b);
  }
  const int nb = static_cast<int>(backends_.size());
  auto& reg = *registry_;

  requests_total_ = &prometheus::BuildCounter()
                         .Name("attn_requests_total")
                         .Help("Finished calls by method, backend and gRPC status code.")
                         .Register(reg);
  request_duration_ =
      &prometheus::BuildHistogram()
           .Name("attn_request_duration_seconds")
           .Help("Time from receipt to finish of a call, by method, backend and status code.")
           .Register(reg);
  auto& phase = prometheus::BuildHistogram()
                    .Name("attn_phase_duration_seconds")
                    .Help("Time per phase of a call that ran (the ExecutionReport's phases).")
                    .Register(reg);
  auto& batch_size = prometheus::BuildHistogram()
                         .Name("attn_batch_size_requests")
                         .Help("Requests per kernel launch.")
                         .Register(reg);
  auto& batch_tokens = prometheus::BuildHistogram()
                           .Name("attn_batch_tokens")
                           .Help("Query tokens per kernel launch.")
                           .Register(reg);
  auto& flops = prometheus::BuildHistogram()
                    .Name("attn_kernel_flops_per_second")
                    .Help("Achieved FLOP/s per launch: the report's FLOPs over kernel time.")
                    .Register(reg);
  auto& bytes = prometheus::BuildHistogram()
                    .Name("attn_kernel_bytes_per_second")
                    .Help(
                        "Achieved bytes/s per launch: q, k, v, o (and lse) bytes over "
                        "kernel time.")
                    .Register(reg);
  auto& hits = prometheus::BuildCounter()
                   .Name("attn_graph_cache_hits_total")
                   .Help("Execution-plan (cuDNN graph) cache hits.")
                   .Register(reg);
  auto& builds = prometheus::BuildCounter()
                     .Name("attn_graph_cache_builds_total")
                     .Help("Execution plans (cuDNN graphs) built on a cache miss.")
                     .Register(reg);
  auto& shadow_err = prometheus::BuildHistogram()
                         .Name("attn_shadow_relative_error")
                         .Help(
                             "Shadow check: ||out - ref||2 / ||ref||2 of a sampled live "
                             "response against the cpu float64 reference.")
                         .Register(reg);
  auto& shadow_mm = prometheus::BuildCounter()
                        .Name("attn_shadow_mismatches_total")
                        .Help("Shadow checks over the DESIGN.md section 4 tolerance.")
                        .Register(reg);
  auto& shadow_drop = prometheus::BuildCounter()
                          .Name("attn_shadow_dropped_total")
                          .Help("Sampled calls not shadow-checked because the queue was full.")
                          .Register(reg);
  RegisterStepFamilies(reg, &steps_ok_, &steps_error_, &step_duration_, &decode_step_duration_,
                       &step_batch_size_);
  RegisterBuildInfo(reg, build_info);

  per_backend_.resize(static_cast<size_t>(nb));
  for (int b = 1; b < nb; ++b) {
    const std::string& name = backends_[static_cast<size_t>(b)];
    PerBackend& p = per_backend_[static_cast<size_t>(b)];
    for (int ph = 0; ph < kNumPhases; ++ph) {
      p.phase[static_cast<size_t>(ph)] =
          &phase.Add({{"backend", name}, {"phase", PhaseName(static_cast<Phase>(ph))}},
                     PhaseDurationBuckets());
    }
    p.batch_size = &batch_size.Add({{"backend", name}}, BatchSizeBuckets());
    p.batch_tokens = &batch_tokens.Add({{"backend", name}}, BatchTokenBuckets());
    p.flops_per_s = &flops.Add({{"backend", name}}, FlopsPerSecondBuckets());
    p.bytes_per_s = &bytes.Add({{"backend", name}}, BytesPerSecondBuckets());
    p.graph_hits = &hits.Add({{"backend", name}});
    p.graph_builds = &builds.Add({{"backend", name}});
    p.shadow_error = &shadow_err.Add({{"backend", name}}, RelativeErrorBuckets());
    p.shadow_mismatches = &shadow_mm.Add({{"backend", name}});
    p.shadow_dropped = &shadow_drop.Add({{"backend", name}});
  }
  // per_backend_[0] ("none": calls refused before a backend was chosen) stays empty: only
  // request children carry backend="none".

  const size_t cells = static_cast<size_t>(kNumMethods * nb * kNumCodes);
  request_hist_.reset(new std::atomic<prometheus::Histogram*>[cells]);
  request_count_.reset(new std::atomic<prometheus::Counter*>[cells]);
  for (size_t i = 0; i < cells; ++i) {
    request_hist_[i].store(nullptr);
    request_count_[i].store(nullptr);
  }
  // Exported at 0 from the start: what rate() and the dashboards need.
  for (int b = 1; b < attend_backends; ++b) {
    RequestHistogram(static_cast<int>(Method::kAttend), b, 0);
    RequestCounter(static_cast<int>(Method::kAttend), b, 0);
  }
  // The other methods run on no attention backend: backend="none".
  for (int m = static_cast<int>(Method::kGetServerInfo); m < kNumMethods; ++m) {
    RequestHistogram(m, 0, 0);
    RequestCounter(m, 0, 0);
  }
}

Metrics::~Metrics() { StopServing(); }

Status Metrics::Serve(const std::string& address) {
  if (http_) return Status(StatusCode::kFailedPrecondition, "metrics: already serving");
  auto server = std::make_unique<MetricsHttpServer>([this] { return Render(); });
  StatusOr<int> port = server->Start(address);
  if (!port.ok()) return port.status();
  http_ = std::move(server);
  port_ = *port;
  return Status::Ok();
}

void Metrics::StopServing() {
  http_.reset();
  port_ = 0;
}

int Metrics::BackendIndex(const std::string& name) const {
  for (size_t i = 1; i < backends_.size(); ++i) {
    if (backends_[i] == name) return static_cast<int>(i);
  }
  return 0;
}

prometheus::Histogram* Metrics::RequestHistogram(int method, int backend, int code) {
  const size_t i = static_cast<size_t>(
      (method * static_cast<int>(backends_.size()) + backend) * kNumCodes + code);
  prometheus::Histogram* h = request_hist_[i].load(std::memory_order_acquire);
  if (h != nullptr) return h;
  std::lock_guard<std::mutex> lock(slow_mu_);
  h = &request_duration_->Add({{"method", MethodName(static_cast<Method>(method))},
                               {"backend", backends_[static_cast<size_t>(backend)]},
                               {"code", CodeName(code)}},
                              RequestDurationBuckets());
  request_hist_[i].store(h, std::memory_order_release);
  return h;
}

prometheus::Counter* Metrics::RequestCounter(int method, int backend, int code) {
  const size_t i = static_cast<size_t>(
      (method * static_cast<int>(backends_.size()) + backend) * kNumCodes + code);
  prometheus::Counter* c = request_count_[i].load(std::memory_order_acquire);
  if (c != nullptr) return c;
  std::lock_guard<std::mutex> lock(slow_mu_);
  c = &requests_total_->Add({{"method", MethodName(static_cast<Method>(method))},
                             {"backend", backends_[static_cast<size_t>(backend)]},
                             {"code", CodeName(code)}});
  request_count_[i].store(c, std::memory_order_release);
  return c;
}

void Metrics::ObserveRequest(Method method, int backend, StatusCode code, double seconds) {
  int m = static_cast<int>(method);
  if (m < 0 || m >= kNumMethods) m = 0;
  const int b = Clamp(backend);
  int c = static_cast<int>(code);
  if (c < 0 || c >= kNumCodes) c = static_cast<int>(StatusCode::kUnknown);
  RequestCounter(m, b, c)->Increment();
  RequestHistogram(m, b, c)->Observe(seconds);
}

void Metrics::ObservePhase(int backend, Phase phase, double seconds) {
  auto* h = per_backend_[static_cast<size_t>(Clamp(backend))].phase[static_cast<size_t>(phase)];
  if (h != nullptr) h->Observe(seconds);
}

void Metrics::ObserveLaunch(int backend, int64_t batch_size, int64_t batch_tokens, double flops,
                            double bytes_moved, double kernel_seconds) {
  const PerBackend& p = per_backend_[static_cast<size_t>(Clamp(backend))];
  if (p.batch_size == nullptr) return;
  p.batch_size->Observe(static_cast<double>(batch_size));
  p.batch_tokens->Observe(static_cast<double>(batch_tokens));
  if (kernel_seconds > 0) {
    p.flops_per_s->Observe(flops / kernel_seconds);
    p.bytes_per_s->Observe(bytes_moved / kernel_seconds);
  }
}

void Metrics::GraphCacheHit(int backend) {
  auto* c = per_backend_[static_cast<size_t>(Clamp(backend))].graph_hits;
  if (c != nullptr) c->Increment();
}

void Metrics::GraphCacheBuild(int backend) {
  auto* c = per_backend_[static_cast<size_t>(Clamp(backend))].graph_builds;
  if (c != nullptr) c->Increment();
}

void Metrics::ObserveShadow(int backend, double relative_error, bool mismatch) {
  const PerBackend& p = per_backend_[static_cast<size_t>(Clamp(backend))];
  if (p.shadow_error == nullptr) return;
  const double e = std::isnan(relative_error) || relative_error > 10 ? 10 : relative_error;
  p.shadow_error->Observe(e);
  if (mismatch) p.shadow_mismatches->Increment();
}

void Metrics::ShadowDropped(int backend) {
  auto* c = per_backend_[static_cast<size_t>(Clamp(backend))].shadow_dropped;
  if (c != nullptr) c->Increment();
}

void Metrics::ObserveStep(Method method, bool ok, double seconds, bool decode) {
  int i = -1;
  if (method == Method::kExtend) i = 0;
  if (method == Method::kExtendBatch) i = 1;
  if (method == Method::kExtendStream) i = 2;
  if (method == Method::kExtendBatchStream) i = 3;
  if (i < 0) return;
  if (!ok) {
    steps_error_[static_cast<size_t>(i)]->Increment();
    return;
  }
  steps_ok_[static_cast<size_t>(i)]->Increment();
  step_duration_[static_cast<size_t>(i)]->Observe(seconds);
  if (decode) decode_step_duration_[static_cast<size_t>(i)]->Observe(seconds);
}

void Metrics::ObserveStepBatch(int backend, int64_t steps, int64_t tokens) {
  step_batch_size_->Observe(static_cast<double>(steps));
  ObserveLaunch(backend, steps, tokens, 0, 0, 0);
}

int Metrics::AddSource(Source s) { return collector_->Add(std::move(s)); }
void Metrics::RemoveSource(int id) { collector_->Remove(id); }

Registration Metrics::RegisterRequestGauges(std::function<int64_t()> in_flight,
                                            std::function<int64_t()> queued) {
  Source s;
  s.in_flight = std::move(in_flight);
  s.queued = std::move(queued);
  return Registration(this, AddSource(std::move(s)));
}

Registration Metrics::RegisterDevicePool(std::function<std::pair<int64_t, int64_t>()> usage) {
  Source s;
  s.pool = std::move(usage);
  return Registration(this, AddSource(std::move(s)));
}

Registration Metrics::RegisterKvCache(std::function<KvCacheStats()> stats) {
  Source s;
  s.kv = std::move(stats);
  return Registration(this, AddSource(std::move(s)));
}

Registration Metrics::RegisterSharedMemory(std::function<SharedMemoryStats()> stats) {
  Source s;
  s.shm = std::move(stats);
  return Registration(this, AddSource(std::move(s)));
}

void Metrics::SetDevicePeaks(double flops_per_second, double bytes_per_second) {
  collector_->SetPeaks(flops_per_second, bytes_per_second);
}

std::string Metrics::Render() const {
  auto families = registry_->Collect();
  auto more = collector_->Collect();
  families.insert(families.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace attn::metrics
