#include "loadgen/runner.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include "attention/v1/attention.grpc.pb.h"
#include "loadgen/verify.h"

namespace attn::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// Waits until `channel` is READY. Returns false as soon as a connection attempt fails
// (TRANSIENT_FAILURE) or `deadline` passes. (gRPC takes system_clock deadlines only.)
bool Connect(grpc::Channel* channel, std::chrono::system_clock::time_point deadline) {
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel->WaitForStateChange(state, deadline)) return false;
    state = channel->GetState(/*try_to_connect=*/true);
  }
  return true;
}

std::shared_ptr<grpc::Channel> MakeChannel(const RunOptions& options) {
  grpc::ChannelArguments args;
  const int64_t bytes = std::min<int64_t>(options.max_message_mb, 2047) * 1024 * 1024;
  args.SetMaxSendMessageSize(static_cast<int>(bytes));
  args.SetMaxReceiveMessageSize(static_cast<int>(bytes));
  // A private subchannel pool gives each worker its own TCP connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args);
}

class Runner {
 public:
  Runner(const RunOptions& options, const RequestPlan& plan) : options_(options), plan_(plan) {}

  RunResult Run() {
    start_ = Clock::now();
    std::vector<std::thread> threads;
    std::vector<std::vector<Sample>> per_worker(static_cast<size_t>(options_.concurrency));
    for (int w = 0; w < options_.concurrency; ++w) {
      threads.emplace_back([this, &per_worker, w] { Work(&per_worker[static_cast<size_t>(w)]); });
    }
    for (auto& t : threads) t.join();
    RunResult result;
    result.wall_s = std::chrono::duration<double>(last_done_ - start_).count();
    if (last_done_ < start_) result.wall_s = 0;
    for (auto& samples : per_worker) {
      result.samples.insert(result.samples.end(), samples.begin(), samples.end());
    }
    std::sort(result.samples.begin(), result.samples.end(),
              [](const Sample& a, const Sample& b) { return a.index < b.index; });
    result.stop_reason = stop_reason_;
    return result;
  }

 private:
  void Stop(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_reason_.empty()) stop_reason_ = reason;
    stop_.store(true);
  }

  void Work(std::vector<Sample>* samples) {
    const auto channel = MakeChannel(options_);
    const auto stub = attention::v1::AttentionService::NewStub(channel);
    attention::v1::AttendRequest request;
    attention::v1::AttendResponse response;
    const auto end = start_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options_.duration_s));
    while (!stop_.load()) {
      const int64_t index = next_.fetch_add(1);
      if (options_.max_requests >= 0 && index >= options_.max_requests) break;
      const PlannedRequest planned = plan_.At(index);
      const auto scheduled = start_ + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(planned.send_offset_s));
      if (options_.duration_s > 0 && (scheduled >= end || Clock::now() >= end)) break;
      BuildAttendRequest(options_.shape, planned.tokens, RequestSeed(options_.seed, index),
                         &request);
      if (planned.scheduled) std::this_thread::sleep_until(scheduled);
      if (stop_.load()) break;

      grpc::ClientContext context;
      int64_t call_deadline_ms = options_.deadline_ms;
      const bool connected =
          Connect(channel.get(), std::chrono::system_clock::now() +
                                     std::chrono::milliseconds(options_.connect_timeout_ms));
      if (!connected) call_deadline_ms = std::min(call_deadline_ms, options_.connect_timeout_ms);
      const auto sent = planned.scheduled ? scheduled : Clock::now();
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(call_deadline_ms));
      response.Clear();
      const grpc::Status status = stub->Attend(&context, request, &response);
      const auto done = Clock::now();

      Sample s;
      s.index = index;
      s.latency_ms = std::chrono::duration<double, std::milli>(done - sent).count();
      s.status = StatusCodeName(status.error_code());
      if (!status.ok()) {
        s.error_message = status.error_message();
        if (!connected) {
          Stop("target unreachable: no connection to " + options_.target + " (connect timeout " +
               std::to_string(options_.connect_timeout_ms) + " ms); " + s.status + ": " +
               s.error_message);
        }
      } else {
        s.query_tokens = options_.shape.batch * planned.tokens;
        const auto& t = response.report().times();
        s.phase_us = {t.decode_us(),         t.queue_us(),  t.host_to_device_us(), t.kernel_us(),
                      t.device_to_host_us(), t.encode_us(), t.total_us()};
        s.backend = response.report().backend();
        s.device = response.report().device();
        if (ShouldVerify(options_.seed, index, options_.verify_fraction)) {
          const Comparison c = VerifyAttend(request, response);
          s.verified = true;
          s.mismatch = !c.pass;
          s.rel_error = c.rel_error;
          s.worst_row_rel_error = c.worst_row_rel_error;
          s.mismatch_detail = c.detail;
        }
      }
      samples->push_back(std::move(s));
      std::lock_guard<std::mutex> lock(mutex_);
      last_done_ = std::max(last_done_, done);
    }
  }

  const RunOptions& options_;
  const RequestPlan& plan_;
  Clock::time_point start_;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::string stop_reason_;
  Clock::time_point last_done_{};
};

}  // namespace

std::string StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "CODE_" + std::to_string(static_cast<int>(code));
  }
}

RunResult RunClosedLoop(const RunOptions& options, const RequestPlan& plan) {
  Runner runner(options, plan);
  return runner.Run();
}

}  // namespace attn::loadgen
