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
};

}  // namespace attn
