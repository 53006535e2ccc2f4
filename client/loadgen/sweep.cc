#include "loadgen/sweep.h"

#include <cstdio>
#include <set>
#include <sstream>

#include "loadgen/dtype_codec.h"

namespace attn::loadgen {

std::vector<SweepPoint> SweepPoints(const std::string& kind, const ModelShape& base, int64_t tokens,
                                    const std::vector<int64_t>& seqs,
                                    const std::vector<int64_t>& batches, std::string* error) {
  std::vector<SweepPoint> points;
  auto add = [&](const std::string& label, const ModelShape& shape, int64_t t) {
    points.push_back({label, shape, t});
  };
  if (kind == "seq") {
    for (int64_t t : seqs) {
      if (t < 1) {
        *error = "--seq values must be >= 1";
        return {};
      }
      add("T=" + std::to_string(t), base, t);
    }
  } else if (kind == "batch") {
    for (int64_t b : batches) {
      if (b < 1) {
        *error = "--batches values must be >= 1";
        return {};
      }
      ModelShape s = base;
      s.batch = b;
      add("B=" + std::to_string(b), s, tokens);
    }
  } else if (kind == "heads") {
    const int64_t n = base.heads;
    const std::pair<const char*, int64_t> layouts[] = {
        {"MHA", n}, {"GQA", std::max<int64_t>(1, n / 4)}, {"MQA", 1}};
    std::set<int64_t> seen;
    for (const auto& [name, k] : layouts) {
      if (!seen.insert(k).second || n % k != 0) continue;
      ModelShape s = base;
      s.kv_heads = k;
      add(std::string(name) + " K=" + std::to_string(k), s, tokens);
    }
  } else {
    *error = "unknown sweep kind '" + kind + "' (seq, batch, heads)";
    return {};
  }
  if (points.empty()) *error = "the sweep has no points";
  return points;
}

std::string CheckSweepBackends(const attention::v1::GetServerInfoResponse& server,
                               const std::vector<std::string>& backends) {
  std::string available;
  for (const auto& b : server.backends()) {
    if (b.available()) available += (available.empty() ? "" : ", ") + b.name();
  }
  available += (available.empty() ? "" : ", ") + std::string("auto");
  for (const std::string& name : backends) {
    if (name.empty() || name == "auto") continue;  // the default, and the server's own choice
    const attention::v1::BackendInfo* found = nullptr;
    for (const auto& b : server.backends()) {
      if (b.name() == name) found = &b;
    }
    if (found == nullptr) {
      return "backend '" + name + "' is not on the server; available: " + available;
    }
    if (!found->available()) {
      return "backend '" + name + "' is not available on this server (" +
             found->unavailable_reason() +
             "); available: " + (available.empty() ? "none" : available);
    }
  }
  return "";
}

std::string SweepTitle(const std::string& kind, const attention::v1::GetServerInfoResponse& server,
                       const ModelShape& base, int64_t tokens, const std::string& backends,
                       const std::string& date) {
  const char* causal = base.causal == attention::v1::CAUSAL_TOP_LEFT       ? "top-left causal"
                       : base.causal == attention::v1::CAUSAL_BOTTOM_RIGHT ? "bottom-right causal"
                                                                           : "no mask";
  std::string shape = kind == "batch" ? "" : "B=" + std::to_string(base.batch) + " ";
  if (kind != "seq") shape += "T=" + std::to_string(tokens) + " ";
  shape += "N=" + std::to_string(base.heads);
  if (kind != "heads") shape += " K=" + std::to_string(base.kv_heads);
  shape += " H=" + std::to_string(base.head_dim) + " " + DTypeName(base.dtype) + " " + causal;
  const std::string device = server.device_name().empty() ? "?" : server.device_name();
  return "attention-loadgen sweep " + kind + " on " + device + " (backends " +
         (backends.empty() ? server.default_backend() : backends) + ", server " + server.version() +
         "), " + shape + ", " + date;
}

std::string FormatSweepTable(const std::string& kind, const std::vector<SweepRow>& rows) {
  std::ostringstream out;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-14s %-10s %10s %10s %10s %12s %8s\n",
                kind == "seq"     ? "seq"
                : kind == "batch" ? "batch"
                                  : "heads",
                "backend", "p50 ms", "p99 ms", "req/s", "TFLOP/s", "errors");
  out << buf;
  for (const SweepRow& row : rows) {
    const Report& r = row.report;
    if (r.ok == 0) {
      std::snprintf(buf, sizeof(buf), "%-14s %-10s %10s %10s %10s %12s %8lld\n",
                    row.point.label.c_str(), row.backend.c_str(), "n/a", "n/a", "n/a", "n/a",
                    static_cast<long long>(r.sent - r.ok));
    } else {
      std::snprintf(buf, sizeof(buf), "%-14s %-10s %10.3f %10.3f %10.2f %12.4g %8lld\n",
                    row.point.label.c_str(), row.backend.c_str(), r.latency_ms.p50,
                    r.latency_ms.p99, r.requests_per_s, r.tflops,
                    static_cast<long long>(r.sent - r.ok));
    }
    out << buf;
  }
  return out.str();
}

std::string SweepCsv(const std::string& kind, const std::vector<SweepRow>& rows) {
  std::ostringstream out;
  out << "sweep,point,backend,batch,tokens,heads,kv_heads,head_dim,dtype,requests,ok,errors,"
         "p50_ms,p99_ms,mean_ms,requests_per_s,tflops,error\n";
  for (const SweepRow& row : rows) {
    const Report& r = row.report;
    const ModelShape& s = row.point.shape;
    char nums[256] = ",,,,";  // nothing measured: empty cells, never 0
    if (r.ok > 0) {
      std::snprintf(nums, sizeof(nums), "%.6g,%.6g,%.6g,%.6g,%.6g", r.latency_ms.p50,
                    r.latency_ms.p99, r.latency_ms.mean, r.requests_per_s, r.tflops);
    }
    std::string error;
    if (!r.errors.empty()) {
      const std::string& code = r.errors.begin()->first;
      error = code + ": " + r.first_messages.at(code);
    } else if (!r.info.stop_reason.empty()) {
      error = r.info.stop_reason;
    }
    out << kind << "," << CsvField(row.point.label) << "," << CsvField(row.backend) << ","
        << s.batch << "," << row.point.tokens << "," << s.heads << "," << s.kv_heads << ","
        << s.head_dim << "," << DTypeName(s.dtype) << "," << r.sent << "," << r.ok << ","
        << (r.sent - r.ok) << "," << nums << "," << CsvField(error) << "\n";
  }
  return out.str();
}

}  // namespace attn::loadgen
