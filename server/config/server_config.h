// Server configuration with defaults and units in names (DESIGN.md §13.5). Filled from flags
// by ParseServerFlags (server_flags.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attn {

struct ServerConfig {
  std::string listen_address = "127.0.0.1:50051";  ///< host:port (port 0: free) or unix:PATH
  /// --listen unix:PATH only (common/unix_socket.h): socket file mode (octal text), owner and
  /// group (name or id; empty: the server's own).
  std::string unix_socket_mode = "0660";
  std::string unix_socket_owner;
  std::string unix_socket_group;
  bool unix_socket_flags_given = false;  ///< any --unix-socket-* flag given (TCP: refused)
  std::string port_file;             ///< when set, the bound port is written here once serving
  std::string default_backend = "auto";
  int64_t max_message_bytes = 256ll << 20;  ///< larger requests: RESOURCE_EXHAUSTED
  int worker_threads = 0;            ///< 0 = hardware concurrency
  int cpu_threads_per_call = 0;      ///< threads one cpu-backend call may use; 0 = hardware
  int64_t max_queue_requests = 1024; ///< waiting requests beyond this: RESOURCE_EXHAUSTED
  // Dynamic batching (DESIGN.md §8, server/batching/).
  int64_t max_batch_tokens = 16384;  ///< query tokens per launch; a bigger request runs alone
  int64_t max_batch_requests = 64;   ///< calls/steps per launch; 1 disables batching
  int64_t max_queue_delay_us = 0;    ///< wait this long for a batch to fill; 0: take what waits
  int batch_threads = 0;             ///< executor threads per batching stage; 0 = --threads
  /// ExtendBatchStream: requests of one stream worked on at a time (read, not yet answered).
  int max_batches_in_flight = 4;
  /// Sequence steps of at most this many query tokens in all that find the step batcher idle run
  /// on the gRPC thread that read them (batch_scheduler.h's inline runs); 0: always queued.
  int64_t inline_step_tokens = 16;
  std::string log_level = "info";    ///< trace, debug, info, warn, error, critical, off
  std::string log_format = "text";   ///< text or json
  int device = 0;                    ///< CUDA device index
  double gpu_memory_fraction = 0.5;  ///< of free device memory, taken once at start
  int64_t pinned_staging_bytes = 256ll << 20;
  int64_t naive_workspace_bytes = 4ll << 30;  ///< cap on one naive call's scores workspace
  double drain_timeout_s = 30.0;     ///< on SIGTERM: wait this long for in-flight calls
  /// On SIGTERM also wait (within drain_timeout_s) until every sequence is released or expired.
  bool drain_wait_sequences = false;
  /// host:port clients can reach this replica at (sequence routing, DESIGN.md §12); may be empty.
  std::string advertise_address;
  /// This replica's tag, 8 lowercase hex digits: the prefix of every sequence id it mints, the
  /// x-attn-replica-tag response header of every call and GetServerInfo.replica.replica_tag.
  /// Empty (default): a random tag drawn at start (a restart never accepts older ids).
  std::string replica_tag;
  std::string metrics_address = "127.0.0.1:9464";  ///< Prometheus /metrics; empty disables
  bool metrics_address_given = false;  ///< --metrics-address was given: failing to bind is fatal
  /// Flags whose value came from their ATTN_* variable, not the command line: long name
  /// ("metrics-address") → "environment variable ATTN_METRICS_ADDRESS=v (for
  /// --metrics-address)". Checks made after parsing (the listen and metrics addresses) prefix
  /// their errors with it, as parse errors are.
  std::map<std::string, std::string> env_sources;
  /// ATTN_* variables in the environment that are no flag's variable (a typo such as
  /// ATTN_KV_CACHE_BYTE, or another tool's variable): one warning each, logged once logging is
  /// configured, with the nearest flag variable when one is within 2 edits. Not an error: the
  /// prefix is shared with the project's scripts (ATTN_SERVER_BIN, ATTN_BUILD_JOBS, ...).
  std::vector<std::string> env_warnings;
  double shadow_check_fraction = 0.0;  ///< share of Attend calls re-checked on the cpu reference
  // Paged KV cache and SequenceService (sequence.proto, DESIGN.md §7).
  int64_t kv_cache_bytes = 1ll << 30;  ///< KV page memory (host, or carved from the GPU pool)
  std::string kv_device = "auto";      ///< where pages live: auto (gpu when opened), cpu, gpu
  int32_t kv_page_tokens = 16;         ///< tokens per KV page
  int32_t kv_chunk_pages = 64;         ///< pages carved from the KV pool at a time
  bool kv_evict_idle = false;          ///< evict LRU idle sequences when the cache is full
  double sequence_ttl_s = 0.0;         ///< drop sequences idle this long; 0 = never
  int64_t replay_cache_bytes = int64_t{512} << 20;  ///< host bytes for stored replay outputs
  int64_t sequence_metadata_bytes = int64_t{1} << 30;  ///< host bytes for live sequences' metadata
  bool kv_debug_poison = false;        ///< debug: fill unused/freed KV pages with NaN
  bool kv_cuda_graphs = true;          ///< GPU KV cache: replay small steps from CUDA graphs
  /// GPU KV cache: a replayed graph measures its device times (CUDA event nodes) on one trip
  /// in this many per lane; 1 = every trip (device/lane.h). 16: device call H1 measured the
  /// single decode step's server time p50 at 81 us against 89 us with 1.
  int kv_timing_every = 16;
  /// Tests only (hidden flag): from the Nth backend Execute on, return INTERNAL as after a
  /// device fault (backends/fault_injecting_backend.h); 0 = off.
  int64_t inject_backend_fault_after = 0;
  // Security (server/security/, README "Security"). Empty strings / 0 = off / unlimited.
  std::string tls_cert_file;           ///< PEM server certificate chain; set: TLS on --listen
  std::string tls_key_file;            ///< PEM private key of tls_cert_file
  std::string tls_client_ca_file;      ///< PEM CA bundle; set: client certificates required
  std::string health_address;          ///< plaintext grpc.health.v1-only listener host:port
  std::string auth_token_file;         ///< "identity token" lines; set: bearer tokens required
  int64_t max_sequences_per_identity = 0;  ///< live sequences one identity may hold
  int64_t max_pages_per_identity = 0;      ///< KV pages one identity may hold (forks: once)
  int64_t max_tensor_elements = 0;         ///< elements over all tensors of one request
  // Hostile and careless clients (issue 16; README "attention-server flags"). 0 = unlimited.
  double max_cpu_score_pairs = 1073741824.0;  ///< cpu backend: query-key pairs per Attend call
  double max_gpu_flops = 2.5e14;              ///< GPU backends: FLOPs per Attend call
  /// gRPC ResourceQuota (transport buffers); 0 or >= 2 × max_message_bytes (a request larger
  /// than the quota is reset by gRPC with RESOURCE_EXHAUSTED). The flag's default is computed
  /// (DefaultGrpcMemoryBytes, config/memory_limit.h: a quarter of the process's memory).
  int64_t grpc_memory_bytes = int64_t{1} << 30;
  /// Memory answered Attend calls may hold while their clients do not take the response;
  /// above it the oldest such calls are cancelled.
  int64_t max_unsent_response_bytes = int64_t{64} << 20;
  /// Bytes of Attend requests and responses held by calls in flight (queued, computing or
  /// answered but not taken); a call arriving while more are held gets RESOURCE_EXHAUSTED.
  int64_t max_inflight_bytes = int64_t{128} << 20;
  double response_write_timeout_s = 30.0;     ///< a finished call whose response is not taken
                                              ///< by then is cancelled (frees its memory)
  int32_t max_streams_per_connection = 1024;  ///< HTTP/2 concurrent streams per connection
  /// Host shared-memory regions (SharedMemoryLease, server/shm/) mapped at once, every identity
  /// together; at most 4096 (the SIGBUS guard's table); 0: leases refused.
  int64_t max_shared_memory_regions = 256;
  /// Bytes of those regions mapped at once (address space and page tables of the server, not
  /// memory: region_registry.h says why 64 GiB); 0: leases refused.
  int64_t max_shared_memory_bytes = int64_t{64} << 30;
  double keepalive_time_s = 60.0;             ///< server pings an idle connection this often
  double keepalive_timeout_s = 20.0;          ///< and closes it when no ack comes in time
  double max_connection_idle_s = 600.0;       ///< closes connections without calls this long
  /// GOAWAY a connection this long after it opened (gRPC adds ±10 % jitter), so long-lived
  /// clients reconnect and re-resolve (new pods of a headless Service get traffic); 0: never.
  double max_connection_age_s = 0.0;
  /// After that GOAWAY, calls still open on the connection may run this long before it is
  /// closed (they then fail with UNAVAILABLE); 0: unlimited (gRPC's default).
  double max_connection_age_grace_s = 0.0;
  // cuDNN and auto calibration (backends/cudnn_backend.h, backends/calibration.h).
  std::string cudnn_library;           ///< --cudnn-library (empty: cudnn_library.h's search)
  bool cudnn_autotune = false;         ///< --cudnn-autotune (CudnnOptions::autotune)
  /// Graph buckets built at start (backends/cudnn_warmup.h format); empty: none.
  std::string cudnn_warmup = "bf16:8:8:64:bottom_right:64-4096";
  bool calibrate = false;              ///< time the backends at start; auto picks per bucket
  std::string calibration_file;        ///< cached table per device (read; written by --calibrate)
  int calibration_reps = 5;            ///< timed runs per (bucket, backend)
};

}  // namespace attn
