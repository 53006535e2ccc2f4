#include "config/server_flags.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "attn/common/cli_finite.h"
#include "attn/common/cli_range.h"
#include "config/byte_size.h"
#include "config/memory_limit.h"
#include "config/flag_groups.h"
#include "config/hostile_client_flags.h"
#include "version.h"

namespace attn {
namespace {

// ATTN_ and the flag's long name upper-cased, '-' as '_': kv-cache-bytes -> ATTN_KV_CACHE_BYTES.
std::string EnvName(const std::string& flag) {
  std::string env = "ATTN_";
  for (char ch : flag) env.push_back(ch == '-' ? '_' : static_cast<char>(std::toupper(ch)));
  return env;
}

// Whether the flag's ATTN_ variable is set to the empty string.
bool EnvSetEmpty(const std::string& flag) {
  const char* v = std::getenv(EnvName(flag).c_str());
  return v != nullptr && *v == '\0';
}

// Whether argv names --flag (as "--flag" or "--flag=value").
bool OnCommandLine(const std::string& flag, int argc, char** argv) {
  const std::string dashed = "--" + flag;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == dashed || a.rfind(dashed + "=", 0) == 0) return true;
  }
  return false;
}

// When `error` is about a flag whose value came from its ATTN_ variable (set, non-empty, flag
// not on the command line), "environment variable ATTN_X=value (for --x)"; else "". The flag
// is the longest whose "--name" occurs in `error` as a whole word.
std::string EnvSourceOf(CLI::App& app, int argc, char** argv, const std::string& error) {
  std::string best;
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty() || opt->get_envname().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    const std::string dashed = "--" + name;
    bool found = false;
    for (size_t at = error.find(dashed); at != std::string::npos; at = error.find(dashed, at + 1)) {
      const size_t end = at + dashed.size();
      if (end == error.size() ||
          !(std::isalnum(static_cast<unsigned char>(error[end])) || error[end] == '-')) {
        found = true;
        break;
      }
    }
    if (!found || name.size() <= best.size()) continue;
    const char* v = std::getenv(opt->get_envname().c_str());
    if (v == nullptr || *v == '\0' || OnCommandLine(name, argc, argv)) continue;
    best = name;
  }
  if (best.empty()) return "";
  const std::string env = EnvName(best);
  return "environment variable " + env + "=" + std::getenv(env.c_str()) + " (for --" + best + ")";
}

// --version, the listen address (TCP or Unix socket), the port file, the default backend and
// the largest message.
void AddListenFlags(CLI::App& app, ServerConfig* c) {
  // Second line: the build (compiled backends, CUDA archs, cuDNN headers), readable without a
  // GPU; tests/deploy/image_build_test.sh checks it.
  app.set_version_flag("--version", std::string(kAttnVersion) + "\nbuild: " + kAttnBuild);
  app.add_option("--listen", c->listen_address,
                 "gRPC listen address host:port (port 0: any) or unix:PATH (Unix-domain socket; "
                 "a stale socket file is replaced, a live one or a non-socket file refused; "
                 "removed at a clean stop)")
      ->capture_default_str();
  app.add_option("--unix-socket-mode", c->unix_socket_mode,
                 "with --listen unix:PATH: octal mode of the socket file")
      ->capture_default_str();
  app.add_option("--unix-socket-owner", c->unix_socket_owner,
                 "with --listen unix:PATH: owner of the socket file, user name or uid (default: "
                 "the server's user; needs the privilege to chown)");
  app.add_option("--unix-socket-group", c->unix_socket_group,
                 "with --listen unix:PATH: group of the socket file, name or gid (default: the "
                 "server's group)");
  app.add_option("--port-file", c->port_file,
                 "write the bound port (unix:PATH: the address) to this file once serving");
  app.add_option("--default-backend", c->default_backend,
                 "backend for requests that name none: auto, cpu, naive, fused, cudnn, fp8")
      ->capture_default_str();
  app.add_option("--max-message-bytes", c->max_message_bytes,
                 "largest request accepted, bytes (larger: RESOURCE_EXHAUSTED from gRPC, "
                 "\"Received message larger than max\")")
      ->check(InRange(int64_t{1024}, int64_t{2147483647}))
      ->capture_default_str();
}

