// Load runners. Closed loop: N workers, each with its own channel and stub, one outstanding
// Attend call each. Open loop: Poisson arrivals at a fixed rate sent through the gRPC callback
// API, each latency measured from its scheduled send time (no coordinated omission).
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/channel_security.h"
#include "loadgen/progress.h"
#include "loadgen/report.h"
#include "loadgen/workload.h"

namespace attn::loadgen {

/// What to run.
struct RunOptions {
  std::string target = "127.0.0.1:50051";
  int concurrency = 1;
  int64_t max_requests = -1;  // < 0: no count limit (the duration or the plan's rows stop it)
  double duration_s = 0;      // > 0: issue no request after this many seconds
  ModelShape shape;
  double verify_fraction = 0;
  double tolerance = 0;  // relative L2 of a verified o; 0: by the dtype (ResolveTolerance)
  uint64_t seed = 1;
  int64_t deadline_ms = 60000;        // per-call deadline
  int64_t connect_timeout_ms = 5000;  // how long a worker waits for its channel to connect
  int max_message_mb = 1024;          // client max send/receive message size
  double rate = 0;                    // open loop: mean arrivals per second (Poisson)
  int max_in_flight = 1024;           // open loop: cap on outstanding calls
  Progress* progress = nullptr;       // when set, every completion is recorded there
  ChannelSecurity security;           // TLS / mTLS / bearer token (loaded by main)
};

/// What happened.
struct RunResult {
  std::vector<Sample> samples;  // in completion order per worker, merged
  double wall_s = 0;            // from start to the last completion
  std::string stop_reason;      // non-empty when the run was cut short (e.g. target unreachable)
  int64_t client_overload = 0;  // open loop: arrivals that found --max-in-flight calls outstanding
  double schedule_s = 0;        // open loop: scheduled time of the last arrival sent, s
};

/// Exponential inter-arrival times of a Poisson process of `rate` per second, a deterministic
/// function of `seed`.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate, uint64_t seed);
  /// The gap to the next arrival, seconds.
  double Next();

 private:
  double rate_;
  uint64_t state_;
};

/// Runs `plan` against `options.target` and returns every request's sample. Request i uses the
/// planned tokens and inputs seeded by RequestSeed(seed, i); when the plan is scheduled it is
/// not sent before its time and its latency counts from that time, else from the actual send. When
/// a worker cannot connect within connect_timeout_ms, its call is still made (failing with gRPC's
/// own status, normally UNAVAILABLE) and the run stops issuing new requests. Blocks until done.
RunResult RunClosedLoop(const RunOptions& options, const RequestPlan& plan);

/// Open loop: request i is scheduled at the i-th arrival of PoissonArrivals(options.rate, seed)
/// (the plan gives its tokens; its own timestamps are ignored) and sent asynchronously at that
/// time, whatever the server's progress. Its latency counts from the scheduled time. When
/// options.max_in_flight calls are outstanding, the arrival waits for a free slot on the client
/// (counted in client_overload) and its latency still counts from its scheduled time. Stops
/// scheduling at max_requests or duration_s, then waits for every outstanding call.
RunResult RunOpenLoop(const RunOptions& options, const RequestPlan& plan);

/// The canonical name of a gRPC status code ("OK", "UNAVAILABLE", ...).
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace attn::loadgen
