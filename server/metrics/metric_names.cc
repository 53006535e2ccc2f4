// Names, histogram buckets and device peaks of the server's metrics (declared in metrics.h).
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "metrics/metrics.h"

namespace attn::metrics {
namespace {

// steps × 10^e for e in [lo_exp, hi_exp], up to 10^hi_exp; parsed from decimal text so that
// the `le` labels print as written (2.5e-05, not 2.5000000000000001e-05).
std::vector<double> Decades(int lo_exp, int hi_exp, std::initializer_list<const char*> steps) {
  std::vector<double> b;
  for (int e = lo_exp; e <= hi_exp; ++e) {
    for (const char* s : steps) {
      const double v = std::strtod((std::string(s) + "e" + std::to_string(e)).c_str(), nullptr);
      if (e < hi_exp || std::string(s) == "1") b.push_back(v);
    }
  }
  return b;
}

std::vector<double> Powers(double base, int n) {
  std::vector<double> b;
  double v = 1;
  for (int i = 0; i <= n; ++i, v *= base) b.push_back(v);
  return b;
}

}  // namespace

const char* MethodName(Method m) {
  static constexpr const char* kNames[kNumMethods] = {
      "Attend",       "GetServerInfo",   "GetLoad",      "CreateSequence",
      "Extend",       "ExtendBatch",     "ExtendStream", "TruncateSequence",
      "ForkSequence", "ReleaseSequence", "GetSequence",  "ExtendBatchStream",
      "SharedMemoryLease"};
  const int i = static_cast<int>(m);
  return i >= 0 && i < kNumMethods ? kNames[i] : "unknown";
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kDecode:
      return "decode";
    case Phase::kQueue:
      return "queue";
    case Phase::kHostToDevice:
      return "host_to_device";
    case Phase::kKernel:
      return "kernel";
    case Phase::kDeviceToHost:
      return "device_to_host";
    case Phase::kEncode:
      return "encode";
  }
  return "unknown";
}

const char* CodeName(int code) {
  static const char* const kNames[kNumCodes] = {"OK",
                                                "CANCELLED",
                                                "UNKNOWN",
                                                "INVALID_ARGUMENT",
                                                "DEADLINE_EXCEEDED",
                                                "NOT_FOUND",
                                                "ALREADY_EXISTS",
                                                "PERMISSION_DENIED",
                                                "RESOURCE_EXHAUSTED",
                                                "FAILED_PRECONDITION",
                                                "ABORTED",
                                                "OUT_OF_RANGE",
                                                "UNIMPLEMENTED",
                                                "INTERNAL",
                                                "UNAVAILABLE",
                                                "DATA_LOSS",
                                                "UNAUTHENTICATED"};
  return code >= 0 && code < kNumCodes ? kNames[code] : "UNKNOWN";
}

std::vector<double> RequestDurationBuckets() {
  auto b = Decades(-5, 1, {"1", "2.5", "5"});
  b.push_back(30);
  b.push_back(60);
  return b;
}
std::vector<double> PhaseDurationBuckets() {
  auto b = Decades(-6, 1, {"1", "2.5", "5"});
  b.push_back(30);
  b.push_back(60);
  return b;
}
std::vector<double> BatchSizeBuckets() { return Powers(2, 10); }
std::vector<double> BatchTokenBuckets() { return Powers(4, 12); }
std::vector<double> FlopsPerSecondBuckets() { return Decades(8, 16, {"1", "2.5", "5"}); }
std::vector<double> BytesPerSecondBuckets() { return Decades(7, 14, {"1", "2.5", "5"}); }
std::vector<double> RelativeErrorBuckets() { return Decades(-7, 0, {"1", "2", "5"}); }

std::pair<double, double> DevicePeaks(const std::string& name) {
  auto has = [&name](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return {989e12, 4.8e12};
  if (has("H100") && has("PCIe")) return {756e12, 2.0e12};
  if (has("H100")) return {989e12, 3.35e12};
  if (has("A100")) return {312e12, 2.039e12};
  if (has("L40S")) return {362e12, 864e9};
  if (has("L4")) return {121e12, 300e9};
  return {0, 0};
}

double MinBytesMoved(int64_t q_elements, int64_t kv_elements, int dtype_bytes,
                     int64_t lse_elements) {
  return (2.0 * static_cast<double>(q_elements) + 2.0 * static_cast<double>(kv_elements)) *
             dtype_bytes +
         4.0 * static_cast<double>(lse_elements);
}

}  // namespace attn::metrics
