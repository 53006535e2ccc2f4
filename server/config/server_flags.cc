#include "config/server_flags.h"

#include <CLI/CLI.hpp>

#include "version.h"

namespace attn {

int ParseServerFlags(int argc, char** argv, ServerConfig* c) {
  CLI::App app{"attention-server: scaled-dot-product attention as a gRPC service "
               "(attention.v1). See README.md."};
  app.set_version_flag("--version", std::string(kAttnVersion));
  app.add_option("--listen", c->listen_address, "gRPC listen address host:port (port 0: any)")
      ->capture_default_str();
  app.add_option("--port-file", c->port_file, "write the bound port to this file once serving");
  app.add_option("--default-backend", c->default_backend,
                 "backend for requests that name none: auto, cpu, naive, fused")
      ->capture_default_str();
  app.add_option("--max-message-bytes", c->max_message_bytes,
                 "largest request accepted, bytes (larger: RESOURCE_EXHAUSTED)")
      ->check(CLI::Range(int64_t{1024}, int64_t{2147483647}))
      ->capture_default_str();
  app.add_option("--threads", c->worker_threads, "worker threads (0: hardware concurrency)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--cpu-threads", c->cpu_threads_per_call,
                 "threads one cpu-backend call may use (0: hardware concurrency)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--max-queue-requests", c->max_queue_requests,
                 "requests allowed to wait for a worker (more: RESOURCE_EXHAUSTED)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--log-level", c->log_level, "trace, debug, info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  app.add_option("--log-format", c->log_format, "text or json (one JSON object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--device", c->device, "CUDA device index")->capture_default_str();
  app.add_option("--gpu-memory-fraction", c->gpu_memory_fraction,
                 "fraction of free device memory taken as the pool at start")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  app.add_option("--pinned-staging-bytes", c->pinned_staging_bytes,
                 "pinned host buffer for host<->device copies, bytes")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--naive-workspace-bytes", c->naive_workspace_bytes,
                 "cap on one naive call's score workspace, bytes (bigger problems are chunked)")
      ->check(CLI::Range(int64_t{1} << 20, int64_t{1} << 42))
      ->capture_default_str();
  app.add_option("--drain-timeout-s", c->drain_timeout_s,
                 "on SIGTERM/SIGINT, seconds to wait for in-flight calls")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--metrics-address", c->metrics_address,
                 "Prometheus metrics endpoint host:port, path /metrics (empty: disabled)")
      ->capture_default_str();
  app.add_option("--shadow-check-fraction", c->shadow_check_fraction,
                 "share of Attend calls recomputed on the cpu reference off the hot path")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--kv-cache-bytes", c->kv_cache_bytes,
                 "host memory pool for paged KV cache pages (SequenceService), bytes")
      ->check(CLI::Range(int64_t{1} << 16, int64_t{1} << 44))
      ->capture_default_str();
  app.add_option("--kv-page-tokens", c->kv_page_tokens, "tokens per KV cache page")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--kv-chunk-pages", c->kv_chunk_pages,
                 "KV pages carved from the pool at a time per layout class")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--kv-evict-idle", c->kv_evict_idle,
               "when the KV cache is full, evict least recently used idle sequences");
  app.add_option("--sequence-ttl-s", c->sequence_ttl_s,
                 "drop sequences idle longer than this, seconds (0: never)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_flag("--kv-debug-poison", c->kv_debug_poison,
               "debug: fill unused and freed KV pages with NaN");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  c->metrics_address_given = app.count("--metrics-address") > 0;
  return -1;
}

}  // namespace attn
