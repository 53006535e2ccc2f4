// Prometheus metrics of the server (DESIGN.md §9), exported with prometheus-cpp on their own
// port (--metrics-address, path /metrics).
//
// Naming: attn_<what>_<unit>, base units (seconds, bytes), counters end in _total, histograms
// (never summaries). Label values are fixed sets: method (Attend, GetServerInfo), backend (the
// registry's names plus "none" for calls refused before a backend was chosen), code (gRPC code
// name), phase (decode, queue, host_to_device, kernel, device_to_host, encode).
//
// Exported families (see also ShadowChecker, shadow_checker.h):
//   attn_requests_total{method,backend,code}                 counter
//   attn_request_duration_seconds{method,backend,code}       histogram (receipt to finish)
//   attn_phase_duration_seconds{backend,phase}               histogram (ExecutionReport phases)
//   attn_batch_size_requests{backend}                        histogram (requests per launch)
//   attn_batch_tokens{backend}                               histogram (query tokens per launch)
//   attn_kernel_flops_per_second{backend}                    histogram (achieved, per launch)
//   attn_kernel_bytes_per_second{backend}                    histogram (achieved, per launch)
//   attn_graph_cache_hits_total{backend}, attn_graph_cache_builds_total{backend}   counters
//   attn_shadow_relative_error{backend}                      histogram (see shadow_checker.h)
//   attn_shadow_mismatches_total{backend}, attn_shadow_dropped_total{backend}      counters
//   attn_requests_in_flight, attn_requests_queued            gauges (read at scrape time)
//   attn_device_pool_capacity_bytes, attn_device_pool_used_bytes                   gauges
//   attn_device_peak_flops_per_second, attn_device_peak_bytes_per_second           gauges
//       (dense bf16/fp16 tensor peak and memory bandwidth of a known device; 0 if unknown)
//   attn_kv_capacity_pages{layout_class}, attn_kv_used_pages{layout_class},
//   attn_kv_sequences                                        gauges (RegisterKvCache)
//   attn_kv_used_ratio                                       gauge: bytes of pages in use / pool
//       over every layout class (0 with no capacity), for alerts and the HPA
//   attn_kv_host_used_bytes{kind}, attn_kv_host_capacity_bytes{kind}   gauges (RegisterKvCache):
//       host memory of the KV cache outside its pages, kind "replay_outputs"
//       (--replay-cache-bytes) and "sequence_metadata" (--sequence-metadata-bytes)
//   attn_sequence_steps_total{method,result}                 counter: sequence steps that
//       ended, method Extend|ExtendBatch|ExtendStream (one per step: an ExtendBatch entry,
//       an ExtendStream message), result ok|error
//   attn_sequence_step_duration_seconds{method}              histogram: a successful step's
//       arrival to its result, every step (prefills of thousands of tokens included)
//   attn_sequence_decode_step_duration_seconds{method}       histogram: the same, decode steps
//       only (one query token, attended): the server's share of the inter-token latency
//   attn_sequence_batch_size_steps                           histogram (steps per step batch;
//       the batch also lands in attn_batch_size_requests / attn_batch_tokens, and each step's
//       phases in attn_phase_duration_seconds, under the KV backend's name)
//   attn_shared_memory_regions, attn_shared_memory_bytes     gauges (RegisterSharedMemory):
//       host shared-memory regions mapped (leased, or released and still used by a call) and
//       their bytes; attn_shared_memory_leases: regions whose lease is open;
//       attn_shared_memory_broken_total (counter): regions a client shrank under the server
//   attn_build_info{version,build,device,compute_capability,driver,cudnn,backends,...} = 1
// served by MetricsHttpServer (metrics_http_server.h) on --metrics-address.
//
// Hot path: every label child that a request can touch is resolved to a pointer once (at
// construction, or on the first request with a rare status code) and kept in fixed arrays, so
// an observation is an array index plus the metric's own atomic add (counters) or short mutex
// (prometheus-cpp histograms); nothing is allocated per request.
//
// Scrape-time gauges come from callbacks registered with Register*(); each returns a
// Registration that unregisters on destruction (after which the callback is never called
// again), so owners can go away before the Metrics object does.
//
// For the KV cache (in main.cc, after `metrics` is built; keep the Registration alive at least
// as long as the cache can be read, and declare it after the cache so it is destroyed first):
//   const attn::metrics::Registration kv_gauges = metrics.RegisterKvCache([&sequences] {
//     attn::metrics::KvCacheStats s;
//     s.classes.push_back({"bf16_p16_h128", capacity_pages, used_pages});  // per layout class
//     s.sequences = live_sequences;
//     return s;  // called on the scrape thread: read atomics or take a short lock
//   });
// Graph caches (cuDNN backend): metrics.GraphCacheHit(b) / GraphCacheBuild(b) with
// b = metrics.BackendIndex("cudnn") resolved once.
//
// Thread-safety: every method is safe from any thread. Callbacks run on the metrics HTTP
// threads (one scrape at a time) and must be thread-safe and cheap.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attn/common/status.h"

