// attention-server: scaled-dot-product attention as a gRPC service (attention.v1).
//
// Start-up: flags → logging → listen addresses checked → backends (device pool, cuBLAS) → gRPC
// server with health and reflection → SERVING. SIGTERM/SIGINT: health NOT_SERVING, new calls
// UNAVAILABLE, in-flight calls finish (up to --drain-timeout-s), open ExtendStreams and
// ExtendBatchStreams end with UNAVAILABLE (after their current steps) and open
// SharedMemoryLeases with it (regions released), then the server stops and the process exits 0
// (or 3 when the drain timed out with calls still running).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend_factory.h"
#include "common/logging.h"
#include "common/unix_socket.h"
#include "config/server_flags.h"
#include "backends/paged/kv_runtime.h"
#include "grpc/health/v1/health.pb.h"
#include "health/health_fanout.h"
#include "health/health_listener.h"
#include "kv_cache/sequence_id.h"
#include "kv_cache/sequence_store.h"
#include "metrics/build_info.h"
#include "metrics/metrics.h"
#include "metrics/metrics_http_server.h"
#include "service/shadow_checker.h"
#include "security/server_security.h"
#include "service/attention_service.h"
#include "service/load_report.h"
#include "service/sequence_service.h"
#include "common/worker_pool.h"
#include "shm/region_registry.h"
#include "startup/cuda_ipc_opener.h"
#include "startup/drain.h"
#include "startup/listen_address.h"
#include "startup/main_listener.h"
#include "version.h"

