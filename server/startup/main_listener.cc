#include "startup/main_listener.h"

#include <grpcpp/resource_quota.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "common/unix_socket.h"
#include "common/without_reflection.h"
#include "service/replica_tag_header.h"

namespace attn::startup {
namespace {

// Credentials, message sizes and the transport bounds. Returns false (logged) for a
// --grpc-memory-bytes that would refuse the largest request allowed.
bool ConfigureTransport(const ServerConfig& config, const security::ServerSecurity& security,
                        grpc::ServerBuilder* builder, grpc::ResourceQuota* quota, int* port) {
  // One server per port: without this gRPC sets SO_REUSEPORT and a second server on a busy
  // port would silently share its traffic.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder->AddListeningPort(config.listen_address, security.credentials, port);
  if (security.authenticator->mode() == security::AuthMode::kToken) {
    builder->SetOption(std::make_unique<WithoutReflection>());  // not authenticated
  }
  builder->SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder->SetMaxSendMessageSize(-1);
  // Careless and hostile clients (issue 16 item 4): transport memory, streams per connection,
  // dead connections (keepalive) and idle ones. Responses a client never reads are bounded
  // by the Attend service (--max-unsent-response-bytes, --response-write-timeout-s).
  if (config.grpc_memory_bytes > 0 && config.grpc_memory_bytes < 2 * config.max_message_bytes) {
    // gRPC resets a stream whose message does not fit the quota: the largest request allowed
    // would be refused.
    spdlog::critical(
        "--grpc-memory-bytes ({}) must be 0 or at least twice --max-message-bytes "
        "({})",
        config.grpc_memory_bytes, config.max_message_bytes);
    return false;
  }
  if (config.grpc_memory_bytes > 0) {
    quota->Resize(static_cast<size_t>(config.grpc_memory_bytes));
    builder->SetResourceQuota(*quota);
  }
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.max_streams_per_connection);
  auto ms = [](double s) { return static_cast<int>(std::min(s * 1e3, 2147483647.0)); };
  if (config.keepalive_time_s > 0) {
    builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(config.keepalive_time_s));
    builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(config.keepalive_timeout_s));
  }
  if (config.max_connection_idle_s > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(config.max_connection_idle_s));
  }
  // Connection age (issue 19): long-lived clients reconnect, re-resolving the headless Service.
  if (config.max_connection_age_s > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(config.max_connection_age_s));
    if (config.max_connection_age_grace_s > 0) {
      builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                  ms(config.max_connection_age_grace_s));
    }
  }
  return true;
}

}  // namespace

int ListenPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return -1;
  const std::string digits = address.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int port = std::stoi(digits);
  return port <= 65535 ? port : -1;
}

std::unique_ptr<grpc::Server> StartMainListener(const ServerConfig& config,
                                                const security::ServerSecurity& security,
                                                const ListenerPlan& plan,
                                                const std::vector<grpc::Service*>& services,
                                                int* port, int* exit_code) {
  const bool unix_socket = !plan.socket_path.empty();
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("attention-server");
  if (!ConfigureTransport(config, security, &builder, &quota, port)) {
    *exit_code = 2;
    return nullptr;
  }
  {
    // x-attn-replica-tag on every response (service/replica_tag_header.h): the ids' tag.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> tag;
    tag.push_back(MakeReplicaTagInterceptor(plan.replica_tag_hex));
    builder.experimental().SetInterceptorCreators(std::move(tag));
  }
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server;
  {
    // The socket file is created owner-only, then opened up to --unix-socket-mode below.
    std::optional<ScopedUmask> owner_only;
    if (unix_socket) owner_only.emplace(0177);
    server = builder.BuildAndStart();
  }
  if (!server || *port == 0 || (plan.requested_port != 0 && *port != plan.requested_port)) {
    spdlog::critical("could not listen on {} (address in use or not local?)",
                     config.listen_address);
    if (server) server->Shutdown(std::chrono::system_clock::now());
    *exit_code = 1;
    return nullptr;
  }
  if (unix_socket) {
    if (auto s = ApplyUnixSocketAccess(plan.socket_path, plan.socket_mode, config.unix_socket_owner,
                                       config.unix_socket_group);
        !s.ok()) {
      spdlog::critical("{}", s.ToString());
      server->Shutdown(std::chrono::system_clock::now());
      *exit_code = 2;
      return nullptr;
    }
  }
  return server;
}

}  // namespace attn::startup
