// attention-server: scaled-dot-product attention as a gRPC service (attention.v1).
//
// Start-up: flags → logging → backends (device pool, cuBLAS) → gRPC server with health and
// reflection → SERVING. SIGTERM/SIGINT: health NOT_SERVING, new calls UNAVAILABLE, in-flight
// calls finish (up to --drain-timeout-s), open ExtendStreams end with UNAVAILABLE (after their
// current step), then the server stops and the process exits 0 (or 3 when the drain timed out
// with calls still running).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend_factory.h"
#include "common/logging.h"
#include "common/unix_socket.h"
#include "config/server_flags.h"
#include "kv_cache/kv_runtime.h"
#include "kv_cache/sequence_id.h"
#include "kv_cache/sequence_store.h"
#include "metrics/build_info.h"
#include "metrics/metrics.h"
#include "metrics/shadow_checker.h"
#include "grpc/health/v1/health.pb.h"
#include "security/health_fanout.h"
#include "security/health_listener.h"
#include "security/server_security.h"
#include "security/without_reflection.h"
#include "service/attention_service.h"
#include "service/load_report.h"
#include "service/replica_tag_header.h"
#include "service/sequence_service.h"
#include "common/worker_pool.h"
#include "version.h"

namespace {

constexpr const char kServiceName[] = "attention.v1.AttentionService";
constexpr const char kLivenessService[] = "liveness";  // grpc.health.v1 name for liveness probes

// Port of a "host:port" or "[v6]:port" address; -1 when missing or outside [0, 65535].
int ListenPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return -1;
  const std::string digits = address.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int port = std::stoi(digits);
  return port <= 65535 ? port : -1;
}