namespace prometheus {
class Counter;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace attn::metrics {

class MetricsHttpServer;

/// The RPCs whose calls are counted (the `method` label): AttentionService and SequenceService.
enum class Method : int {
  kAttend = 0,
  kGetServerInfo = 1,
  kGetLoad = 2,
  kCreateSequence = 3,
  kExtend = 4,
  kExtendBatch = 5,
  kExtendStream = 6,  ///< one attn_requests_total per stream, when it ends (steps: ObserveStep)
  kTruncateSequence = 7,
  kForkSequence = 8,
  kReleaseSequence = 9,
  kGetSequence = 10,
  kExtendBatchStream = 11,  ///< one attn_requests_total per stream, when it ends (steps: ObserveStep)
  kSharedMemoryLease = 12,  ///< one attn_requests_total per lease stream, when it ends
};
inline constexpr int kNumMethods = 13;

enum class Phase : int {
  kDecode = 0,
  kQueue = 1,
  kHostToDevice = 2,
  kKernel = 3,
  kDeviceToHost = 4,
  kEncode = 5,
};
inline constexpr int kNumPhases = 6;
/// gRPC status codes 0..16.
inline constexpr int kNumCodes = 17;

/// Label values of `method`, `phase` and `code`.
const char* MethodName(Method m);
const char* PhaseName(Phase p);
/// Canonical gRPC name of a code 0..16 ("OK", ..., "UNAUTHENTICATED"); "UNKNOWN" otherwise.
const char* CodeName(int code);

/// Bucket boundaries (upper bounds), exposed for tests and the dashboard's documentation.
std::vector<double> RequestDurationBuckets();  ///< 10 µs .. 60 s
std::vector<double> PhaseDurationBuckets();    ///< 1 µs .. 60 s
std::vector<double> BatchSizeBuckets();        ///< 1 .. 1024, powers of 2
std::vector<double> BatchTokenBuckets();       ///< 1 .. 4^12, powers of 4
std::vector<double> FlopsPerSecondBuckets();   ///< 1e8 .. 1e16, 1-2.5-5 per decade
std::vector<double> BytesPerSecondBuckets();   ///< 1e7 .. 1e14, 1-2.5-5 per decade
std::vector<double> RelativeErrorBuckets();    ///< 1e-7 .. 1, 1-2-5 per decade

/// Peak dense bf16/fp16 tensor FLOP/s and memory bytes/s of a known GPU by its name (H200,
/// H100 SXM/PCIe, A100, L40S, L4, from the vendors' datasheets, without sparsity); {0, 0} when
/// unknown (and for "cpu").
std::pair<double, double> DevicePeaks(const std::string& device_name);

/// Minimum bytes one attention launch moves to and from memory: q, k, v, o (and lse).
/// Used for the achieved GB/s.
double MinBytesMoved(int64_t q_elements, int64_t kv_elements, int dtype_bytes,
                     int64_t lse_elements);

/// What the KV cache reports at scrape time.
struct KvCacheStats {
  struct PageClass {
    std::string layout_class;  ///< label value, e.g. "bf16_p16_h128"; distinct per class
    int64_t capacity_pages = 0;
    int64_t used_pages = 0;
  };
  std::vector<PageClass> classes;
  /// Bytes of the pages in use (K and V, every class) and the whole KV pool's size
  /// (--kv-cache-bytes or its carve of the device pool): attn_kv_used_ratio is their quotient.
  /// Not pages over capacity_pages: a class's capacity is only the pages carved for it so far,
  /// so that quotient reads ~1 while most of the pool is still free.
  int64_t used_page_bytes = 0;
  int64_t pool_bytes = 0;
  int64_t sequences = 0;  ///< live sequences
  /// Sequences released because their owner's last token was revoked (since start; a counter).
  int64_t revoked_sequences = 0;
  /// Host-memory budgets of the cache (label value of `kind`, e.g. "replay_outputs").
  struct HostBudget {
    std::string kind;
    int64_t used_bytes = 0;
    int64_t capacity_bytes = 0;
  };
  std::vector<HostBudget> host;
};

/// What the shared-memory registry (server/shm/region_registry.h) reports at scrape time.
struct SharedMemoryStats {
  int64_t regions = 0;       ///< mapped (leased, or released and still pinned by a call)
  int64_t bytes = 0;         ///< their mapped bytes
  int64_t leases = 0;        ///< regions whose lease is open
  int64_t broken_total = 0;  ///< regions found shrunk by their client (since start)
};

class Metrics;

/// Unregisters a scrape-time callback on destruction. Move-only. Empty when default-built.
class [[nodiscard]] Registration {
 public:
  Registration() = default;
  Registration(Metrics* owner, int id) : owner_(owner), id_(id) {}
  Registration(Registration&& o) noexcept { *this = std::move(o); }
  Registration& operator=(Registration&& o) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  ~Registration() { Reset(); }
  void Reset();

