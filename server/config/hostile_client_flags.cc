#include "config/hostile_client_flags.h"

#include <cstdint>

#include "attn/common/cli_range.h"
#include "config/memory_limit.h"

namespace attn {

void AddHostileClientFlags(CLI::App& app, ServerConfig* c) {
  app.add_option("--max-cpu-score-pairs", c->max_cpu_score_pairs,
                 "cpu backend and paged-cpu KV cache: query-key pairs one Attend call (Σ T·S·N, "
                 "halved when causal) or one sequence call (all its steps) may score; more: "
                 "RESOURCE_EXHAUSTED (0: unlimited)")
      ->check(InRange(0.0, 1e18))
      // The default in full (1073741824), not capture_default_str's 1.07374e+09.
      ->default_str(cli_range_internal::Show(c->max_cpu_score_pairs));
  app.add_option("--max-gpu-flops", c->max_gpu_flops,
                 "GPU backends and paged-gpu KV cache: FLOPs one Attend call (4·Σ T·S·N·H, "
                 "halved when causal) or one sequence call may cost; more: RESOURCE_EXHAUSTED "
                 "(0: unlimited)")
      ->check(InRange(0.0, 1e21))
      ->default_str(cli_range_internal::Show(c->max_gpu_flops));
  // The default scales with the process's memory (config/memory_limit.h says why).
  c->grpc_memory_bytes = DefaultGrpcMemoryBytes(ProcessMemoryLimit(), c->max_message_bytes);
  app.add_option("--grpc-memory-bytes", c->grpc_memory_bytes,
                 "gRPC resource quota: memory the transport may use for buffers (default: a "
                 "quarter of the memory of this host or container, at least 1 GiB); when "
                 "exceeded gRPC cancels open calls; 0 (unbounded) or at least twice "
                 "--max-message-bytes")
      ->check(InRange(int64_t{0}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--max-unsent-response-bytes", c->max_unsent_response_bytes,
                 "memory (request + response) answered Attend calls may hold while their "
                 "clients do not take the response; above it the oldest are cancelled "
                 "(0: unlimited)")
      ->check(InRange(int64_t{0}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--max-inflight-bytes", c->max_inflight_bytes,
                 "bytes of Attend requests and responses held by calls in flight (queued, "
                 "computing, or answered but not taken by their client); a call arriving while "
                 "more are held gets RESOURCE_EXHAUSTED (0: unlimited)")
      ->check(InRange(int64_t{0}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--response-write-timeout-s", c->response_write_timeout_s,
                 "an answered Attend call whose response its client has not taken after this "
                 "long is cancelled, freeing its memory (0: never)")
      ->check(InRange(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--max-streams-per-connection", c->max_streams_per_connection,
                 "HTTP/2 streams (calls) one connection may have open at once")
      ->check(InRange(1, 1 << 30))
      ->capture_default_str();
  app.add_option("--max-shared-memory-regions", c->max_shared_memory_regions,
                 "host shared-memory regions (SharedMemoryLease) mapped at once, all identities "
                 "together; more: RESOURCE_EXHAUSTED (0: leases refused)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}))
      ->capture_default_str();
  app.add_option("--max-shared-memory-bytes", c->max_shared_memory_bytes,
                 "bytes of host shared-memory regions mapped at once (the server's address "
                 "space and page tables; the pages are the clients'); more: RESOURCE_EXHAUSTED "
                 "(0: leases refused)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--keepalive-time-s", c->keepalive_time_s,
                 "ping a connection idle this long; 0: no pings")
      ->check(InRange(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--keepalive-timeout-s", c->keepalive_timeout_s,
                 "close a connection whose ping is not answered within this")
      ->check(InRange(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--max-connection-idle-s", c->max_connection_idle_s,
                 "close (GOAWAY) a connection with no call for this long; 0: never")
      ->check(InRange(0.0, 86400.0 * 30))
      ->capture_default_str();
  app.add_option("--max-connection-age-s", c->max_connection_age_s,
                 "GOAWAY a connection this long after it opened (±10 % jitter) so clients "
                 "reconnect and re-resolve; 0: never")
      ->check(InRange(0.0, 86400.0 * 30))
      ->capture_default_str();
  app.add_option("--max-connection-age-grace-s", c->max_connection_age_grace_s,
                 "after that GOAWAY, calls still open (ExtendStream) may run this long, then "
                 "the connection is closed and they get UNAVAILABLE; 0: unlimited")
      ->check(InRange(0.0, 86400.0 * 30))
      ->capture_default_str();
}

}  // namespace attn
