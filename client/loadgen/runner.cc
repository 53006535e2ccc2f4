#include "loadgen/runner.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "attention/v1/attention.grpc.pb.h"
#include "loadgen/interrupt.h"
#include "loadgen/random_normal.h"
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
  // Attend is stateless: spread calls over every address the target resolves to (a headless
  // Service: one per ready pod); when the server's --max-connection-age-s closes a connection
  // the name is resolved again, so pods added since get calls.
  args.SetLoadBalancingPolicyName("round_robin");
  return MakeSecureChannel(options.target, options.security, args);
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
    while (!stop_.load() && !Interrupt::Requested()) {
      const int64_t index = next_.fetch_add(1);
      if (options_.max_requests >= 0 && index >= options_.max_requests) break;
      const PlannedRequest planned = plan_.At(index);
      const auto scheduled = start_ + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(planned.send_offset_s));
      if (options_.duration_s > 0 && (scheduled >= end || Clock::now() >= end)) break;
      BuildAttendRequest(options_.shape, planned.tokens, RequestSeed(options_.seed, index),
                         &request);
      if (planned.scheduled && !Interrupt::SleepUntil(scheduled)) break;
      if (stop_.load() || Interrupt::Requested()) break;

      grpc::ClientContext context;
      const Interrupt::ScopedCall cancellable(&context);
      int64_t call_deadline_ms = options_.deadline_ms;
      const bool connected =
          Connect(channel.get(), std::chrono::system_clock::now() +
                                     std::chrono::milliseconds(options_.connect_timeout_ms));
      if (!connected) call_deadline_ms = std::min(call_deadline_ms, options_.connect_timeout_ms);
      const auto sent = planned.scheduled ? scheduled : Clock::now();
      context.set_deadline(Interrupt::CapDeadline(std::chrono::system_clock::now() +
                                                  std::chrono::milliseconds(call_deadline_ms)));
      response.Clear();
      const grpc::Status status = stub->Attend(&context, request, &response);
      const auto done = Clock::now();

      Sample s;
      s.index = index;
      s.latency_ms = std::chrono::duration<double, std::milli>(done - sent).count();
      s.done_s = std::chrono::duration<double>(done - start_).count();
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
        s.flops = response.report().flops();
        s.backend = response.report().backend();
        s.device = response.report().device();
        s.batch_size = response.report().batch_size();
        if (ShouldVerify(options_.seed, index, options_.verify_fraction)) {
          const Comparison c = VerifyAttend(request, response, options_.tolerance);
          s.verified = true;
          s.mismatch = !c.pass;
          s.rel_error = c.rel_error;
          s.worst_row_rel_error = c.worst_row_rel_error;
          s.mismatch_detail = c.detail;
        }
      }
      if (options_.progress) options_.progress->Record(s.latency_ms, status.ok());
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

// Fills the OK part of a sample from a response (and verifies it when sampled).
void FillOk(const RunOptions& options, int64_t index, int64_t tokens,
            const attention::v1::AttendRequest& request,
            const attention::v1::AttendResponse& response, Sample* s) {
  s->query_tokens = options.shape.batch * tokens;
  const auto& t = response.report().times();
  s->phase_us = {t.decode_us(),         t.queue_us(),  t.host_to_device_us(), t.kernel_us(),
                 t.device_to_host_us(), t.encode_us(), t.total_us()};
  s->flops = response.report().flops();
  s->backend = response.report().backend();
  s->device = response.report().device();
  s->batch_size = response.report().batch_size();
  if (ShouldVerify(options.seed, index, options.verify_fraction)) {
    const Comparison c = VerifyAttend(request, response, options.tolerance);
    s->verified = true;
    s->mismatch = !c.pass;
    s->rel_error = c.rel_error;
    s->worst_row_rel_error = c.worst_row_rel_error;
    s->mismatch_detail = c.detail;
  }
}

class OpenRunner {
 public:
  OpenRunner(const RunOptions& options, const RequestPlan& plan) : options_(options), plan_(plan) {}