int Run(const attn::ServerConfig& config, const sigset_t& signals) {
  // --listen unix:PATH (common/unix_socket.h): flags checked before anything starts.
  const bool unix_socket = attn::IsUnixAddress(config.listen_address);
  const std::string socket_path = attn::UnixSocketPath(config.listen_address);
  mode_t socket_mode = 0660;
  if (unix_socket) {
    auto mode = attn::ParseSocketMode(config.unix_socket_mode, "--unix-socket-mode");
    if (!mode.ok()) {
      spdlog::critical("{}", mode.status().ToString());
      return 2;
    }
    socket_mode = *mode;
  } else if (config.unix_socket_flags_given) {
    spdlog::critical("--unix-socket-mode/-owner/-group apply only to --listen unix:PATH (got "
                     "--listen {})",
                     config.listen_address);
    return 2;
  }
  // TLS / mTLS credentials, token file, per-request limits (server/security/): bad files exit 2.
  auto security = attn::security::BuildServerSecurity(config);
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
  attn::SequenceStore& sequences = *(*kv)->store;
  // Continuous batching of sequence steps (server/batching/step_batcher.h, DESIGN.md §8).
  attn::BatchSchedulerOptions step_batching;
  step_batching.policy = {config.max_batch_tokens, config.max_batch_requests,
                          config.max_queue_delay_us};
  step_batching.threads = config.batch_threads > 0 ? config.batch_threads : threads;
  step_batching.max_queued = config.max_queue_requests;
  step_batching.name = "sequence step";
  attn::SequenceServiceImpl sequence_service(&sequences, (*kv)->compute.get(), &workers,
                                             step_batching);
  built->facts.extra_info = [&sequences, kv_device = (*kv)->device](
                                attention::v1::GetServerInfoResponse* r) {
    attn::FillKvCacheInfo(sequences, r->mutable_kv_cache());
    r->mutable_kv_cache()->set_device(kv_device);
  };
  if (!built->facts.pool_usage) {
    attn::KvMemory* host = (*kv)->memory.get();
    built->facts.pool_usage = [host] {
      return std::make_pair(static_cast<int64_t>(host->capacity()),
                            static_cast<int64_t>(host->used()));
    };
  }

  std::unique_ptr<grpc::Server> server;
  // Health state for the main listener and the plaintext --health-address listener alike.
  std::unique_ptr<attn::security::HealthListener> health_listener;
  std::unique_ptr<attn::security::HealthFanout> health_fanout;
  std::atomic<bool> faulted{false};
  auto on_fault = [&health_fanout, &faulted] {
    if (!faulted.exchange(true) && health_fanout) {
      spdlog::error("device fault: health is now NOT_SERVING");
      health_fanout->SetServingStatus(false);
    }
  };
  // Metrics (DESIGN.md §9): always recorded; served on --metrics-address unless it is empty.
  std::vector<std::string> backend_names;
  for (attn::Backend* b : built->registry->All()) backend_names.push_back(b->name());
  // The KV cache's paged backend ("cpu" or "gpu") labels the sequence steps' phases and batches.
  const std::string& kv_backend = (*kv)->compute->name();
  if (std::find(backend_names.begin(), backend_names.end(), kv_backend) == backend_names.end()) {
    backend_names.push_back(kv_backend);
  }
  attn::metrics::Metrics metrics(
      backend_names,
      attn::metrics::BuildInfoLabels(config, built->facts, *built->registry, threads));
  const auto peaks = attn::metrics::DevicePeaks(built->facts.device_name);
  metrics.SetDevicePeaks(peaks.first, peaks.second);
  if (!config.metrics_address.empty()) {
    if (auto s = metrics.Serve(config.metrics_address); !s.ok()) {
      if (config.metrics_address_given) {
        spdlog::critical("{}", s.ToString());
        return 1;
      }
      spdlog::error("{}; metrics are not served", s.ToString());
    } else {
      const std::string host = config.metrics_address.substr(0, config.metrics_address.rfind(':'));
      spdlog::info("metrics: http://{}:{}/metrics", host, metrics.port());
    }
  }
  attn::metrics::ShadowChecker shadow({config.shadow_check_fraction}, &metrics);
  attn::AttentionServiceImpl service(config, built->registry.get(), &workers, built->facts,
                                     on_fault, &metrics, &shadow);
  const attn::metrics::Registration request_gauges =
      // In flight: Attend calls plus SequenceService calls and open streams (as GetLoad).
      metrics.RegisterRequestGauges([&service, &sequence_service] {
                                      return service.in_flight() + sequence_service.in_flight();
                                    },
                                    [&workers, &service, &sequence_service] {
                                      return static_cast<int64_t>(workers.queued()) +
                                             service.queued_requests() +
                                             sequence_service.queued_requests();
                                    });
  // GetLoad (service/load_report.h): the queue depth has one feed, SetQueueDepthSource.
  attn::LoadReporter load(&sequences, config.max_queue_requests, threads);
  load.SetQueueDepthSource([&workers, &service, &sequence_service] {
    return static_cast<int64_t>(workers.queued()) + service.queued_requests() +
           sequence_service.queued_requests();
  });
  load.AddInFlightSource([&service] { return service.in_flight(); });
  load.AddInFlightSource([&sequence_service] { return sequence_service.in_flight(); });
  service.SetLoadReporter(&load);
  auto pool_usage = built->facts.pool_usage;
  const attn::metrics::Registration pool_gauges =
      metrics.RegisterDevicePool([pool_usage]() -> std::pair<int64_t, int64_t> {
        return pool_usage ? pool_usage() : std::pair<int64_t, int64_t>{0, 0};
      });

  const attn::metrics::Registration kv_gauges = metrics.RegisterKvCache([&sequences] {
    attn::metrics::KvCacheStats stats;
    sequences.SweepExpired();  // expired sequences are not counted
    for (const attn::KvClassStats& c : sequences.pool()->Stats()) {
      stats.classes.push_back({"k" + std::to_string(c.layout.num_kv_heads) + "_h" +
                                   std::to_string(c.layout.head_dim) + "_" +
                                   attn::kernels::DTypeName(c.layout.kv_dtype),
                               c.pages_total, c.pages_used});
    }
    stats.sequences = sequences.live_sequences();
    stats.revoked_sequences = sequences.revocations();
    for (const auto& [kind, budget] :
         {std::pair{"replay_outputs", sequences.replay_budget().get()},
          std::pair{"sequence_metadata", sequences.metadata_budget().get()}}) {
      stats.host.push_back({kind, budget->used(), budget->cap()});
    }
    return stats;
  });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Registers grpc.health.v1's descriptors (attn_health_proto) so reflection can describe the
  // health service gRPC serves; without this reference the linker drops them.
  (void)grpc::health::v1::HealthCheckResponse::descriptor();
  grpc::ServerBuilder builder;
  int port = 0;
  const int requested_port = unix_socket ? 0 : ListenPort(config.listen_address);
  if (requested_port < 0) {
    spdlog::critical("--listen: expected host:port with port in [0, 65535] or unix:PATH, got "
                     "\"{}\"",
                     config.listen_address);
    return 2;
  }
  if (unix_socket) {
    if (auto s = attn::PrepareUnixSocket(socket_path); !s.ok()) {
      spdlog::critical("{}", s.ToString());
      return s.code() == attn::StatusCode::kInvalidArgument ? 2 : 1;
    }
  }
  // From here on every return from Run removes the socket file (no other server's: checked).
  const attn::UnixSocketFile socket_file(unix_socket ? socket_path : "");
  // One server per port: without this gRPC sets SO_REUSEPORT and a second server on a busy
  // port would silently share its traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(config.listen_address, security->credentials, &port);
  if (security->authenticator->mode() == attn::security::AuthMode::kToken) {
    builder.SetOption(std::make_unique<attn::security::WithoutReflection>());  // not authenticated
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  // Careless and hostile clients (issue 16 item 4): transport memory, streams per connection,
  // dead connections (keepalive) and idle ones. Responses a client never reads are bounded
  // by the Attend service (--max-unsent-response-bytes, --response-write-timeout-s).
  grpc::ResourceQuota quota("attention-server");
  if (config.grpc_memory_bytes > 0 && config.grpc_memory_bytes < 2 * config.max_message_bytes) {
    // gRPC resets a stream whose message does not fit the quota: the largest request allowed
    // would be refused.
    spdlog::critical(
        "--grpc-memory-bytes ({}) must be 0 or at least twice --max-message-bytes "
        "({})",
        config.grpc_memory_bytes, config.max_message_bytes);
    return 2;
  }
  if (config.grpc_memory_bytes > 0) {
    quota.Resize(static_cast<size_t>(config.grpc_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.max_streams_per_connection);
  auto ms = [](double s) { return static_cast<int>(std::min(s * 1e3, 2147483647.0)); };
  if (config.keepalive_time_s > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(config.keepalive_time_s));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(config.keepalive_timeout_s));
  }
  if (config.max_connection_idle_s > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(config.max_connection_idle_s));
  }
  // Connection age (issue 19): long-lived clients reconnect, re-resolving the headless Service.
  if (config.max_connection_age_s > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(config.max_connection_age_s));
    if (config.max_connection_age_grace_s > 0) {
      builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                 ms(config.max_connection_age_grace_s));
    }
  }
  {
    // x-attn-replica-tag on every response (service/replica_tag_header.h): the ids' tag.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> tag;
    tag.push_back(
        attn::MakeReplicaTagInterceptor(attn::ReplicaTagHex(sequences.options().replica_tag)));
    builder.experimental().SetInterceptorCreators(std::move(tag));
  }
  service.SetCallGate(security->gate.get());
  sequence_service.SetCallGate(security->gate.get());
  sequence_service.SetMetrics(&metrics);
  builder.RegisterService(&service);
  builder.RegisterService(&sequence_service);
  {
    // The socket file is created owner-only, then opened up to --unix-socket-mode below.
    std::optional<attn::ScopedUmask> owner_only;
    if (unix_socket) owner_only.emplace(0177);
    server = builder.BuildAndStart();
  }
  if (!server || port == 0 || (requested_port != 0 && port != requested_port)) {
    spdlog::critical("could not listen on {} (address in use or not local?)",
                     config.listen_address);
    if (server) server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  if (unix_socket) {
    if (auto s = attn::ApplyUnixSocketAccess(socket_path, socket_mode, config.unix_socket_owner,
                                             config.unix_socket_group);
        !s.ok()) {
      spdlog::critical("{}", s.ToString());
      server->Shutdown(std::chrono::system_clock::now());
      return 2;
    }
  }
  if (!config.health_address.empty()) {
    auto listener = attn::security::HealthListener::Start(config.health_address);
    if (!listener.ok()) {
      spdlog::critical("{}", listener.status().ToString());
      server->Shutdown(std::chrono::system_clock::now());
      return 1;
    }
    health_listener = std::move(*listener);
    spdlog::info("health listener: {} port {} (plaintext, grpc.health.v1 only)",
                 config.health_address, health_listener->port());
  }
  health_fanout = std::make_unique<attn::security::HealthFanout>(
      std::vector<grpc::HealthCheckServiceInterface*>{
          server->GetHealthCheckService(), health_listener ? health_listener->health() : nullptr});
  auto* health = health_fanout.get();
  health->SetServingStatus(kServiceName, true);
  health->SetServingStatus("attention.v1.SequenceService", true);
  health->SetServingStatus(true);
  // Kubelet liveness probes ask for "liveness": SERVING until a device fault, and still SERVING
  // while draining (readiness, the "" service, goes NOT_SERVING then), so a drain is never
  // mistaken for a hung process.
  health->SetServingStatus(kLivenessService, true);
  if (!config.port_file.empty()) {
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
  }
  spdlog::info("attention-server {} serving on {}{}; default backend {}; {} workers",
               attn::kAttnVersion, config.listen_address,
               unix_socket ? "" : " (port " + std::to_string(port) + ")", config.default_backend,
               threads);

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    // An identity left without a token loses its open streams and its sequences now.
    sequence_service.RevokeIdentities(attn::security::ReloadTokens(security->authenticator.get()));
  }
  spdlog::info("signal {}: draining ({} calls and {} sequence calls or streams in flight)", sig,
               service.in_flight(), sequence_service.in_flight());
  health->SetServingStatus(false);
  health->SetServingStatus(kServiceName, false);
  health->SetServingStatus("attention.v1.SequenceService", false);
  if (!faulted.load()) health->SetServingStatus(kLivenessService, true);
  service.StartDraining();
  sequence_service.StartDraining();
  load.SetDraining();
  // One deadline for the whole drain (--drain-timeout-s), shared by both services.
  const auto drain_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(config.drain_timeout_s * 1e3));
  auto remaining = [&drain_deadline] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(drain_deadline - std::chrono::steady_clock::now(),
                 std::chrono::steady_clock::duration::zero()));
  };
  // --drain-wait-sequences: serve the sequences held here until released or expired (new ones
  // are refused), so scale-down strands no live generation; then the calls in flight.
  if (config.drain_wait_sequences && !sequence_service.WaitSequencesGone(remaining())) {
    spdlog::warn("drain timeout after {} s: dropping {} live sequences", config.drain_timeout_s,
                 sequences.live_sequences());
  }
  // Open ExtendStreams end now (idle ones at once, busy ones after their current step) with
  // UNAVAILABLE; a client keeping a stream open would otherwise hold the drain to its timeout.
  sequence_service.EndStreams();
  const bool drained = service.WaitIdle(remaining()) && sequence_service.WaitIdle(remaining());
  if (!drained) {
    // Calls still queued (never started) get UNAVAILABLE now rather than a closed socket;
    // a moment lets gRPC write those statuses before the process exits.
    const attn::Status refused = attn::Unavailable(
        "server is draining: the drain timeout passed before this call started; retry on "
        "another replica");
    const int64_t dropped = service.RefuseQueued(refused) +
                            sequence_service.step_batcher()->scheduler()->RefuseQueued(refused);
    if (dropped > 0) {
      spdlog::warn("drain timeout: refused {} queued calls/steps with UNAVAILABLE", dropped);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    // Computations that have started cannot be interrupted; exit now rather than outlive the
    // orchestrator's grace period. Exit code 3 says the drain timed out. No Shutdown(): it
    // waits for every running call's reactor, i.e. for those very computations (a 30 s CPU
    // Attend held the process 30 s past a 1 s drain timeout); their clients see the connection
    // close (UNAVAILABLE).
    spdlog::error(
        "drain timeout after {} s: {} calls and {} sequence calls still in flight; "
        "exiting with code 3",
        config.drain_timeout_s, service.in_flight(), sequence_service.in_flight());
    if (unix_socket) attn::RemoveUnixSocket(socket_path);
    spdlog::default_logger()->flush();
    std::_Exit(3);
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  workers.Stop();
  server->Wait();
  shadow.Stop();
  spdlog::info("stopped cleanly");
  return 0;
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
  // Block SIGINT/SIGTERM in every thread; the main thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);  // reloads --auth-token-file
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return Run(config, signals);
}
