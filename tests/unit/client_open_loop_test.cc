// Open-loop pieces without a network: Poisson arrivals, the report built from samples (HDR
// percentiles, flops/kernel TFLOP/s, client overload), CSV output, sweep points and table.
#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/sweep.h"

namespace attn::loadgen {
namespace {

TEST(ClientOpenLoop, PoissonArrivalsHaveTheRateAndAreSeeded) {
  PoissonArrivals a(50.0, 42), b(50.0, 42), c(50.0, 43);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  bool differs = false;
  for (int i = 0; i < n; ++i) {
    const double x = a.Next();
    ASSERT_GT(x, 0);
    ASSERT_EQ(x, b.Next());
    differs = differs || x != c.Next();
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_TRUE(differs);
  const double mean = sum / n;
  const double sd = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, 1.0 / 50, 0.01 / 50);  // exponential: mean = sd = 1/rate
  EXPECT_NEAR(sd, 1.0 / 50, 0.02 / 50);
}

TEST(ClientOpenLoop, ReportUsesHistogramAndCountsOverload) {
  std::vector<Sample> samples;
  for (int i = 1; i <= 1000; ++i) {
    Sample s;
    s.index = i;
    s.latency_ms = i * 0.5;  // 0.5 .. 500 ms
    s.flops = 2e9;
    s.phase_us[3] = 1000;  // 1 ms kernel
    samples.push_back(s);
  }
  Sample bad;
  bad.status = "UNAVAILABLE";
  bad.error_message = "down";
  samples.push_back(bad);
  RunInfo info;
  info.mode = "open";
  info.rate = 100;
  info.max_in_flight = 8;
  const Report r = BuildReport(info, samples, 10.0, 7);
  EXPECT_EQ(r.sent, 1001);
  EXPECT_EQ(r.ok, 1000);
  EXPECT_EQ(r.errors.at("UNAVAILABLE"), 1);
  EXPECT_EQ(r.client_overload, 7);
  EXPECT_NEAR(r.latency_ms.p50, 250, 250 / 1000.0);
  EXPECT_NEAR(r.latency_ms.p99, 495, 495 / 1000.0);
  EXPECT_DOUBLE_EQ(r.latency_ms.max, 500);
  EXPECT_NEAR(r.latency_ms.mean, 250.25, 1e-9);
  EXPECT_NEAR(r.tflops, 2e9 / 1e-3 / 1e12, 1e-9);  // 2 TFLOP/s
  const std::string text = FormatReport(r);
  EXPECT_NE(text.find("open loop, Poisson arrivals at 100.00"), std::string::npos);
  EXPECT_NE(text.find("client overload     7"), std::string::npos);
  const nlohmann::json j = ReportToJson(r);
  EXPECT_EQ(j["mode"], "open");
  EXPECT_EQ(j["client_overload"], 7);
}

TEST(ClientOpenLoop, CsvRowMatchesHeaderAndQuotes) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  RunInfo info;
  info.workload = "fixed 8 tokens, x";
  const Report r = BuildReport(info, {}, 0);
  const std::string header = CsvHeader();
  const std::string row = CsvRow(r);
  auto fields = [](const std::string& s) {
    int n = 1;
    bool quoted = false;
    for (char c : s) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) ++n;
    }
    return n;
  };
  EXPECT_EQ(fields(header), fields(row));
  EXPECT_EQ(row.rfind("closed,", 0), 0u);
}

TEST(ClientSweep, PointsOfEachKind) {
  ModelShape base;
  base.heads = 8;
  base.kv_heads = 8;
  std::string error;
  auto seq = SweepPoints("seq", base, 64, {16, 32}, {1}, &error);
  ASSERT_EQ(seq.size(), 2u);
  EXPECT_EQ(seq[1].label, "T=32");
  EXPECT_EQ(seq[1].tokens, 32);
  auto batch = SweepPoints("batch", base, 64, {16}, {1, 4}, &error);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[1].shape.batch, 4);
  EXPECT_EQ(batch[1].tokens, 64);
  auto heads = SweepPoints("heads", base, 64, {}, {}, &error);
  ASSERT_EQ(heads.size(), 3u);
  EXPECT_EQ(heads[0].label, "MHA K=8");
  EXPECT_EQ(heads[1].label, "GQA K=2");
  EXPECT_EQ(heads[2].label, "MQA K=1");
  base.heads = 2;  // GQA K=N/4 -> 1 duplicates MQA
  EXPECT_EQ(SweepPoints("heads", base, 64, {}, {}, &error).size(), 2u);
  EXPECT_TRUE(SweepPoints("nope", base, 64, {}, {}, &error).empty());
  EXPECT_FALSE(error.empty());
}

TEST(ClientSweep, TableAndCsvHaveOneRowPerPointAndBackend) {
  ModelShape base;
  std::string error;
  std::vector<SweepRow> rows;
  for (const SweepPoint& p : SweepPoints("seq", base, 0, {16, 32}, {}, &error)) {
    for (const char* b : {"cpu", "naive"}) rows.push_back({p, b, Report{}});
  }
  const std::string csv = SweepCsv("seq", rows);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
  EXPECT_NE(csv.find("\nseq,T=32,naive,1,32,8,8,64,bf16,"), std::string::npos);
  const std::string table = FormatSweepTable("seq", rows);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 5);
  EXPECT_NE(table.find("TFLOP/s"), std::string::npos);
}

}  // namespace
}  // namespace attn::loadgen
