// Server configuration with defaults and units in names (DESIGN.md §13.5). Filled from flags
// by ParseServerFlags (server_flags.h).
#pragma once

#include <cstdint>
#include <string>

namespace attn {

struct ServerConfig {
  std::string listen_address = "127.0.0.1:50051";  ///< host:port; port 0 picks a free port
  std::string port_file;             ///< when set, the bound port is written here once serving
  std::string default_backend = "auto";
  int64_t max_message_bytes = 256ll << 20;  ///< larger requests: RESOURCE_EXHAUSTED
  int worker_threads = 0;            ///< 0 = hardware concurrency
  int cpu_threads_per_call = 0;      ///< threads one cpu-backend call may use; 0 = hardware
  int64_t max_queue_requests = 1024; ///< waiting requests beyond this: RESOURCE_EXHAUSTED
  std::string log_level = "info";    ///< trace, debug, info, warn, error, critical, off
  std::string log_format = "text";   ///< text or json
  int device = 0;                    ///< CUDA device index
  double gpu_memory_fraction = 0.5;  ///< of free device memory, taken once at start
  int64_t pinned_staging_bytes = 256ll << 20;
  int64_t naive_workspace_bytes = 4ll << 30;  ///< cap on one naive call's scores workspace
  double drain_timeout_s = 30.0;     ///< on SIGTERM: wait this long for in-flight calls
  std::string metrics_address = "127.0.0.1:9464";  ///< Prometheus /metrics; empty disables
  bool metrics_address_given = false;  ///< --metrics-address was given: failing to bind is fatal
  double shadow_check_fraction = 0.0;  ///< share of Attend calls re-checked on the cpu reference
  // Paged KV cache and SequenceService (sequence.proto, DESIGN.md §7).
  int64_t kv_cache_bytes = 1ll << 30;  ///< host memory pool for KV pages (CPU path), bytes
  int32_t kv_page_tokens = 16;         ///< tokens per KV page
  int32_t kv_chunk_pages = 64;         ///< pages carved from the KV pool at a time
  bool kv_evict_idle = false;          ///< evict LRU idle sequences when the cache is full
  double sequence_ttl_s = 0.0;         ///< drop sequences idle this long; 0 = never
  bool kv_debug_poison = false;        ///< debug: fill unused/freed KV pages with NaN
};

}  // namespace attn
