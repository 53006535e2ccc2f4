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

namespace attn::metrics {
namespace {

// steps × 10^e for e in [lo_exp, hi_exp], up to 10^hi_exp; parsed from decimal text so that
// the `le` labels print as written (2.5e-05, not 2.5000000000000001e-05).
std::vector<double> Decades(int lo_exp, int hi_exp, std::initializer_list<const char*> steps) {
  std::vector<double> b;
  for (int e = lo_exp; e <= hi_exp; ++e) {
    for (const char* s : steps) {
      const double v = std::strtod((std::string(s) + "e" + std::to_string(e)).c_str(), nullptr);
      if (e < hi_exp || std::string(s) == "1") b.push_back(v);
    }
  }
  return b;
}

std::vector<double> Powers(double base, int n) {
  std::vector<double> b;
  double v = 1;
  for (int i = 0; i <= n; ++i, v *= base) b.push_back(v);
  return b;
}

prometheus::ClientMetric GaugeValue(double v, std::vector<prometheus::ClientMetric::Label> l = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(l);
  m.gauge.value = v;
  return m;
}

prometheus::MetricFamily GaugeFamily(const char* name, const char* help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

}  // namespace

const char* MethodName(Method m) {
  static constexpr const char* kNames[kNumMethods] = {
      "Attend",          "GetServerInfo",    "GetLoad",      "CreateSequence",
      "Extend",          "ExtendBatch",      "ExtendStream", "TruncateSequence",
      "ForkSequence",    "ReleaseSequence",  "GetSequence"};
  const int i = static_cast<int>(m);
  return i >= 0 && i < kNumMethods ? kNames[i] : "unknown";
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kDecode:
      return "decode";
    case Phase::kQueue:
      return "queue";
    case Phase::kHostToDevice:
      return "host_to_device";
    case Phase::kKernel:
      return "kernel";
    case Phase::kDeviceToHost:
      return "device_to_host";
    case Phase::kEncode:
      return "encode";
  }
  return "unknown";
}

const char* CodeName(int code) {
  static const char* const kNames[kNumCodes] = {"OK",
                                                "CANCELLED",
                                                "UNKNOWN",
                                                "INVALID_ARGUMENT",
                                                "DEADLINE_EXCEEDED",
                                                "NOT_FOUND",
                                                "ALREADY_EXISTS",
                                                "PERMISSION_DENIED",
                                                "RESOURCE_EXHAUSTED",
                                                "FAILED_PRECONDITION",
                                                "ABORTED",
                                                "OUT_OF_RANGE",
                                                "UNIMPLEMENTED",
                                                "INTERNAL",
                                                "UNAVAILABLE",
                                                "DATA_LOSS",
                                                "UNAUTHENTICATED"};
  return code >= 0 && code < kNumCodes ? kNames[code] : "UNKNOWN";
}

std::vector<double> RequestDurationBuckets() {
  auto b = Decades(-5, 1, {"1", "2.5", "5"});
  b.push_back(30);
  b.push_back(60);
  return b;
}
std::vector<double> PhaseDurationBuckets() {
  auto b = Decades(-6, 1, {"1", "2.5", "5"});
  b.push_back(30);
  b.push_back(60);
  return b;
}
std::vector<double> BatchSizeBuckets() { return Powers(2, 10); }
std::vector<double> BatchTokenBuckets() { return Powers(4, 12); }
std::vector<double> FlopsPerSecondBuckets() { return Decades(8, 16, {"1", "2.5", "5"}); }
std::vector<double> BytesPerSecondBuckets() { return Decades(7, 14, {"1", "2.5", "5"}); }
std::vector<double> RelativeErrorBuckets() { return Decades(-7, 0, {"1", "2", "5"}); }

std::pair<double, double> DevicePeaks(const std::string& name) {
  auto has = [&name](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return {989e12, 4.8e12};
  if (has("H100") && has("PCIe")) return {756e12, 2.0e12};
  if (has("H100")) return {989e12, 3.35e12};
  if (has("A100")) return {312e12, 2.039e12};
  if (has("L40S")) return {362e12, 864e9};
  if (has("L4")) return {121e12, 300e9};
  return {0, 0};
}

double MinBytesMoved(int64_t q_elements, int64_t kv_elements, int dtype_bytes,
                     int64_t lse_elements) {
  return (2.0 * static_cast<double>(q_elements) + 2.0 * static_cast<double>(kv_elements)) *
             dtype_bytes +
         4.0 * static_cast<double>(lse_elements);
}

// ---- scrape-time gauges ----

class Metrics::ScrapeCollector final : public prometheus::Collectable {
 public:
  int Add(Source s) {
    std::lock_guard<std::mutex> lock(mu_);
    sources_.emplace(next_id_, std::move(s));
    return next_id_++;
  }
  void Remove(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    sources_.erase(id);
  }
  void SetPeaks(double flops, double bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    peak_flops_ = flops;
    peak_bytes_ = bytes;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    auto in_flight = GaugeFamily("attn_requests_in_flight",
                                 "Calls received and not yet finished (queued or running).");
    auto queued = GaugeFamily("attn_requests_queued", "Calls waiting for a worker thread.");
    auto pool_cap = GaugeFamily("attn_device_pool_capacity_bytes",
                                "Device memory pool reserved at start; without a GPU, the host memory "
                                "reserved for the KV cache (--kv-cache-bytes).");
    auto pool_used =
        GaugeFamily("attn_device_pool_used_bytes", "Device memory pool bytes currently allocated.");
    auto peak_flops =
        GaugeFamily("attn_device_peak_flops_per_second",
                    "Datasheet dense bf16/fp16 tensor peak of the device (0: unknown or cpu).");
    auto peak_bytes = GaugeFamily("attn_device_peak_bytes_per_second",
                                  "Datasheet memory bandwidth of the device (0: unknown or cpu).");
    auto kv_cap = GaugeFamily("attn_kv_capacity_pages", "KV-cache pages per layout class.");
    auto kv_used = GaugeFamily("attn_kv_used_pages", "KV-cache pages in use per layout class.");
    auto kv_ratio = GaugeFamily("attn_kv_used_ratio",
                                "KV-cache pages in use over pages in total, all layout classes "
                                "(0 when there are none).");
    auto kv_seq = GaugeFamily("attn_kv_sequences", "Live sequences in the KV cache.");
    auto kv_revoked = GaugeFamily("attn_kv_sequences_revoked_total",
                                  "Sequences released because their owner's last token was "
                                  "revoked (token file reloaded by SIGHUP).");
    kv_revoked.type = prometheus::MetricType::Counter;
    auto kv_host_used = GaugeFamily("attn_kv_host_used_bytes",
                                    "Host memory of the KV cache outside its pages, by kind "
                                    "(replay_outputs, sequence_metadata).");
    auto kv_host_cap = GaugeFamily("attn_kv_host_capacity_bytes",
                                   "Host-memory budget of the KV cache by kind "
                                   "(--replay-cache-bytes, --sequence-metadata-bytes).");
    std::lock_guard<std::mutex> lock(mu_);
    peak_flops.metric.push_back(GaugeValue(peak_flops_));
    peak_bytes.metric.push_back(GaugeValue(peak_bytes_));
    bool any_kv = false;
    int64_t sequences = 0, revoked = 0;
    std::map<std::string, std::pair<int64_t, int64_t>> classes;
    std::map<std::string, std::pair<int64_t, int64_t>> host;  // kind -> (used, capacity)
    int64_t in_flight_sum = 0, queued_sum = 0, cap_sum = 0, used_sum = 0;
    bool any_requests = false, any_pool = false;
    for (const auto& [id, s] : sources_) {
      if (s.in_flight) {
        any_requests = true;
        in_flight_sum += s.in_flight();
        queued_sum += s.queued ? s.queued() : 0;
      }
      if (s.pool) {
        any_pool = true;
        auto [cap, used] = s.pool();
        cap_sum += cap;
        used_sum += used;
      }
      if (s.kv) {
        any_kv = true;
        KvCacheStats st = s.kv();
        sequences += st.sequences;
        revoked += st.revoked_sequences;
        for (const auto& c : st.classes) {
          auto& e = classes[c.layout_class];
          e.first += c.capacity_pages;
          e.second += c.used_pages;
        }
        for (const auto& h : st.host) {
          auto& e = host[h.kind];
          e.first += h.used_bytes;
          e.second += h.capacity_bytes;
        }
      }
    }
    if (any_requests) {
      in_flight.metric.push_back(GaugeValue(static_cast<double>(in_flight_sum)));
      queued.metric.push_back(GaugeValue(static_cast<double>(queued_sum)));
    }
    if (any_pool) {
      pool_cap.metric.push_back(GaugeValue(static_cast<double>(cap_sum)));
      pool_used.metric.push_back(GaugeValue(static_cast<double>(used_sum)));
    }
    if (any_kv) {
      kv_seq.metric.push_back(GaugeValue(static_cast<double>(sequences)));
      int64_t cap_pages = 0, used_pages = 0;
      for (const auto& [name, v] : classes) {
        cap_pages += v.first;
        used_pages += v.second;
      }
      kv_ratio.metric.push_back(GaugeValue(
          cap_pages > 0 ? static_cast<double>(used_pages) / static_cast<double>(cap_pages) : 0));
      prometheus::ClientMetric revoked_value;
      revoked_value.counter.value = static_cast<double>(revoked);
      kv_revoked.metric.push_back(std::move(revoked_value));
      for (const auto& [name, v] : classes) {
        kv_cap.metric.push_back(GaugeValue(static_cast<double>(v.first), {{"layout_class", name}}));
        kv_used.metric.push_back(
            GaugeValue(static_cast<double>(v.second), {{"layout_class", name}}));
      }
      for (const auto& [kind, v] : host) {
        kv_host_used.metric.push_back(GaugeValue(static_cast<double>(v.first), {{"kind", kind}}));
        kv_host_cap.metric.push_back(GaugeValue(static_cast<double>(v.second), {{"kind", kind}}));
      }
    }
    std::vector<prometheus::MetricFamily> out;
    for (auto* f : {&in_flight, &queued, &pool_cap, &pool_used, &peak_flops, &peak_bytes, &kv_cap,
                    &kv_used, &kv_ratio, &kv_seq, &kv_revoked, &kv_host_used, &kv_host_cap}) {
      out.push_back(std::move(*f));
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<int, Source> sources_;
  int next_id_ = 1;
  double peak_flops_ = 0;
  double peak_bytes_ = 0;
};

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

// ---- Metrics ----

Metrics::Metrics(const std::vector<std::string>& backends,
                 const std::vector<std::pair<std::string, std::string>>& build_info)
    : registry_(std::make_shared<prometheus::Registry>()),
      collector_(std::make_shared<ScrapeCollector>()) {
  backends_.push_back("none");
  for (const auto& b : backends) {
    if (b != "none") backends_.push_back(b);
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
  auto& steps = prometheus::BuildCounter()
                    .Name("attn_sequence_steps_total")
                    .Help("Sequence steps that ended (an Extend, an ExtendBatch entry, an "
                          "ExtendStream message), by method and result (ok, error).")
                    .Register(reg);
  auto& step_duration =
      prometheus::BuildHistogram()
          .Name("attn_sequence_step_duration_seconds")
          .Help("Time from a sequence step's arrival to its result, successful steps, by method.")
          .Register(reg);
  static constexpr Method kStepMethods[kNumStepMethods] = {Method::kExtend, Method::kExtendBatch,
                                                           Method::kExtendStream};
  for (int i = 0; i < kNumStepMethods; ++i) {
    const char* name = MethodName(kStepMethods[i]);
    steps_ok_[static_cast<size_t>(i)] = &steps.Add({{"method", name}, {"result", "ok"}});
    steps_error_[static_cast<size_t>(i)] = &steps.Add({{"method", name}, {"result", "error"}});
    step_duration_[static_cast<size_t>(i)] =
        &step_duration.Add({{"method", name}}, RequestDurationBuckets());
  }
  step_batch_size_ = &prometheus::BuildHistogram()
                          .Name("attn_sequence_batch_size_steps")
                          .Help("Sequence steps per step batch.")
                          .Register(reg)
                          .Add({}, BatchSizeBuckets());
  auto& info = prometheus::BuildGauge()
                   .Name("attn_build_info")
                   .Help("Build and configuration of this server (value is always 1).")
                   .Register(reg);
  prometheus::Labels info_labels;
  for (const auto& [k, v] : build_info) info_labels[k] = v;
  info.Add(info_labels).Set(1);

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
  for (int b = 1; b < nb; ++b) {
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

void Metrics::ObserveStep(Method method, bool ok, double seconds) {
  int i = -1;
  if (method == Method::kExtend) i = 0;
  if (method == Method::kExtendBatch) i = 1;
  if (method == Method::kExtendStream) i = 2;
  if (i < 0) return;
  if (!ok) {
    steps_error_[static_cast<size_t>(i)]->Increment();
    return;
  }
  steps_ok_[static_cast<size_t>(i)]->Increment();
  step_duration_[static_cast<size_t>(i)]->Observe(seconds);
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