// Worker threads, the cpu backend's threads, the queue and the batching knobs (DESIGN.md §8).
void AddWorkerAndBatchingFlags(CLI::App& app, ServerConfig* c) {
  app.add_option("--threads", c->worker_threads, "worker threads (0: hardware concurrency)")
      ->check(InRange(0, 1024))
      ->capture_default_str();
  app.add_option("--cpu-threads", c->cpu_threads_per_call,
                 "threads one cpu-backend call may use (0: hardware concurrency)")
      ->check(InRange(0, 1024))
      ->capture_default_str();
  app.add_option("--max-queue-requests", c->max_queue_requests,
                 "calls or steps allowed to wait per queue (workers, Attend batching, sequence "
                 "steps); more: RESOURCE_EXHAUSTED")
      ->check(InRange(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--max-batch-tokens", c->max_batch_tokens,
                 "query tokens one batched launch may hold (a bigger request runs alone)")
      ->check(InRange(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-batch-requests", c->max_batch_requests,
                 "calls (Attend) or steps (Extend*) one launch may hold; 1 disables batching")
      ->check(InRange(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--max-queue-delay-us", c->max_queue_delay_us,
                 "how long queued work may wait for a batch to fill, microseconds (0: launch "
                 "at once with whatever compatible work is already waiting)")
      ->check(InRange(int64_t{0}, int64_t{60000000}))
      ->capture_default_str();
  app.add_option("--batch-threads", c->batch_threads,
                 "threads that form and run batches, per stage (Attend, sequence steps); "
                 "0: --threads")
      ->check(InRange(0, 1024))
      ->capture_default_str();
  app.add_option("--max-batches-in-flight", c->max_batches_in_flight,
                 "ExtendBatchStream: requests of one stream worked on at a time (a request counts "
                 "from its read until its response is written; the next message is read when "
                 "one is answered)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--inline-step-tokens", c->inline_step_tokens,
                 "sequence steps of at most this many query tokens in all (a few decode steps) "
                 "that find the step batcher idle run on the gRPC thread that read them, "
                 "without the hand-off to a batch thread; 0: every step is queued")
      ->check(InRange(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
}

// Logging, the CUDA device, cuDNN, auto's calibration and the device memory.
void AddLoggingAndDeviceFlags(CLI::App& app, ServerConfig* c) {
  app.add_option("--log-level", c->log_level, "trace, debug, info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  app.add_option("--log-format", c->log_format, "text or json (one JSON object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--device", c->device, "CUDA device index")->capture_default_str();
  app.add_option("--cudnn-library", c->cudnn_library,
                 "libcudnn.so.9 to load, the only one tried (name or path; default: "
                 "$ATTN_CUDNN_LIBRARY, else the first compatible of: the loader path, the "
                 "library found at build time, every Python environment's nvidia-cudnn-cu13 "
                 "package, system directories)");
  app.add_option("--cudnn-warmup", c->cudnn_warmup,
                 "cuDNN graph buckets built at start: 'dtype:N:K:H:mask:Tmin-Tmax' entries "
                 "separated by ';' (empty: none)")
      ->capture_default_str();
  app.add_flag("--cudnn-autotune", c->cudnn_autotune,
               "cuDNN graphs: build every engine configuration the heuristics offer (modes A "
               "and FALLBACK) and time them at each graph's first run, keeping the fastest "
               "(cudnn-frontend autotune; slower first runs, GetServerInfo counts them)");
  app.add_flag("--calibrate", c->calibrate,
               "time every backend on a grid of shape buckets at start; auto then runs the "
               "fastest that passed parity per bucket (saved to --calibration-file if given)");
  app.add_option("--calibration-file", c->calibration_file,
                 "calibration table cached per device (device name + driver + build); loaded at "
                 "start when it matches, written after --calibrate");
  app.add_option("--calibration-reps", c->calibration_reps, "timed runs per bucket and backend")
      ->check(InRange(1, 100))
      ->capture_default_str();
  app.add_option("--gpu-memory-fraction", c->gpu_memory_fraction,
                 "fraction of free device memory taken as the pool at start")
      ->check(InRange(0.01, 1.0))
      ->capture_default_str();
  app.add_option("--pinned-staging-bytes", c->pinned_staging_bytes,
                 "pinned host buffer for host<->device copies, bytes")
      ->check(InRange(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--naive-workspace-bytes", c->naive_workspace_bytes,
                 "cap on one naive call's score workspace, bytes (bigger problems are chunked)")
      ->check(InRange(int64_t{1} << 20, int64_t{1} << 42))
      ->capture_default_str();
}

// Drain, the replica's address and tag, metrics and shadow checking.
void AddLifecycleAndMetricsFlags(CLI::App& app, ServerConfig* c) {
  app.add_option("--drain-timeout-s", c->drain_timeout_s,
                 "on SIGTERM/SIGINT, seconds to wait for in-flight calls")
      ->check(InRange(0.0, 3600.0))
      ->capture_default_str();
  app.add_flag("--drain-wait-sequences", c->drain_wait_sequences,
               "on SIGTERM/SIGINT, also wait (up to --drain-timeout-s) until every live sequence "
               "is released or expired; new sequences are refused meanwhile");
  app.add_option("--advertise-address", c->advertise_address,
                 "host:port clients reach this replica at, reported with every sequence "
                 "(SequenceInfo.replica_address) and by GetServerInfo/GetLoad (empty: unset)")
      ->check(CLI::Validator(
          [](std::string& a) -> std::string {
            const size_t colon = a.rfind(':');
            const std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
            if (a.empty()) return "";
            if (colon == 0 || port.empty() || port.size() > 5 ||
                port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
                std::stoi(port) > 65535) {
              return "expected host:port with port in [1, 65535], got \"" + a + "\"";
            }
            return "";
          },
          "HOST:PORT"));
  app.add_option("--replica-tag", c->replica_tag,
                 "this replica's tag, 8 lowercase hex digits: prefix of the sequence ids it "
                 "mints and the x-attn-replica-tag response header of every call, for routers "
                 "(empty: random at each start, so a restarted replica refuses older ids)")
      ->check(CLI::Validator(
          [](std::string& t) -> std::string {
            if (t.empty() ||
                (t.size() == 8 && t.find_first_not_of("0123456789abcdef") == std::string::npos)) {
              return "";
            }
            return "expected 8 lowercase hex digits (e.g. 0a1b2c3d), got \"" + t + "\"";
          },
          "HEX8"));
  app.add_option("--metrics-address", c->metrics_address,
                 "Prometheus metrics endpoint host:port (IPv4, [IPv6], a name that resolves; "
                 "empty host: every IPv4 interface), path /metrics (empty: disabled)")
      ->capture_default_str();
  app.add_option("--shadow-check-fraction", c->shadow_check_fraction,
                 "share of Attend calls recomputed on the cpu reference off the hot path")
      ->check(InRange(0.0, 1.0))
      ->capture_default_str();
}

// The paged KV cache (SequenceService) and the hidden test-only fault injection.
void AddKvCacheFlags(CLI::App& app, ServerConfig* c) {
  app.add_option("--kv-cache-bytes", c->kv_cache_bytes,
                 "memory for paged KV cache pages (SequenceService), bytes: host memory, or "
                 "carved from the GPU pool when --kv-device is gpu")
      ->check(InRange(int64_t{1} << 16, int64_t{1} << 44))
      ->capture_default_str();
  app.add_option("--kv-device", c->kv_device,
                 "where KV pages live and sequence steps run: auto (gpu when a GPU opened), "
                 "cpu, gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}))
      ->capture_default_str();
  app.add_option("--kv-page-tokens", c->kv_page_tokens, "tokens per KV cache page")
      ->check(InRange(1, 4096))
      ->capture_default_str();
  app.add_option("--kv-chunk-pages", c->kv_chunk_pages,
                 "KV pages carved from the pool at a time per layout class")
      ->check(InRange(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--kv-evict-idle", c->kv_evict_idle,
               "when the KV cache is full, evict least recently used idle sequences");
  app.add_option("--sequence-ttl-s", c->sequence_ttl_s,
                 "drop sequences idle longer than this, seconds (0: never)")
      ->check(InRange(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--replay-cache-bytes", c->replay_cache_bytes,
                 "host bytes for the stored outputs of each sequence layer's last step (exact "
                 "replays of a retried step); a step whose output does not fit is not "
                 "replayable: its retry gets FAILED_PRECONDITION with the actual length")
      ->check(InRange(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--sequence-metadata-bytes", c->sequence_metadata_bytes,
                 "host bytes the live sequences' own metadata may hold in all (~170 bytes per "
                 "layer and sequence, before any KV page); CreateSequence/ForkSequence past it "
                 "get RESOURCE_EXHAUSTED")
      ->check(InRange(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--kv-cuda-graphs", c->kv_cuda_graphs,
                 "GPU KV cache: run steps without prefill (decode, appends; device buffer up to "
                 "8 MiB) as CUDA graphs captured once per launch layout and replayed (on, off)")
      ->default_str("on");
  app.add_option("--kv-timing-every", c->kv_timing_every,
                 "GPU KV cache with CUDA graphs: time the copies and kernels of one replayed "
                 "graph in N per lane (CUDA event nodes cost ~4 us of launch and ~11 us of the "
                 "round trip on an H200); the other steps report no device times "
                 "(PhaseTimes.device_untimed); 1: every step")
      ->check(InRange(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--kv-debug-poison", c->kv_debug_poison,
               "debug: fill unused and freed KV pages with NaN");
  // Tests only, hidden from --help (empty group): the Nth backend Execute and every later one
  // fail with INTERNAL as after a device fault (backends/fault_injecting_backend.h).
  app.add_option("--inject-backend-fault-after", c->inject_backend_fault_after,
                 "tests: inject a device fault from the Nth backend Execute on (0: off)")
      ->check(InRange(int64_t{0}, int64_t{1} << 62))
      ->group("");
}

// Security (server/security/): TLS, the health-only listener, tokens, per-identity and
// per-request limits.
void AddSecurityFlags(CLI::App& app, ServerConfig* c) {
  app.add_option("--tls-cert", c->tls_cert_file,
                 "PEM certificate chain: serve --listen over TLS (with --tls-key)");
  app.add_option("--tls-key", c->tls_key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", c->tls_client_ca_file,
                 "PEM CA bundle: require and verify client certificates (mutual TLS)");
  app.add_option("--health-address", c->health_address,
                 "plaintext listener host:port serving only grpc.health.v1 (kubelet probes)");
  app.add_option("--auth-token-file", c->auth_token_file,
                 "file of \"identity token\" lines: every call needs authorization: Bearer "
                 "<token> (SIGHUP reloads it)");
  app.add_option("--max-sequences-per-identity", c->max_sequences_per_identity,
                 "live sequences one identity may hold (0: unlimited)")
      ->check(InRange(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-pages-per-identity", c->max_pages_per_identity,
                 "KV cache pages one identity may hold; pages shared by forks count once "
                 "(0: unlimited)")
      ->check(InRange(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-tensor-elements", c->max_tensor_elements,
                 "elements summed over every tensor of one request (0: unlimited)")
      ->check(InRange(int64_t{0}, int64_t{1} << 62))
      ->capture_default_str();
}

}  // namespace

void AddServerFlags(CLI::App& app, ServerConfig* c) {
  // In this order (the order of --help within each group).
  AddListenFlags(app, c);
  AddWorkerAndBatchingFlags(app, c);
  AddLoggingAndDeviceFlags(app, c);
  AddLifecycleAndMetricsFlags(app, c);
  AddKvCacheFlags(app, c);
  AddSecurityFlags(app, c);
  AddHostileClientFlags(app, c);
  AcceptByteSuffixes(app);
  // Every flag can also come from the environment: --kv-cache-bytes from ATTN_KV_CACHE_BYTES
  // (containers, Kubernetes ConfigMaps). A flag on the command line wins over its variable.
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    if (name == "help" || name == "version") continue;
    opt->envname(EnvName(name));
  }
  RejectNonFiniteNumbers(app);
  AssignServerFlagGroups(app);
}

namespace {

// Levenshtein distance of a and b, stopping early above `limit` (returns limit + 1 then).
size_t EditDistance(const std::string& a, const std::string& b, size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    size_t best = cur[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
      best = std::min(best, cur[j]);
    }
    if (best > limit) return limit + 1;
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The warnings for ATTN_* variables of `environ` that no option of `app` reads.
std::vector<std::string> UnknownEnvWarnings(CLI::App& app) {
  std::vector<std::string> known;
  for (CLI::Option* opt : app.get_options()) {
    if (!opt->get_envname().empty()) known.push_back(opt->get_envname());
  }
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("ATTN_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string nearest;
    size_t best = 3;
    for (const std::string& k : known) {
      const size_t d = EditDistance(name, k, 2);
      if (d < best) best = d, nearest = k;
    }
    out.push_back("environment variable " + name + " is not the variable of any flag: ignored" +
                  (nearest.empty() ? "" : " (did you mean " + nearest + "?)"));
  }
  return out;
}

}  // namespace

int ParseServerFlags(int argc, char** argv, ServerConfig* c) {
  CLI::App app{
      "attention-server: scaled-dot-product attention as a gRPC service "
      "(attention.v1). See README.md."};
  AddServerFlags(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints --help / --version on stdout (exit code 0) and an error with "Run with --help
    // for more information." on stderr; its own codes (105, 109, ...) become 2, as documented.
    const std::string env = e.get_exit_code() == 0 ? "" : EnvSourceOf(app, argc, argv, e.what());
    const int code = env.empty()
                         ? app.exit(e)
                         : app.exit(CLI::ParseError(env + ": " + e.what(), e.get_exit_code()));
    return code == 0 ? 0 : 2;
  }
  // CLI11 treats a variable set to "" as unset; for these flags "" is a meaningful value.
  const bool on_command_line = app.count("--metrics-address") > 0;
  if (!on_command_line && EnvSetEmpty("metrics-address")) c->metrics_address.clear();
  if (app.count("--cudnn-warmup") == 0 && EnvSetEmpty("cudnn-warmup")) c->cudnn_warmup.clear();
  c->metrics_address_given = on_command_line;
  c->env_warnings = UnknownEnvWarnings(app);
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty() || opt->get_envname().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    const char* v = std::getenv(opt->get_envname().c_str());
    if (v == nullptr || *v == '\0' || OnCommandLine(name, argc, argv)) continue;
    c->env_sources[name] =
        "environment variable " + opt->get_envname() + "=" + v + " (for --" + name + ")";
  }
  if (app.count("--grpc-memory-bytes") == 0) {  // its default follows --max-message-bytes too
    c->grpc_memory_bytes = DefaultGrpcMemoryBytes(ProcessMemoryLimit(), c->max_message_bytes);
  }
  c->unix_socket_flags_given = app.count("--unix-socket-mode") + app.count("--unix-socket-owner") +
                                   app.count("--unix-socket-group") >
                               0;
  return -1;
}

}  // namespace attn
