// Closed-loop load runner: N workers, each with its own channel and stub, one outstanding
// Attend call each.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

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
  uint64_t seed = 1;
  int64_t deadline_ms = 60000;        // per-call deadline
  int64_t connect_timeout_ms = 5000;  // how long a worker waits for its channel to connect
  int max_message_mb = 1024;          // client max send/receive message size
};

/// What happened.
struct RunResult {
  std::vector<Sample> samples;  // in completion order per worker, merged
  double wall_s = 0;            // from start to the last completion
  std::string stop_reason;      // non-empty when the run was cut short (e.g. target unreachable)
};

/// Runs `plan` against `options.target` and returns every request's sample. Request i uses the
/// planned tokens and inputs seeded by RequestSeed(seed, i); when the plan is scheduled it is
/// not sent before its time and its latency counts from that time, else from the actual send. When
/// a worker cannot connect within connect_timeout_ms, its call is still made (failing with gRPC's
/// own status, normally UNAVAILABLE) and the run stops issuing new requests. Blocks until done.
RunResult RunClosedLoop(const RunOptions& options, const RequestPlan& plan);

/// The canonical name of a gRPC status code ("OK", "UNAVAILABLE", ...).
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace attn::loadgen
