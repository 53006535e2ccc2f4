// attention-server: scaled-dot-product attention as a gRPC service (attention.v1).
//
// Start-up: flags → logging → backends (device pool, cuBLAS) → gRPC server with health and
// reflection → SERVING. SIGTERM/SIGINT: health NOT_SERVING, new calls UNAVAILABLE, in-flight
// calls finish (up to --drain-timeout-s), then the server stops and the process exits 0 (or 3
// when the drain timed out with calls still running).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "backends/backend_factory.h"
#include "common/logging.h"
#include "config/server_flags.h"
#include "kv_cache/cpu_paged_attention.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "memory/host_pool.h"
#include "metrics/build_info.h"
#include "metrics/metrics.h"
#include "metrics/shadow_checker.h"
#include "service/attention_service.h"
#include "service/sequence_service.h"
#include "service/worker_pool.h"
#include "version.h"

namespace {

constexpr const char kServiceName[] = "attention.v1.AttentionService";

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
  auto built = attn::BuildBackends(config);
  if (!built.ok()) {
    spdlog::critical("{}", built.status().ToString());
    return 2;
  }
  const int threads = config.worker_threads > 0 ? config.worker_threads
                                                : std::max(1u, std::thread::hardware_concurrency());
  attn::WorkerPool workers(threads, static_cast<size_t>(config.max_queue_requests));
  // Paged KV cache (DESIGN.md §7): host pages and the CPU path in every build for now.
  auto kv_memory = attn::HostPool::Create(config.kv_cache_bytes);
  if (!kv_memory.ok()) {
    spdlog::critical("{}", kv_memory.status().ToString());
    return 2;
  }
  attn::PagePool kv_pages(kv_memory->get(),
                          {config.kv_page_tokens, config.kv_chunk_pages, config.kv_debug_poison});
  attn::SequenceStore sequences(&kv_pages, {config.kv_evict_idle, config.sequence_ttl_s});
  attn::CpuPagedAttention paged_compute(config.cpu_threads_per_call);
  attn::SequenceServiceImpl sequence_service(&sequences, &paged_compute, &workers);
  built->facts.extra_info = [&sequences](attention::v1::GetServerInfoResponse* r) {
    attn::FillKvCacheInfo(sequences, r->mutable_kv_cache());
  };
  if (!built->facts.pool_usage) {
    attn::HostPool* host = kv_memory->get();
    built->facts.pool_usage = [host] {
      return std::make_pair(static_cast<int64_t>(host->capacity()),
                            static_cast<int64_t>(host->used()));
    };
  }

  std::unique_ptr<grpc::Server> server;
  std::atomic<bool> faulted{false};
  auto on_fault = [&server, &faulted] {
    if (!faulted.exchange(true) && server) {
      spdlog::error("device fault: health is now NOT_SERVING");
      server->GetHealthCheckService()->SetServingStatus(false);
    }
  };
  // Metrics (DESIGN.md §9): always recorded; served on --metrics-address unless it is empty.
  std::vector<std::string> backend_names;
  for (attn::Backend* b : built->registry->All()) backend_names.push_back(b->name());
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
      metrics.RegisterRequestGauges([&service] { return service.in_flight(); },
                                    [&workers] { return static_cast<int64_t>(workers.queued()); });
  auto pool_usage = built->facts.pool_usage;
  const attn::metrics::Registration pool_gauges =
      metrics.RegisterDevicePool([pool_usage]() -> std::pair<int64_t, int64_t> {
        return pool_usage ? pool_usage() : std::pair<int64_t, int64_t>{0, 0};
      });

  const attn::metrics::Registration kv_gauges = metrics.RegisterKvCache([&sequences] {
    attn::metrics::KvCacheStats stats;
    for (const attn::KvClassStats& c : sequences.pool()->Stats()) {
      stats.classes.push_back({"k" + std::to_string(c.layout.num_kv_heads) + "_h" +
                                   std::to_string(c.layout.head_dim) + "_" +
                                   attn::kernels::DTypeName(c.layout.kv_dtype),
                               c.pages_total, c.pages_used});
    }
    stats.sequences = sequences.live_sequences();
    return stats;
  });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  const int requested_port = ListenPort(config.listen_address);
  if (requested_port < 0) {
    spdlog::critical("--listen: expected host:port with port in [0, 65535], got \"{}\"",
                     config.listen_address);
    return 2;
  }
  // One server per port: without this gRPC sets SO_REUSEPORT and a second server on a busy
  // port would silently share its traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(config.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  builder.RegisterService(&sequence_service);
  server = builder.BuildAndStart();
  if (!server || port == 0 || (requested_port != 0 && port != requested_port)) {
    spdlog::critical("could not listen on {} (address in use or not local?)",
                     config.listen_address);
    if (server) server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(kServiceName, true);
  health->SetServingStatus("attention.v1.SequenceService", true);
  health->SetServingStatus(true);
  if (!config.port_file.empty()) {
    std::ofstream out(config.port_file);
    out << port << "\n";
    out.close();
    if (!out) {
      spdlog::critical("--port-file: cannot write {}", config.port_file);
      server->Shutdown(std::chrono::system_clock::now());
      return 1;
    }
  }
  spdlog::info("attention-server {} serving on {} (port {}); default backend {}; {} workers",
               attn::kAttnVersion, config.listen_address, port, config.default_backend, threads);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: draining ({} in flight)", sig, service.in_flight());
  health->SetServingStatus(false);
  health->SetServingStatus(kServiceName, false);
  health->SetServingStatus("attention.v1.SequenceService", false);
  service.StartDraining();
  sequence_service.StartDraining();
  // One deadline for the whole drain (--drain-timeout-s), shared by both services.
  const auto drain_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(config.drain_timeout_s * 1e3));
  auto remaining = [&drain_deadline] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(drain_deadline - std::chrono::steady_clock::now(),
                 std::chrono::steady_clock::duration::zero()));
  };
  const bool drained = service.WaitIdle(remaining()) && sequence_service.WaitIdle(remaining());
  if (!drained) {
    // Computations that have started cannot be interrupted; exit now rather than outlive the
    // orchestrator's grace period. Exit code 3 says the drain timed out.
    spdlog::error(
        "drain timeout after {} s: {} calls and {} sequence calls still in flight; "
        "exiting with code 3",
        config.drain_timeout_s, service.in_flight(), sequence_service.in_flight());
    server->Shutdown(std::chrono::system_clock::now());
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
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return Run(config, signals);
}