 private:
  Metrics* owner_ = nullptr;
  int id_ = -1;
};

class Metrics {
 public:
  /// `backends`: every backend name label values may take (the registry's names); "none" is
  /// added. `build_info`: labels of attn_build_info (name → value; names must be valid label
  /// names). `step_only_backends`: names that label only sequence steps (the KV cache's
  /// "paged-cpu" / "paged-gpu"; those already in `backends` are skipped): they get no Attend
  /// children, since no Attend call runs on them. Creates every family and the common children
  /// (Attend/OK per Attend backend, all phase, batch, throughput, graph-cache and shadow
  /// children), so they are exported at 0 from start.
  Metrics(const std::vector<std::string>& backends,
          const std::vector<std::pair<std::string, std::string>>& build_info,
          const std::vector<std::string>& step_only_backends = {});
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  /// Serves /metrics on `address` ("host:port"; port 0 picks a free port).
  /// Errors: UNAVAILABLE naming the address when it cannot be bound.
  Status Serve(const std::string& address);
  /// The bound port once serving, else 0.
  int port() const { return port_; }
  /// Stops the HTTP endpoint (idempotent); the destructor does it too.
  void StopServing();

  /// Index of backend `name` for the observation methods; 0 ("none") when unknown.
  int BackendIndex(const std::string& name) const;
  const std::vector<std::string>& backend_names() const { return backends_; }

  // ---- hot path ----
  /// One finished call: attn_requests_total and attn_request_duration_seconds.
  void ObserveRequest(Method method, int backend, StatusCode code, double seconds);
  /// One phase of a call that ran (attn_phase_duration_seconds).
  void ObservePhase(int backend, Phase phase, double seconds);
  /// One launch: batch histograms, and when kernel_seconds > 0 the achieved FLOP/s
  /// (flops / kernel_seconds) and bytes/s (bytes_moved / kernel_seconds).
  void ObserveLaunch(int backend, int64_t batch_size, int64_t batch_tokens, double flops,
                     double bytes_moved, double kernel_seconds);
  void GraphCacheHit(int backend);
  void GraphCacheBuild(int backend);
  /// One shadow check (attn_shadow_relative_error; NaN and values above 10 are recorded as 10
  /// so the histogram's sum stays finite) and whether it was over tolerance.
  void ObserveShadow(int backend, double relative_error, bool mismatch);
  void ShadowDropped(int backend);
  /// One sequence step ended (method kExtend, kExtendBatch or kExtendStream; others are
  /// ignored): attn_sequence_steps_total{method,result} and, when ok, `seconds` (arrival to
  /// result) in attn_sequence_step_duration_seconds{method}, and also in
  /// attn_sequence_decode_step_duration_seconds{method} when `decode` (one query token).
  void ObserveStep(Method method, bool ok, double seconds, bool decode = false);
  /// One batch of sequence steps: attn_sequence_batch_size_steps, and attn_batch_size_requests
  /// / attn_batch_tokens of `backend` (no FLOP/s: the step reports carry them per step).
  void ObserveStepBatch(int backend, int64_t steps, int64_t tokens);

