// The main gRPC listener of attention-server (--listen host:port or unix:PATH): credentials,
// message sizes, the bounds on careless and hostile clients (issue 16 item 4: transport
// memory, streams per connection, keepalive, idle and maximum connection age), the
// x-attn-replica-tag interceptor, the services, and for a Unix socket its access mode.
// Part of main.cc's start-up (the composition root); called once, from the main thread.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "config/server_config.h"
#include "security/server_security.h"

namespace attn::startup {

/// Port of a "host:port" or "[v6]:port" address; -1 when missing or outside [0, 65535].
int ListenPort(const std::string& address);

/// Where and how the main listener listens.
struct ListenerPlan {
  std::string socket_path;  ///< unix:PATH's path; empty for host:port
  mode_t socket_mode = 0660;
  int requested_port = 0;       ///< ListenPort(--listen); 0 for a Unix socket or port 0
  std::string replica_tag_hex;  ///< x-attn-replica-tag (service/replica_tag_header.h)
};

/// Builds and starts the listener with `services` (not owned; they must outlive the server).
/// Returns the server and sets *port to the bound port; on failure returns null, logs the
/// reason and sets *exit_code: 2 for a bad flag (--grpc-memory-bytes below twice
/// --max-message-bytes, a Unix socket's mode, owner or group that cannot be applied), 1 when
/// the address cannot be bound (in use, not local, or another port than requested).
std::unique_ptr<grpc::Server> StartMainListener(const ServerConfig& config,
                                                const security::ServerSecurity& security,
                                                const ListenerPlan& plan,
                                                const std::vector<grpc::Service*>& services,
                                                int* port, int* exit_code);

}  // namespace attn::startup
