// Metric names, types and labels of server/metrics (DESIGN.md §9): attn_<what>_<unit>, base
// units, counters end in _total and nothing else does, histograms (no summaries), fixed label
// sets; the hot-path observations land on the right children; the scrape-time registration API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "metrics/metrics.h"

namespace attn::metrics {
namespace {

struct Family {
  std::string type;
  std::set<std::string> label_names;  // over all samples (le excluded)
  int samples = 0;
};

/// Parses the text exposition: # TYPE lines and samples, for attn_* families.
std::map<std::string, Family> Parse(const std::string& text) {
  std::map<std::string, Family> out;
  std::istringstream in(text);
  std::string line;
  const std::regex type_re(R"(^# TYPE (\S+) (\S+)$)");
  const std::regex sample_re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$)");
  const std::regex label_re(R"(([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\]|\\.)*)\")");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, type_re)) {
      out[m[1]].type = m[2];
    } else if (std::regex_match(line, m, sample_re)) {
      std::string name = m[1];
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s(suffix);
        if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
          const std::string base = name.substr(0, name.size() - s.size());
          if (out.count(base) && out[base].type == "histogram") name = base;
        }
      }
      Family& f = out[name];
      ++f.samples;
      const std::string labels = m[3];
      for (auto it = std::sregex_iterator(labels.begin(), labels.end(), label_re);
           it != std::sregex_iterator(); ++it) {
        if ((*it)[1] != "le") f.label_names.insert((*it)[1]);
      }
    }
  }
  return out;
}

double Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, series.size() + 1, series + " ") == 0) {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return -1;
}

Metrics MakeMetrics() {
  return Metrics({"cpu", "naive", "fused"},
                 {{"version", "1.2.3"}, {"device", "cpu"}, {"backends", "cpu"}});
}

TEST(MetricsNaming, EveryFamilyFollowsTheConventions) {
  Metrics m({"cpu", "naive"}, {{"version", "x"}});
  // Touch every kind of child so each family has samples.
  m.ObserveRequest(Method::kAttend, 1, StatusCode::kInvalidArgument, 0.001);
  auto kv = m.RegisterKvCache([] {
    KvCacheStats s;
    s.classes.push_back({"bf16_p16", 100, 10});
    s.sequences = 3;
    s.host.push_back({"replay_outputs", 64, 1024});
    return s;
  });
  auto req = m.RegisterRequestGauges([] { return int64_t{2}; }, [] { return int64_t{1}; });
  auto pool = m.RegisterDevicePool([] { return std::pair<int64_t, int64_t>{1000, 10}; });
  auto shm = m.RegisterSharedMemory([] { return SharedMemoryStats{1, 4096, 1, 0}; });
  const auto families = Parse(m.Render());
  const std::regex name_re("^attn_[a-z0-9]+(_[a-z0-9]+)*$");
  const std::set<std::string> base_units = {"seconds", "bytes", "requests", "tokens", "pages",
                                            "sequences", "second", "total", "info", "error",
                                            "flight", "queued", "ratio", "steps", "regions",
                                            "leases"};
  int attn_families = 0;
  for (const auto& [name, f] : families) {
    if (name.rfind("attn_", 0) != 0) continue;
    ++attn_families;
    SCOPED_TRACE(name);
    EXPECT_TRUE(std::regex_match(name, name_re));
    EXPECT_NE(f.type, "summary");
    EXPECT_NE(f.type, "untyped");
    const bool ends_total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(f.type == "counter", ends_total) << "counters, and only counters, end in _total";
    EXPECT_EQ(name.find("milli"), std::string::npos) << "base units only";
    EXPECT_EQ(name.find("micro"), std::string::npos) << "base units only";
    EXPECT_EQ(name.find("tflop"), std::string::npos) << "base units only";
    if (name.find("duration") != std::string::npos) {
      EXPECT_EQ(f.type, "histogram");
      EXPECT_TRUE(name.size() > 8 && name.compare(name.size() - 8, 8, "_seconds") == 0);
    }
    const std::string last = name.substr(name.rfind('_') + 1);
    EXPECT_TRUE(base_units.count(last)) << "unexpected unit suffix " << last;
    EXPECT_GT(f.samples, 0);
  }
  EXPECT_GE(attn_families, 20);
}

