#include "server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/generic/generic_stub.h>

namespace attn::testing {

ServerProcess::ServerProcess(const std::vector<std::string>& extra_args) {
  char tmpl[] = "/tmp/attn-it-XXXXXX";
  dir_ = mkdtemp(tmpl);
  const std::string port_file = dir_ + "/port";
  log_path_ = dir_ + "/server.log";
  auto given = [&extra_args](const char* flag) {
    return std::find(extra_args.begin(), extra_args.end(), flag) != extra_args.end();
  };
  std::vector<std::string> args = {ATTN_SERVER_BIN, "--log-level", "debug"};
  if (!given("--listen")) args.insert(args.end(), {"--listen", "127.0.0.1:0"});
  if (!given("--port-file")) args.insert(args.end(), {"--port-file", port_file});
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    dup2(fd, 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    int p = 0;
    if (in >> p && p > 0) {
      port_ = p;
      break;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ServerProcess::~ServerProcess() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGTERM);
    if (WaitExit(20) == -1 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
}

std::shared_ptr<grpc::Channel> ServerProcess::Channel() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args);
}

std::unique_ptr<attention::v1::AttentionService::Stub> ServerProcess::Stub() const {
  return attention::v1::AttentionService::NewStub(Channel());
}

void ServerProcess::Signal(int signal) {
  if (pid_ > 0 && !exited_) kill(pid_, signal);
}

int ServerProcess::WaitExit(double timeout_s) {
  if (exited_) return exit_code_;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1e3));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return exit_code_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string ServerProcess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                        const std::string& service) {
  // HealthCheckRequest{ string service = 1; } encoded by hand (wire format: tag 0x0a, length).
  std::string req;
  if (!service.empty()) {
    req.push_back(0x0a);
    req.push_back(static_cast<char>(service.size()));
    req += service;
  }
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return "rpc error: " + std::to_string(status.error_code());
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{ ServingStatus status = 1; }: 0x08 <varint>; absent means UNKNOWN.
  int value = 0;
  if (bytes.size() >= 2 && bytes[0] == 0x08) value = bytes[1];
  switch (value) {
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "UNKNOWN";
  }
}

}  // namespace attn::testing
