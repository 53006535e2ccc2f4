// Starts the real attention-server binary on a free loopback port for integration tests, and
// stops it with a signal. The binary path comes from the ATTN_SERVER_BIN compile definition.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "attention/v1/attention.grpc.pb.h"

namespace attn::testing {

class ServerProcess {
 public:
  /// Starts the server with `extra_args` (plus --listen 127.0.0.1:0 --port-file ...). Waits up
  /// to 30 s for it to serve. started() tells whether it did.
  explicit ServerProcess(const std::vector<std::string>& extra_args = {});
  ~ServerProcess();

  bool started() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// A channel with large message limits.
  std::shared_ptr<grpc::Channel> Channel() const;
  std::unique_ptr<attention::v1::AttentionService::Stub> Stub() const;
  /// Sends `signal` (e.g. SIGTERM) without waiting.
  void Signal(int signal);
  /// Waits up to `timeout_s` for exit; returns the exit status (or -1 on timeout/signal).
  /// Returns the recorded status at once when the process already exited.
  int WaitExit(double timeout_s);
  /// Path of the server's stderr log.
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string dir_;
  std::string log_path_;
};

/// grpc.health.v1.Health/Check through a generic stub: "SERVING", "NOT_SERVING", "UNKNOWN",
/// "SERVICE_UNKNOWN", or "rpc error: <code>".
std::string HealthCheck(const std::shared_ptr<grpc::Channel>& channel, const std::string& service);

}  // namespace attn::testing