TEST(MetricsNaming, FamiliesAndLabelSets) {
  Metrics m = MakeMetrics();
  auto kv = m.RegisterKvCache([] {
    KvCacheStats s;
    s.classes.push_back({"bf16_p16", 100, 10});
    return s;
  });
  auto req = m.RegisterRequestGauges([] { return int64_t{0}; }, [] { return int64_t{0}; });
  auto pool = m.RegisterDevicePool([] { return std::pair<int64_t, int64_t>{0, 0}; });
  const auto f = Parse(m.Render());
  using L = std::set<std::string>;
  const std::map<std::string, std::pair<std::string, L>> expected = {
      {"attn_requests_total", {"counter", {"method", "backend", "code"}}},
      {"attn_request_duration_seconds", {"histogram", {"method", "backend", "code"}}},
      {"attn_phase_duration_seconds", {"histogram", {"backend", "phase"}}},
      {"attn_batch_size_requests", {"histogram", {"backend"}}},
      {"attn_batch_tokens", {"histogram", {"backend"}}},
      {"attn_kernel_flops_per_second", {"histogram", {"backend"}}},
      {"attn_kernel_bytes_per_second", {"histogram", {"backend"}}},
      {"attn_graph_cache_hits_total", {"counter", {"backend"}}},
      {"attn_graph_cache_builds_total", {"counter", {"backend"}}},
      {"attn_shadow_relative_error", {"histogram", {"backend"}}},
      {"attn_shadow_mismatches_total", {"counter", {"backend"}}},
      {"attn_shadow_dropped_total", {"counter", {"backend"}}},
      {"attn_requests_in_flight", {"gauge", {}}},
      {"attn_requests_queued", {"gauge", {}}},
      {"attn_device_pool_capacity_bytes", {"gauge", {}}},
      {"attn_device_pool_used_bytes", {"gauge", {}}},
      {"attn_device_peak_flops_per_second", {"gauge", {}}},
      {"attn_device_peak_bytes_per_second", {"gauge", {}}},
      {"attn_kv_capacity_pages", {"gauge", {"layout_class"}}},
      {"attn_kv_used_pages", {"gauge", {"layout_class"}}},
      {"attn_kv_used_ratio", {"gauge", {}}},
      {"attn_sequence_steps_total", {"counter", {"method", "result"}}},
      {"attn_sequence_step_duration_seconds", {"histogram", {"method"}}},
      {"attn_sequence_decode_step_duration_seconds", {"histogram", {"method"}}},
      {"attn_sequence_batch_size_steps", {"histogram", {}}},
      {"attn_build_info", {"gauge", {"version", "device", "backends"}}},
  };
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.count(name));
    EXPECT_EQ(f.at(name).type, want.first);
    EXPECT_EQ(f.at(name).label_names, want.second);
  }
  // attn_kv_sequences: exported once a KV cache registers (this one reported 0 sequences).
  ASSERT_TRUE(f.count("attn_kv_sequences"));
  EXPECT_EQ(f.at("attn_kv_sequences").samples, 1);
}