  RunResult Run() {
    const int channels = 4;  // a few connections so one HTTP/2 stream limit does not cap us
    const auto connect_deadline =
        std::chrono::system_clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
    bool connected = true;
    for (int i = 0; i < channels; ++i) {
      channels_.push_back(MakeChannel(options_));
      stubs_.push_back(attention::v1::AttentionService::NewStub(channels_.back()));
      if (connected && !Connect(channels_.back().get(), connect_deadline)) connected = false;
    }
    start_ = Clock::now();
    PoissonArrivals arrivals(options_.rate, SplitMix64(options_.seed ^ 0x0a11a1u));
    double t = 0;
    double schedule_s = 0;  // the last sent arrival's scheduled time
    const int max_in_flight = std::max(1, options_.max_in_flight);
    for (int64_t index = 0;; ++index) {
      if (options_.max_requests >= 0 && index >= options_.max_requests) break;
      if (index > 0) t += arrivals.Next();
      if (options_.duration_s > 0 && t >= options_.duration_s) break;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!stop_reason_.empty()) break;
      }
      if (Interrupt::Requested()) break;
      const PlannedRequest planned = plan_.At(index);
      auto call = std::make_unique<Call>();
      call->index = index;
      call->tokens = planned.tokens;
      call->scheduled =
          start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
      BuildAttendRequest(options_.shape, planned.tokens, RequestSeed(options_.seed, index),
                         &call->request);
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (in_flight_ >= max_in_flight) {
          ++overload_;
          if (options_.progress) options_.progress->RecordOverload();
          cv_.wait(lock, [&] { return in_flight_ < max_in_flight; });
        }
        ++in_flight_;
      }
      // An interrupt (while waiting for a slot or for the arrival time) sends nothing more.
      if (Interrupt::Requested() || !Interrupt::SleepUntil(call->scheduled)) {
        std::lock_guard<std::mutex> lock(mutex_);
        --in_flight_;
        break;
      }
      int64_t deadline_ms = options_.deadline_ms;
      if (!connected) deadline_ms = std::min(deadline_ms, options_.connect_timeout_ms);
      call->context.set_deadline(Interrupt::CapDeadline(std::chrono::system_clock::now() +
                                                        std::chrono::milliseconds(deadline_ms)));
      Interrupt::Register(&call->context);
      schedule_s = t;
      Call* raw = call.release();
      stubs_[static_cast<size_t>(index % channels)]->async()->Attend(
          &raw->context, &raw->request, &raw->response,
          [this, raw, connected](grpc::Status status) { Done(raw, status, connected); });
      if (!connected) break;  // one call reports gRPC's own failure; then stop
    }
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
    RunResult result;
    result.wall_s =
        last_done_ > start_ ? std::chrono::duration<double>(last_done_ - start_).count() : 0;
    result.samples = std::move(samples_);
    std::sort(result.samples.begin(), result.samples.end(),
              [](const Sample& a, const Sample& b) { return a.index < b.index; });
    result.stop_reason = stop_reason_;
    result.client_overload = overload_;
    result.schedule_s = schedule_s;
    return result;
  }

 private:
  struct Call {
    int64_t index = 0;
    int64_t tokens = 0;
    Clock::time_point scheduled;
    grpc::ClientContext context;
    attention::v1::AttendRequest request;
    attention::v1::AttendResponse response;
  };

  void Done(Call* raw, const grpc::Status& status, bool connected) {
    std::unique_ptr<Call> call(raw);
    Interrupt::Unregister(&call->context);
    const auto done = Clock::now();
    Sample s;
    s.index = call->index;
    s.latency_ms = std::chrono::duration<double, std::milli>(done - call->scheduled).count();
    s.done_s = std::chrono::duration<double>(done - start_).count();
    s.status = StatusCodeName(status.error_code());
    if (!status.ok()) {
      s.error_message = status.error_message();
    } else {
      FillOk(options_, call->index, call->tokens, call->request, call->response, &s);
    }
    if (options_.progress) options_.progress->Record(s.latency_ms, status.ok());
    call.reset();  // before the runner may return and drop the channels
    std::lock_guard<std::mutex> lock(mutex_);
    if (!status.ok() && !connected && stop_reason_.empty()) {
      stop_reason_ = "target unreachable: no connection to " + options_.target +
                     " (connect timeout " + std::to_string(options_.connect_timeout_ms) + " ms); " +
                     s.status + ": " + s.error_message;
    }
    samples_.push_back(std::move(s));
    last_done_ = std::max(last_done_, done);
    --in_flight_;
    cv_.notify_all();
  }

  const RunOptions& options_;
  const RequestPlan& plan_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<attention::v1::AttentionService::Stub>> stubs_;
  Clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int in_flight_ = 0;
  int64_t overload_ = 0;
  std::vector<Sample> samples_;
  std::string stop_reason_;
  Clock::time_point last_done_{};
};

}  // namespace

PoissonArrivals::PoissonArrivals(double rate, uint64_t seed) : rate_(rate), state_(seed) {}

double PoissonArrivals::Next() {
  const uint64_t h = SplitMix64(state_++);
  // Uniform in (0, 1]: never log(0).
  const double u = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53;
  return -std::log(u) / rate_;
}

RunResult RunOpenLoop(const RunOptions& options, const RequestPlan& plan) {
  OpenRunner runner(options, plan);
  return runner.Run();
}

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