namespace {

// Run's helpers return an exit code, or kContinue when start-up goes on.
constexpr int kContinue = -1;

// --listen unix:PATH (common/unix_socket.h): flags checked before anything starts.
int CheckUnixSocketFlags(const attn::ServerConfig& config, bool unix_socket, mode_t* socket_mode) {
  if (unix_socket) {
    auto mode = attn::ParseSocketMode(config.unix_socket_mode, "--unix-socket-mode");
    if (!mode.ok()) {
      spdlog::critical("{}", mode.status().ToString());
      return 2;
    }
    *socket_mode = *mode;
  } else if (config.unix_socket_flags_given) {
    spdlog::critical(
        "--unix-socket-mode/-owner/-group apply only to --listen unix:PATH (got "
        "--listen {})",
        config.listen_address);
    return 2;
  }
  return kContinue;
}

// GetServerInfo's kv_cache section and CUDA IPC facts, and the host pool as the pool when no
// device pool opened.
void AddKvFacts(const attn::KvRuntime& kv, const attn::startup::CudaIpcFacts& ipc,
                attn::BuiltBackends* built) {
  built->facts.extra_info = [&sequences = *kv.store, kv_device = kv.device,
                             ipc](attention::v1::GetServerInfoResponse* r) {
    attn::FillKvCacheInfo(sequences, r->mutable_kv_cache());
    r->mutable_kv_cache()->set_device(kv_device);
    r->set_device_uuid(ipc.device_uuid);
    r->set_cuda_ipc_regions(ipc.accepted);
  };
  if (!built->facts.pool_usage) {
    attn::KvMemory* host = kv.memory.get();
    built->facts.pool_usage = [host] {
      return std::make_pair(static_cast<int64_t>(host->capacity()),
                            static_cast<int64_t>(host->used()));
    };
  }
}

// The backends metrics label: the registry's (Attend runs there); the KV cache's paged backend
// ("paged-cpu" or "paged-gpu", labelling the sequence steps' phases and batches) goes beside.
std::vector<std::string> MetricsBackendNames(const attn::BackendRegistry& registry) {
  std::vector<std::string> names;
  for (attn::Backend* b : registry.All()) names.push_back(b->name());
  return names;
}

// attn_build_info's inputs: the device, the available backends and the configuration.
attn::metrics::BuildInfo BuildInfoOf(const attn::ServerConfig& config,
                                     const attn::BuiltBackends& built, int threads) {
  attn::metrics::BuildInfo info;
  info.device = built.facts.device_name;
  info.compute_capability = built.facts.compute_capability;
  for (attn::Backend* b : built.registry->All()) {
    if (!b->available()) continue;
    info.backends += (info.backends.empty() ? "" : ",") + b->name();
  }
  info.default_backend = config.default_backend;
  info.worker_threads = threads;
  info.max_queue_requests = config.max_queue_requests;
  info.max_message_bytes = config.max_message_bytes;
  info.gpu_memory_fraction = config.gpu_memory_fraction;
  info.shadow_check_fraction = config.shadow_check_fraction;
  return info;
}

// Metrics (DESIGN.md §9): always recorded; served on --metrics-address unless it is empty.
int ServeMetrics(const attn::ServerConfig& config, attn::metrics::Metrics* metrics) {
  if (config.metrics_address.empty()) return kContinue;
  if (auto s = metrics->Serve(config.metrics_address); !s.ok()) {
    if (config.metrics_address_given) {
      spdlog::critical("{}", s.ToString());
      return 1;
    }
    spdlog::error("{}; metrics are not served", s.ToString());
  } else {
    std::string host = config.metrics_address.substr(0, config.metrics_address.rfind(':'));
    if (host.empty()) host = "0.0.0.0";  // every IPv4 interface
    spdlog::info("metrics: http://{}:{}/metrics", host, metrics->port());
  }
  return kContinue;
}

// attn_kv_* gauges from the sequence store, computed at scrape time.
attn::metrics::Registration RegisterKvGauges(attn::metrics::Metrics* metrics,
                                             attn::SequenceStore* sequences) {
  return metrics->RegisterKvCache([sequences] {
    attn::metrics::KvCacheStats stats;
    sequences->SweepExpired();  // expired sequences are not counted
    for (const attn::KvClassStats& c : sequences->pool()->Stats()) {
      stats.classes.push_back({"k" + std::to_string(c.layout.num_kv_heads) + "_h" +
                                   std::to_string(c.layout.head_dim) + "_" +
                                   attn::kernels::DTypeName(c.layout.kv_dtype),
                               c.pages_total, c.pages_used});
      stats.used_page_bytes += c.pages_used * 2 * c.page_bytes;  // a K and a V page each
    }
    stats.pool_bytes = static_cast<int64_t>(sequences->pool()->pool_bytes());
    stats.sequences = sequences->live_sequences();
    stats.revoked_sequences = sequences->revocations();
    for (const auto& [kind, budget] :
         {std::pair{"replay_outputs", sequences->replay_budget().get()},
          std::pair{"sequence_metadata", sequences->metadata_budget().get()}}) {
      stats.host.push_back({kind, budget->used(), budget->cap()});
    }
    return stats;
  });
}

// --max-shared-memory-regions / --max-shared-memory-bytes (SharedMemoryLease, server/shm/).
attn::shm::RegistryLimits ShmLimits(const attn::ServerConfig& config) {
  return {config.max_shared_memory_regions, config.max_shared_memory_bytes};
}

// attn_shared_memory_* from the host shared-memory regions (server/shm/), at scrape time.
attn::metrics::Registration RegisterShmGauges(attn::metrics::Metrics* metrics,
                                              const attn::shm::RegionRegistry* regions) {
  return metrics->RegisterSharedMemory([regions] {
    const attn::shm::RegistryStats s = regions->stats();
    return attn::metrics::SharedMemoryStats{s.regions, s.mapped_bytes, s.leased, s.broken_total};
  });
}

// The plaintext --health-address listener (when set), then one health state for it and the
// main listener, SERVING. On failure the main server is shut down.
int StartHealth(const attn::ServerConfig& config, grpc::Server* server,
                std::unique_ptr<attn::health::HealthListener>* health_listener,
                std::unique_ptr<attn::health::HealthFanout>* health_fanout) {
  if (!config.health_address.empty()) {
    auto listener = attn::health::HealthListener::Start(config.health_address);
    if (!listener.ok()) {
      spdlog::critical("{}", listener.status().ToString());
      server->Shutdown(std::chrono::system_clock::now());
      return 1;
    }
    *health_listener = std::move(*listener);
    spdlog::info("health listener: {} port {} (plaintext, grpc.health.v1 only)",
                 config.health_address, (*health_listener)->port());
  }
  *health_fanout =
      std::make_unique<attn::health::HealthFanout>(std::vector<grpc::HealthCheckServiceInterface*>{
          server->GetHealthCheckService(),
          *health_listener ? (*health_listener)->health() : nullptr});
  auto* health = health_fanout->get();
  health->SetServingStatus(attn::health::kAttentionServiceName, true);
  health->SetServingStatus(attn::health::kSequenceServiceName, true);
  health->SetServingStatus(true);
  // Kubelet liveness probes ask for "liveness": SERVING until a device fault, and still SERVING
  // while draining (readiness, the "" service, goes NOT_SERVING then), so a drain is never
  // mistaken for a hung process.
  health->SetServingStatus(attn::health::kLivenessServiceName, true);
  return kContinue;
}

// --port-file: the port (or the unix: address). On failure the server is shut down.
int WritePortFile(const attn::ServerConfig& config, bool unix_socket, int port,
                  grpc::Server* server) {
  if (config.port_file.empty()) return kContinue;
  std::ofstream out(config.port_file);
  if (unix_socket) {
    out << config.listen_address << "\n";
  } else {
    out << port << "\n";
  }
  out.close();
  if (!out) {
    spdlog::critical("--port-file: cannot write {}", config.port_file);
    server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  return kContinue;
}

// Serving with what Run built (`plan`: the Unix socket mode checked): the sequence service,
// metrics, the Attend service, GetLoad, the main and health listeners, the port file; then waits
// for SIGTERM/SIGINT (SIGHUP reloads the tokens) and drains. Returns the process exit code.
int Serve(const attn::ServerConfig& config, const sigset_t& signals,
          const attn::security::ServerSecurity& security, attn::BuiltBackends* built,
          attn::KvRuntime* kv, attn::WorkerPool* workers, int threads,
          attn::startup::ListenerPlan plan) {
  const bool unix_socket = attn::IsUnixAddress(config.listen_address);
  attn::SequenceStore& sequences = *kv->store;
  // Continuous batching of sequence steps (server/batching/step_batcher.h, DESIGN.md §8).
  attn::BatchSchedulerOptions step_batching;
  step_batching.policy = {config.max_batch_tokens, config.max_batch_requests,
                          config.max_queue_delay_us};
  step_batching.threads = config.batch_threads > 0 ? config.batch_threads : threads;
  step_batching.max_queued = config.max_queue_requests;
  step_batching.name = "sequence step";
  // Decode-sized work (--inline-step-tokens, 16: a few decode or speculative steps) that finds
  // the step batcher idle runs on the gRPC thread that read it (batch_scheduler.h).
  step_batching.inline_max_tokens = config.inline_step_tokens;
  attn::shm::RegionRegistry shm_regions(ShmLimits(config));  // outlives the service
  attn::SequenceServiceImpl sequence_service(&sequences, kv->compute.get(), workers, step_batching);
  sequence_service.SetMaxBatchesInFlight(config.max_batches_in_flight);
  sequence_service.SetWorkBounds({config.max_cpu_score_pairs, config.max_gpu_flops});
  AddKvFacts(*kv, attn::startup::InstallCudaIpc(*built, *kv, &shm_regions), built);

  std::unique_ptr<grpc::Server> server;
  // Health state for the main listener and the plaintext --health-address listener alike.
  std::unique_ptr<attn::health::HealthListener> health_listener;
  std::unique_ptr<attn::health::HealthFanout> health_fanout;
  std::atomic<bool> faulted{false};
  auto on_fault = [&health_fanout, &faulted] {
    if (!faulted.exchange(true) && health_fanout) {
      spdlog::error("device fault: health is now NOT_SERVING");
      health_fanout->SetServingStatus(false);
    }
  };
  sequence_service.SetFaultHandler(on_fault);  // a paged-gpu fault: NOT_SERVING too
  attn::metrics::Metrics metrics(
      MetricsBackendNames(*built->registry),
      attn::metrics::BuildInfoLabels(BuildInfoOf(config, *built, threads)), {kv->compute->name()});
  const auto peaks = attn::metrics::DevicePeaks(built->facts.device_name);
  metrics.SetDevicePeaks(peaks.first, peaks.second);
  if (int code = ServeMetrics(config, &metrics); code != kContinue) return code;
  attn::metrics::ShadowChecker shadow({config.shadow_check_fraction}, &metrics);
  attn::AttentionServiceImpl service(config, built->registry.get(), workers, built->facts, on_fault,
                                     &metrics, &shadow);
  auto queued = [workers, &service, &sequence_service] {
    return static_cast<int64_t>(workers->queued()) + service.queued_requests() +
           sequence_service.queued_requests();
  };
  const attn::metrics::Registration request_gauges =
      // In flight: Attend calls plus SequenceService calls and open streams (as GetLoad).
      metrics.RegisterRequestGauges(
          [&service, &sequence_service] {
            return service.in_flight() + sequence_service.in_flight();
          },
          queued);
  // GetLoad (service/load_report.h): the queue depth has one feed, SetQueueDepthSource.
  attn::LoadReporter load(&sequences, config.max_queue_requests, threads);
  load.SetQueueDepthSource(queued);
  load.AddInFlightSource([&service] { return service.in_flight(); });
  load.AddInFlightSource([&sequence_service] { return sequence_service.in_flight(); });
  service.SetLoadReporter(&load);
  auto pool_usage = built->facts.pool_usage;
  const attn::metrics::Registration pool_gauges =
      metrics.RegisterDevicePool([pool_usage]() -> std::pair<int64_t, int64_t> {
        return pool_usage ? pool_usage() : std::pair<int64_t, int64_t>{0, 0};
      });
  const attn::metrics::Registration kv_gauges = RegisterKvGauges(&metrics, &sequences);
  const attn::metrics::Registration shm_gauges = RegisterShmGauges(&metrics, &shm_regions);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Registers grpc.health.v1's descriptors (attn_health_proto) so reflection can describe the
  // health service gRPC serves; without this reference the linker drops them.
  (void)grpc::health::v1::HealthCheckResponse::descriptor();
  // --listen was checked by CheckListenAddresses: its port is in [0, 65535].
  plan.requested_port = unix_socket ? 0 : attn::startup::ListenPort(config.listen_address);
  if (unix_socket) {  // again: another server may have started meanwhile
    plan.socket_path = attn::UnixSocketPath(config.listen_address);
    if (auto s = attn::PrepareUnixSocket(plan.socket_path); !s.ok()) {
      spdlog::critical("{}", s.ToString());
      return s.code() == attn::StatusCode::kInvalidArgument ? 2 : 1;
    }
  }
  // From here on every return from Serve removes the socket file (no other server's: checked).
  const attn::UnixSocketFile socket_file(plan.socket_path);
  plan.replica_tag_hex = attn::ReplicaTagHex(sequences.options().replica_tag);
  service.SetCallGate(security.gate.get());
  sequence_service.SetCallGate(security.gate.get());
  sequence_service.SetSharedMemory(&shm_regions);
  sequence_service.SetMetrics(&metrics);
  int port = 0;
  int code = 0;
  server = attn::startup::StartMainListener(config, security, plan, {&service, &sequence_service},
                                            &port, &code);
  if (!server) return code;
  if (code = StartHealth(config, server.get(), &health_listener, &health_fanout);
      code != kContinue) {
    return code;
  }
  if (code = WritePortFile(config, unix_socket, port, server.get()); code != kContinue) {
    return code;
  }
  spdlog::info("attention-server {} serving on {}{}; default backend {}; {} workers",
               attn::kAttnVersion, config.listen_address,
               unix_socket ? "" : " (port " + std::to_string(port) + ")", config.default_backend,
               threads);

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    // An identity left without a token loses its open streams and its sequences now.
    sequence_service.RevokeIdentities(attn::security::ReloadTokens(security.authenticator.get()));
  }
  attn::startup::DrainOrExit(
      config, {&service, &sequence_service, &sequences, &load, health_fanout.get(), faulted.load()},
      sig, plan.socket_path);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  workers->Stop();
  server->Wait();
  shadow.Stop();
  sequence_service.step_batcher()->Stop();  // its summary before the last line, not after
  spdlog::info("stopped cleanly");
  return 0;
}

// --listen and --health-address (startup/listen_address.h), the form of --metrics-address
// (binding it comes later: a port in use is an error only when the flag was given), and a
// unix:PATH's file, before anything heavy starts: a bad one exits 2 at once.
int CheckListenAddresses(const attn::ServerConfig& config) {
  // An error about a value that came from its ATTN_* variable names the variable.
  auto sourced = [&config](const std::string& flag, attn::Status s) {
    auto it = config.env_sources.find(flag);
    if (s.ok() || it == config.env_sources.end()) return s;
    return attn::Status(s.code(), it->second + ": " + s.message());
  };
  auto s = sourced("listen",
                   attn::startup::CheckListenAddress("--listen", config.listen_address, true));
  if (s.ok() && !config.health_address.empty()) {
    s = sourced("health-address", attn::startup::CheckListenAddress(
                                      "--health-address", config.health_address, false));
  }
  if (s.ok() && !config.metrics_address.empty()) {
    s = sourced("metrics-address",
                attn::metrics::MetricsHttpServer::CheckAddress(config.metrics_address));
  }
  if (s.ok() && attn::IsUnixAddress(config.listen_address)) {
    s = sourced("listen", attn::PrepareUnixSocket(attn::UnixSocketPath(config.listen_address)));
  }
  if (s.ok()) return kContinue;
  spdlog::critical("{}", s.ToString());
  return s.code() == attn::StatusCode::kInvalidArgument ? 2 : 1;
}

// Start-up in order: the listen addresses, security (TLS, tokens; bad files exit 2), backends,
// the worker pool and the KV cache, then Serve. Returns the process exit code (0 after a clean
// drain; 1 or 2 for start-up errors).
int Run(const attn::ServerConfig& config, const sigset_t& signals) {
  if (int code = CheckListenAddresses(config); code != kContinue) return code;
  attn::startup::ListenerPlan plan;
  if (int code = CheckUnixSocketFlags(config, attn::IsUnixAddress(config.listen_address),
                                      &plan.socket_mode);
      code != kContinue) {
    return code;
  }
  // TLS / mTLS credentials, token file, per-request limits (server/security/): bad files exit 2.
  auto security = attn::security::BuildServerSecurity(
      {config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file,
       config.auth_token_file, config.max_tensor_elements, config.listen_address,
       config.metrics_address});
  if (!security.ok()) {
    spdlog::critical("{}", security.status().ToString());
    return 2;
  }
  auto built = attn::BuildBackends(config);
  if (!built.ok()) {
    spdlog::critical("{}", built.status().ToString());
    return 2;
  }
  const int threads = config.worker_threads > 0 ? config.worker_threads
                                                : std::max(1u, std::thread::hardware_concurrency());
  attn::WorkerPool workers(threads, static_cast<size_t>(config.max_queue_requests));
  // Paged KV cache (DESIGN.md §7): pages in device memory with the GPU kernels when a GPU
  // opened (--kv-device), else in host memory with the CPU path.
  auto kv = attn::BuildKvRuntime(config, *built);
  if (!kv.ok()) {
    spdlog::critical("{}", kv.status().ToString());
    return 2;
  }
  return Serve(config, signals, *security, &*built, kv->get(), &workers, threads, plan);
}

}  // namespace

int main(int argc, char** argv) {
  // Tensors (1 MiB and more) get their own mappings, returned to the system when freed:
  // otherwise glibc's adaptive threshold keeps them in the heap, and memory freed by calls a
  // slow reader held (issue 16 item 4) stays in the RSS. MALLOC_MMAP_THRESHOLD_ overrides.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  attn::ServerConfig config;
  const int code = attn::ParseServerFlags(argc, argv, &config);
  if (code >= 0) return code;
  if (auto s = attn::ConfigureLogging(config.log_level, config.log_format); !s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  for (const std::string& w : config.env_warnings) spdlog::warn("{}", w);
  // Block SIGINT/SIGTERM in every thread; the main thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);  // reloads --auth-token-file
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return Run(config, signals);
}