TEST(MetricsNaming, LabelValueNames) {
  EXPECT_STREQ(CodeName(0), "OK");
  EXPECT_STREQ(CodeName(3), "INVALID_ARGUMENT");
  EXPECT_STREQ(CodeName(8), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(CodeName(14), "UNAVAILABLE");
  EXPECT_STREQ(CodeName(16), "UNAUTHENTICATED");
  EXPECT_STREQ(CodeName(99), "UNKNOWN");
  for (int c = 0; c < 15; ++c) {
    EXPECT_STREQ(CodeName(c), StatusCodeName(static_cast<StatusCode>(c))) << c;
  }
  EXPECT_STREQ(PhaseName(Phase::kHostToDevice), "host_to_device");
  EXPECT_STREQ(PhaseName(Phase::kDeviceToHost), "device_to_host");
  EXPECT_STREQ(MethodName(Method::kAttend), "Attend");
  EXPECT_STREQ(MethodName(Method::kGetServerInfo), "GetServerInfo");
  EXPECT_STREQ(MethodName(Method::kGetLoad), "GetLoad");
  EXPECT_STREQ(MethodName(Method::kExtendStream), "ExtendStream");
  EXPECT_STREQ(MethodName(Method::kGetSequence), "GetSequence");
  EXPECT_STREQ(MethodName(Method::kExtendBatchStream), "ExtendBatchStream");
  EXPECT_STREQ(MethodName(static_cast<Method>(kNumMethods)), "unknown");
}

TEST(MetricsNaming, CommonChildrenExistAtZeroFromStart) {
  Metrics m = MakeMetrics();
  const std::string text = m.Render();
  for (const char* b : {"cpu", "naive", "fused"}) {
    const std::string l = std::string("{backend=\"") + b + "\",code=\"OK\",method=\"Attend\"}";
    EXPECT_EQ(Value(text, "attn_requests_total" + l), 0) << b;
    EXPECT_EQ(Value(text, "attn_request_duration_seconds_count" + l), 0) << b;
    EXPECT_EQ(Value(text, std::string("attn_graph_cache_hits_total{backend=\"") + b + "\"}"), 0);
    EXPECT_EQ(Value(text, std::string("attn_graph_cache_builds_total{backend=\"") + b + "\"}"),
              0);
  }
  EXPECT_EQ(Value(text, "attn_build_info{backends=\"cpu\",device=\"cpu\",version=\"1.2.3\"}"), 1);
  // Without a KV cache the KV families are declared but have no samples.
  EXPECT_NE(text.find("# TYPE attn_kv_capacity_pages gauge"), std::string::npos);
  EXPECT_EQ(text.find("attn_kv_capacity_pages{"), std::string::npos);
}

TEST(MetricsNaming, ObservationsLandOnTheirChildren) {
  Metrics m = MakeMetrics();
  const int cpu = m.BackendIndex("cpu");
  ASSERT_GT(cpu, 0);
  EXPECT_EQ(m.BackendIndex("nope"), 0);
  m.ObserveRequest(Method::kAttend, cpu, StatusCode::kOk, 0.003);
  m.ObserveRequest(Method::kAttend, cpu, StatusCode::kOk, 0.004);
  m.ObserveRequest(Method::kAttend, 0, StatusCode::kInvalidArgument, 0.0001);
  m.ObserveRequest(Method::kAttend, 42, StatusCode::kUnavailable, 0.0001);  // bad index: none
  m.ObserveRequest(Method::kGetServerInfo, 0, StatusCode::kOk, 0.0001);
  m.ObservePhase(cpu, Phase::kKernel, 0.002);
  m.ObserveLaunch(cpu, 1, 512, 4e9, 2e6, 0.002);
  m.ObserveLaunch(cpu, 1, 512, 4e9, 2e6, 0);  // no kernel time: no throughput sample
  m.GraphCacheHit(cpu);
  m.GraphCacheBuild(cpu);
  m.GraphCacheBuild(cpu);
  const std::string t = m.Render();
  EXPECT_EQ(Value(t, "attn_requests_total{backend=\"cpu\",code=\"OK\",method=\"Attend\"}"), 2);
  EXPECT_DOUBLE_EQ(
      Value(t, "attn_request_duration_seconds_sum{backend=\"cpu\",code=\"OK\",method=\"Attend\"}"),
      0.007);
  EXPECT_EQ(Value(t, "attn_request_duration_seconds_bucket{backend=\"cpu\",code=\"OK\","
                     "method=\"Attend\",le=\"0.0025\"}"),
            0);
  EXPECT_EQ(Value(t, "attn_request_duration_seconds_bucket{backend=\"cpu\",code=\"OK\","
                     "method=\"Attend\",le=\"0.005\"}"),
            2);
  EXPECT_EQ(Value(t, "attn_requests_total{backend=\"none\",code=\"INVALID_ARGUMENT\","
                     "method=\"Attend\"}"),
            1);
  EXPECT_EQ(Value(t, "attn_requests_total{backend=\"none\",code=\"UNAVAILABLE\","
                     "method=\"Attend\"}"),
            1);
  EXPECT_EQ(Value(t, "attn_requests_total{backend=\"none\",code=\"OK\","
                     "method=\"GetServerInfo\"}"),
            1);
  EXPECT_EQ(Value(t, "attn_phase_duration_seconds_count{backend=\"cpu\",phase=\"kernel\"}"), 1);
  EXPECT_EQ(Value(t, "attn_phase_duration_seconds_count{backend=\"cpu\",phase=\"queue\"}"), 0);
  EXPECT_EQ(Value(t, "attn_batch_size_requests_count{backend=\"cpu\"}"), 2);
  EXPECT_EQ(Value(t, "attn_batch_tokens_sum{backend=\"cpu\"}"), 1024);
  EXPECT_EQ(Value(t, "attn_kernel_flops_per_second_count{backend=\"cpu\"}"), 1);
  EXPECT_DOUBLE_EQ(Value(t, "attn_kernel_flops_per_second_sum{backend=\"cpu\"}"), 2e12);
  EXPECT_DOUBLE_EQ(Value(t, "attn_kernel_bytes_per_second_sum{backend=\"cpu\"}"), 1e9);
  EXPECT_EQ(Value(t, "attn_graph_cache_hits_total{backend=\"cpu\"}"), 1);
  EXPECT_EQ(Value(t, "attn_graph_cache_builds_total{backend=\"cpu\"}"), 2);
}

TEST(MetricsNaming, BucketsAreIncreasingAndPrintAsWritten) {
  for (const auto& b : {RequestDurationBuckets(), PhaseDurationBuckets(), BatchSizeBuckets(),
                        BatchTokenBuckets(), FlopsPerSecondBuckets(), BytesPerSecondBuckets(),
                        RelativeErrorBuckets()}) {
    ASSERT_FALSE(b.empty());
    for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  }
  const auto rel = RelativeErrorBuckets();
  EXPECT_EQ(rel.front(), 1e-7);
  EXPECT_EQ(rel.back(), 1.0);
  // The DESIGN.md §4 tolerances are bucket boundaries (fraction over tolerance is exact).
  for (double tol : {1e-5, 2e-3, 1e-2}) {
    EXPECT_NE(std::find(rel.begin(), rel.end(), tol), rel.end()) << tol;
  }
  EXPECT_EQ(RequestDurationBuckets().front(), 1e-5);
  EXPECT_EQ(RequestDurationBuckets().back(), 60.0);
  EXPECT_EQ(PhaseDurationBuckets().front(), 1e-6);
  EXPECT_EQ(FlopsPerSecondBuckets().back(), 1e16);
  Metrics m = MakeMetrics();
  const std::string t = m.Render();
  EXPECT_NE(t.find("le=\"2.5e-05\""), std::string::npos);
  EXPECT_EQ(t.find("000000001"), std::string::npos) << "no rounding noise in le labels";
}

TEST(MetricsNaming, ShadowObservations) {
  Metrics m = MakeMetrics();
  const int cpu = m.BackendIndex("cpu");
  m.ObserveShadow(cpu, 3e-6, false);
  m.ObserveShadow(cpu, std::nan(""), true);  // recorded as 10, keeps the sum finite
  m.ShadowDropped(cpu);
  const std::string t = m.Render();
  EXPECT_EQ(Value(t, "attn_shadow_relative_error_count{backend=\"cpu\"}"), 2);
  EXPECT_EQ(Value(t, "attn_shadow_relative_error_bucket{backend=\"cpu\",le=\"5e-06\"}"), 1);
  EXPECT_DOUBLE_EQ(Value(t, "attn_shadow_relative_error_sum{backend=\"cpu\"}"), 10 + 3e-6);
  EXPECT_EQ(Value(t, "attn_shadow_mismatches_total{backend=\"cpu\"}"), 1);
  EXPECT_EQ(Value(t, "attn_shadow_dropped_total{backend=\"cpu\"}"), 1);
}

TEST(MetricsRegistration, SharedMemoryGaugesSumRegistrationsAndVanishWithThem) {
  Metrics m = MakeMetrics();
  EXPECT_EQ(Value(m.Render(), "attn_shared_memory_regions"), -1);  // no samples yet
  {
    auto a = m.RegisterSharedMemory([] { return SharedMemoryStats{2, 8192, 1, 3}; });
    auto b = m.RegisterSharedMemory([] { return SharedMemoryStats{1, 4096, 1, 1}; });
    const std::string t = m.Render();
    EXPECT_EQ(Value(t, "attn_shared_memory_regions"), 3);
    EXPECT_EQ(Value(t, "attn_shared_memory_bytes"), 12288);
    EXPECT_EQ(Value(t, "attn_shared_memory_leases"), 2);
    EXPECT_EQ(Value(t, "attn_shared_memory_broken_total"), 4);
  }
  EXPECT_EQ(Value(m.Render(), "attn_shared_memory_bytes"), -1);
}

TEST(MetricsRegistration, ScrapeTimeCallbacksAndUnregistering) {
  Metrics m = MakeMetrics();
  int64_t in_flight = 5;
  {
    auto r = m.RegisterRequestGauges([&] { return in_flight; }, [] { return int64_t{2}; });
    auto kv1 = m.RegisterKvCache([] {
      KvCacheStats s;
      s.classes.push_back({"bf16_p16_h128", 1000, 250});
      s.classes.push_back({"fp8_p16_h128", 2000, 0});
      s.sequences = 7;
      s.host.push_back({"replay_outputs", 4096, 1 << 20});
      s.host.push_back({"sequence_metadata", 512, 1 << 30});
      return s;
    });
    auto pool = m.RegisterDevicePool([] { return std::pair<int64_t, int64_t>{1 << 30, 4096}; });
    m.SetDevicePeaks(989e12, 4.8e12);
    std::string t = m.Render();
    EXPECT_EQ(Value(t, "attn_requests_in_flight"), 5);
    EXPECT_EQ(Value(t, "attn_requests_queued"), 2);
    EXPECT_EQ(Value(t, "attn_kv_capacity_pages{layout_class=\"bf16_p16_h128\"}"), 1000);
    EXPECT_EQ(Value(t, "attn_kv_used_pages{layout_class=\"bf16_p16_h128\"}"), 250);
    EXPECT_EQ(Value(t, "attn_kv_capacity_pages{layout_class=\"fp8_p16_h128\"}"), 2000);
    EXPECT_EQ(Value(t, "attn_kv_sequences"), 7);
    EXPECT_EQ(Value(t, "attn_kv_host_used_bytes{kind=\"replay_outputs\"}"), 4096);
    EXPECT_EQ(Value(t, "attn_kv_host_capacity_bytes{kind=\"replay_outputs\"}"), 1 << 20);
    EXPECT_EQ(Value(t, "attn_kv_host_used_bytes{kind=\"sequence_metadata\"}"), 512);
    EXPECT_EQ(Value(t, "attn_kv_host_capacity_bytes{kind=\"sequence_metadata\"}"), 1 << 30);
    EXPECT_EQ(Value(t, "attn_device_pool_capacity_bytes"), 1 << 30);
    EXPECT_EQ(Value(t, "attn_device_pool_used_bytes"), 4096);
    EXPECT_EQ(Value(t, "attn_device_peak_flops_per_second"), 989e12);
    in_flight = 6;  // read at scrape time
    EXPECT_EQ(Value(m.Render(), "attn_requests_in_flight"), 6);
    // A moved registration still unregisters once.
    attn::metrics::Registration moved = std::move(kv1);
    moved.Reset();
    EXPECT_EQ(m.Render().find("attn_kv_capacity_pages{"), std::string::npos);
  }
  const std::string t = m.Render();
  EXPECT_EQ(t.find("\nattn_requests_in_flight "), std::string::npos);
  EXPECT_EQ(t.find("\nattn_device_pool_used_bytes "), std::string::npos);
}

TEST(MetricsHelpers, DevicePeaksAndBytes) {
  EXPECT_EQ(DevicePeaks("NVIDIA H200").first, 989e12);
  EXPECT_EQ(DevicePeaks("NVIDIA H200").second, 4.8e12);
  EXPECT_EQ(DevicePeaks("NVIDIA L4").second, 300e9);
  EXPECT_EQ(DevicePeaks("NVIDIA L40S").first, 362e12);
  EXPECT_EQ(DevicePeaks("cpu").first, 0);
  // q (1x4x2x8), k and v (1x6x1x8) in bf16, o like q, lse (2x4) float32.
  EXPECT_EQ(MinBytesMoved(64, 48, 2, 8), (2 * 64 + 2 * 48) * 2 + 8 * 4);
}

TEST(MetricsNaming, SequenceStepsAndKvRatio) {
  Metrics m = MakeMetrics();
  const int cpu = m.BackendIndex("cpu");
  m.ObserveStep(Method::kExtend, true, 0.003);
  m.ObserveStep(Method::kExtendStream, true, 0.002, /*decode=*/true);
  m.ObserveStep(Method::kExtendStream, true, 0.004);  // a prefill: not a decode step
  m.ObserveStep(Method::kExtendBatch, false, 1.0);    // errors: counted, not timed
  m.ObserveStep(Method::kAttend, true, 1.0);          // not a step method: ignored
  m.ObserveStep(Method::kExtendBatchStream, true, 0.5);
  m.ObserveStepBatch(cpu, 3, 5);
  auto kv = m.RegisterKvCache([] {
    KvCacheStats s;
    s.classes.push_back({"a", 100, 30});  // carved 400 pages, 40 in use (0.1 of them) ...
    s.classes.push_back({"b", 300, 10});
    s.used_page_bytes = 40 * 2 * 4096;   // ... in a pool of 4000 K+V page pairs: 0.01
    s.pool_bytes = 4000 * 2 * 4096;
    return s;
  });
  const std::string t = m.Render();
  EXPECT_EQ(Value(t, "attn_sequence_steps_total{method=\"Extend\",result=\"ok\"}"), 1);
  EXPECT_EQ(Value(t, "attn_sequence_steps_total{method=\"ExtendStream\",result=\"ok\"}"), 2);
  EXPECT_EQ(Value(t, "attn_sequence_steps_total{method=\"ExtendBatch\",result=\"error\"}"), 1);
  EXPECT_EQ(Value(t, "attn_sequence_steps_total{method=\"ExtendBatch\",result=\"ok\"}"), 0);
  EXPECT_EQ(Value(t, "attn_sequence_step_duration_seconds_count{method=\"ExtendStream\"}"), 2);
  EXPECT_DOUBLE_EQ(Value(t, "attn_sequence_step_duration_seconds_sum{method=\"ExtendStream\"}"),
                   0.006);
  EXPECT_EQ(Value(t, "attn_sequence_step_duration_seconds_count{method=\"ExtendBatch\"}"), 0);
  EXPECT_EQ(Value(t, "attn_sequence_decode_step_duration_seconds_count{method=\"ExtendStream\"}"),
            1);
  EXPECT_DOUBLE_EQ(
      Value(t, "attn_sequence_decode_step_duration_seconds_sum{method=\"ExtendStream\"}"), 0.002);
  EXPECT_EQ(Value(t, "attn_sequence_decode_step_duration_seconds_count{method=\"Extend\"}"), 0);
  EXPECT_EQ(Value(t, "attn_sequence_steps_total{method=\"ExtendBatchStream\",result=\"ok\"}"), 1);
  EXPECT_EQ(Value(t, "attn_sequence_batch_size_steps_count"), 1);
  EXPECT_EQ(Value(t, "attn_sequence_batch_size_steps_sum"), 3);
  EXPECT_EQ(Value(t, "attn_batch_size_requests_sum{backend=\"cpu\"}"), 3);
  EXPECT_EQ(Value(t, "attn_batch_tokens_sum{backend=\"cpu\"}"), 5);
  EXPECT_EQ(Value(t, "attn_kernel_flops_per_second_count{backend=\"cpu\"}"), 0);
  // The pool, not the pages carved so far (issue 19 review: 0.997 at 21 % of the pool).
  EXPECT_DOUBLE_EQ(Value(t, "attn_kv_used_ratio"), 0.01);
}

TEST(MetricsNaming, StepOnlyBackendsGetNoAttendChildren) {
  // A new-user review found attn_requests_total{method="Attend",backend="paged-cpu"} exported:
  // no Attend call runs on the KV cache's backend, so only its step and phase children exist.
  Metrics m({"cpu"}, {{"version", "x"}}, {"paged-cpu", "cpu"});
  const std::string t = m.Render();
  EXPECT_NE(t.find("attn_requests_total{backend=\"cpu\",code=\"OK\",method=\"Attend\"}"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("backend=\"paged-cpu\",code=\"OK\",method=\"Attend\""), std::string::npos)
      << t;
  EXPECT_NE(t.find("attn_phase_duration_seconds_count{backend=\"paged-cpu\""), std::string::npos)
      << "the steps' phases are labelled with it";
  EXPECT_EQ(m.BackendIndex("paged-cpu"), 2);
  EXPECT_EQ(m.BackendIndex("cpu"), 1) << "a name in both lists is listed once";
}

}  // namespace
}  // namespace attn::metrics