  // ---- scrape-time gauges ----
  /// attn_requests_in_flight and attn_requests_queued.
  Registration RegisterRequestGauges(std::function<int64_t()> in_flight,
                                     std::function<int64_t()> queued);
  /// attn_device_pool_capacity_bytes / _used_bytes from {capacity, used}.
  Registration RegisterDevicePool(std::function<std::pair<int64_t, int64_t>()> usage);
  /// For the KV cache: attn_kv_capacity_pages{layout_class}, attn_kv_used_pages{layout_class}
  /// and attn_kv_sequences (summed over registrations). Until one is registered, the families
  /// are exported without samples (HELP and TYPE only).
  Registration RegisterKvCache(std::function<KvCacheStats()> stats);
  /// attn_shared_memory_regions, _bytes, _leases and _broken_total (summed over registrations;
  /// without samples until one is registered).
  Registration RegisterSharedMemory(std::function<SharedMemoryStats()> stats);
  /// attn_device_peak_flops_per_second / _bytes_per_second (static values).
  void SetDevicePeaks(double flops_per_second, double bytes_per_second);

  /// The registry, for families added elsewhere (keep DESIGN.md §9's naming).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  /// The text exposition of everything /metrics serves.
  std::string Render() const;

 private:
  friend class Registration;
  class ScrapeCollector;
  struct Source {
    std::function<int64_t()> in_flight, queued;
    std::function<std::pair<int64_t, int64_t>()> pool;
    std::function<KvCacheStats()> kv;
    std::function<SharedMemoryStats()> shm;
  };
  int AddSource(Source s);
  void RemoveSource(int id);
  prometheus::Histogram* RequestHistogram(int method, int backend, int code);
  prometheus::Counter* RequestCounter(int method, int backend, int code);
  int Clamp(int backend) const {
    return backend >= 0 && backend < static_cast<int>(backends_.size()) ? backend : 0;
  }

  std::vector<std::string> backends_;  // [0] = "none"
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeCollector> collector_;
  prometheus::Family<prometheus::Counter>* requests_total_;
  prometheus::Family<prometheus::Histogram>* request_duration_;
  std::mutex slow_mu_;  // creation of rare request children
  // [method][backend][code], created lazily (slow path under slow_mu_).
  std::unique_ptr<std::atomic<prometheus::Histogram*>[]> request_hist_;
  std::unique_ptr<std::atomic<prometheus::Counter*>[]> request_count_;
  struct PerBackend {
    std::array<prometheus::Histogram*, kNumPhases> phase{};
    prometheus::Histogram* batch_size = nullptr;
    prometheus::Histogram* batch_tokens = nullptr;
    prometheus::Histogram* flops_per_s = nullptr;
    prometheus::Histogram* bytes_per_s = nullptr;
    prometheus::Counter* graph_hits = nullptr;
    prometheus::Counter* graph_builds = nullptr;
    prometheus::Histogram* shadow_error = nullptr;
    prometheus::Counter* shadow_mismatches = nullptr;
    prometheus::Counter* shadow_dropped = nullptr;
  };
  std::vector<PerBackend> per_backend_;
  static constexpr int kNumStepMethods = 4;  // Extend, ExtendBatch, ExtendStream, ExtendBatchStream
  std::array<prometheus::Counter*, kNumStepMethods> steps_ok_{}, steps_error_{};
  std::array<prometheus::Histogram*, kNumStepMethods> step_duration_{};
  std::array<prometheus::Histogram*, kNumStepMethods> decode_step_duration_{};
  prometheus::Histogram* step_batch_size_ = nullptr;
  std::unique_ptr<MetricsHttpServer> http_;
  int port_ = 0;
};

}  // namespace attn::metrics
