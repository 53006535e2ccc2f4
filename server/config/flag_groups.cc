#include "config/flag_groups.h"

#include <map>

namespace attn {
namespace {

// Long flag name -> group heading.
const std::map<std::string, std::string>& GroupOf() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, std::string>;
    const std::vector<std::pair<std::string, std::vector<std::string>>> groups = {
        {"General", {"help", "version"}},
        {"Network",
         {"listen", "unix-socket-mode", "unix-socket-owner", "unix-socket-group", "port-file",
          "advertise-address", "replica-tag", "health-address"}},
        {"Backends & GPU",
         {"default-backend", "threads", "cpu-threads", "device", "cudnn-library", "cudnn-warmup",
          "cudnn-autotune",
          "calibrate", "calibration-file", "calibration-reps", "gpu-memory-fraction",
          "pinned-staging-bytes", "naive-workspace-bytes"}},
        {"Batching",
         {"max-queue-requests", "max-batch-tokens", "max-batch-requests", "max-queue-delay-us",
          "batch-threads", "max-batches-in-flight", "inline-step-tokens"}},
        {"KV cache & sequences",
         {"kv-cache-bytes", "kv-device", "kv-page-tokens", "kv-chunk-pages", "kv-evict-idle",
          "sequence-ttl-s", "replay-cache-bytes", "sequence-metadata-bytes", "kv-cuda-graphs",
          "kv-timing-every", "kv-debug-poison"}},
        {"Limits & hostile clients",
         {"max-message-bytes", "max-tensor-elements", "max-sequences-per-identity",
          "max-pages-per-identity", "max-cpu-score-pairs", "max-gpu-flops", "grpc-memory-bytes",
          "max-unsent-response-bytes", "max-inflight-bytes", "response-write-timeout-s",
          "max-streams-per-connection", "max-shared-memory-regions", "max-shared-memory-bytes",
          "keepalive-time-s", "keepalive-timeout-s",
          "max-connection-idle-s", "max-connection-age-s", "max-connection-age-grace-s"}},
        {"Security", {"tls-cert", "tls-key", "tls-client-ca", "auth-token-file"}},
        {"Metrics & logging",
         {"metrics-address", "shadow-check-fraction", "log-level", "log-format"}},
        {"Drain & lifecycle", {"drain-timeout-s", "drain-wait-sequences"}},
    };
    for (const auto& [group, names] : groups) {
      for (const std::string& n : names) (*t)[n] = group;
    }
    return t;
  }();
  return *table;
}

}  // namespace

const std::vector<std::string>& ServerFlagGroups() {
  static const std::vector<std::string> kGroups = {"General",
                                                   "Network",
                                                   "Backends & GPU",
                                                   "Batching",
                                                   "KV cache & sequences",
                                                   "Limits & hostile clients",
                                                   "Security",
                                                   "Metrics & logging",
                                                   "Drain & lifecycle"};
  return kGroups;
}

void AssignServerFlagGroups(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_group().empty() || opt->get_lnames().empty()) continue;
    const auto it = GroupOf().find(opt->get_lnames().front());
    if (it != GroupOf().end()) opt->group(it->second);
  }
}

}  // namespace attn
