// attention-server: scaled-dot-product attention as a gRPC service (attention.v1).
//
// Start-up: flags → logging → backends (device pool, cuBLAS) → gRPC server with health and
// reflection → SERVING. SIGTERM/SIGINT: health NOT_SERVING, new calls UNAVAILABLE, in-flight
// calls finish (up to --drain-timeout-s), then the server stops and the process exits 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "backends/backend_factory.h"
#include "common/logging.h"
#include "config/server_flags.h"
#include "service/attention_service.h"
#include "service/worker_pool.h"
#include "version.h"

namespace {

constexpr const char kServiceName[] = "attention.v1.AttentionService";

int Run(const attn::ServerConfig& config, const sigset_t& signals) {
  auto built = attn::BuildBackends(config);
  if (!built.ok()) {
    spdlog::critical("{}", built.status().ToString());
    return 2;
  }
  const int threads = config.worker_threads > 0
                          ? config.worker_threads
                          : std::max(1u, std::thread::hardware_concurrency());
  attn::WorkerPool workers(threads, static_cast<size_t>(config.max_queue_requests));

  std::unique_ptr<grpc::Server> server;
  std::atomic<bool> faulted{false};
  auto on_fault = [&server, &faulted] {
    if (!faulted.exchange(true) && server) {
      spdlog::error("device fault: health is now NOT_SERVING");
      server->GetHealthCheckService()->SetServingStatus(false);
    }
  };
  attn::AttentionServiceImpl service(config, built->registry.get(), &workers, built->facts,
                                     on_fault);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("could not listen on {}", config.listen_address);
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(kServiceName, true);
  health->SetServingStatus(true);
  if (!config.port_file.empty()) {
    std::ofstream(config.port_file) << port << "\n";
  }
  spdlog::info("attention-server {} serving on {} (port {}); default backend {}; {} workers",
               attn::kAttnVersion, config.listen_address, port, config.default_backend,
               threads);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: draining ({} in flight)", sig, service.in_flight());
  health->SetServingStatus(false);
  health->SetServingStatus(kServiceName, false);
  service.StartDraining();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.drain_timeout_s * 1e3));
  if (!service.WaitIdle(timeout)) {
    spdlog::warn("drain timeout: {} calls still in flight", service.in_flight());
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  workers.Stop();
  server->Wait();
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
