// The loadgen report's derived numbers on synthetic samples where the answer is known: achieved
// TFLOP/s under server batching (each launch's kernel time counted once), the open-loop rate
// warning, the interrupted fields; and the sweep's backend check and failed-point CSV cells.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loadgen/report.h"
#include "loadgen/sweep.h"

namespace attn::loadgen {
namespace {

// One OK sample that ran in a launch of `batch` calls taking `kernel_us` in all.
Sample Batched(int64_t index, double flops, int64_t kernel_us, int64_t batch) {
  Sample s;
  s.index = index;
  s.latency_ms = 1;
  s.flops = flops;
  s.phase_us[3] = kernel_us;  // kernel_us: the whole launch's
  s.batch_size = batch;
  return s;
}

TEST(ClientReportTflops, EachLaunchKernelTimeCountsOnce) {
  // Launch A: 4 calls of 1e9 flops in 1000 us. Launch B: 2 calls of 3e9 flops in 2000 us.
  // The device did 4e9 + 6e9 = 1e10 flops in 3000 us of kernels: 3.333 TFLOP/s. Summing every
  // call's kernel_us (4x1000 + 2x2000 = 8000 us) would give 1.25 TFLOP/s.
  std::vector<Sample> samples;
  for (int i = 0; i < 4; ++i) samples.push_back(Batched(i, 1e9, 1000, 4));
  for (int i = 4; i < 6; ++i) samples.push_back(Batched(i, 3e9, 2000, 2));
  const Report r = BuildReport(RunInfo{}, samples, 1.0);
  EXPECT_DOUBLE_EQ(r.flops, 1e10);
  EXPECT_NEAR(r.kernel_s, 3000e-6, 1e-12);
  EXPECT_NEAR(r.tflops, 1e10 / 3000e-6 / 1e12, 1e-9);
}

TEST(ClientReportTflops, UnbatchedAndUnknownBatchSizeAreOneLaunchEach) {
  // batch_size 1 and 0 (a server that does not report it) both count the call's own kernel.
  const Report r =
      BuildReport(RunInfo{}, {Batched(0, 2e9, 1000, 1), Batched(1, 2e9, 1000, 0)}, 1.0);
  EXPECT_NEAR(r.kernel_s, 2000e-6, 1e-12);
  EXPECT_NEAR(r.tflops, 2.0, 1e-9);
}

TEST(ClientReportTflops, FailedCallsDoNotCount) {
  Sample bad = Batched(1, 5e9, 5000, 1);
  bad.status = "UNAVAILABLE";
  const Report r = BuildReport(RunInfo{}, {Batched(0, 1e9, 1000, 1), bad}, 1.0);
  EXPECT_NEAR(r.tflops, 1.0, 1e-9);
}

// `n` OK samples answered every `gap_s` seconds.
std::vector<Sample> OkSamples(int n, double gap_s = 0.01) {
  std::vector<Sample> samples;
  for (int i = 0; i < n; ++i) {
    samples.push_back(Batched(i, 1e6, 10, 1));
    samples.back().done_s = 0.1 + i * gap_s;
  }
  return samples;
}

TEST(ClientReportRate, OpenLoopBelowOfferedRateWarns) {
  RunInfo info;
  info.mode = "open";
  info.rate = 50;
  const Report r = BuildReport(info, OkSamples(41, 0.05), 2.1);  // answers 20/s
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("offered 50.0/s, achieved 20.0/s"), std::string::npos)
      << r.warnings[0];
  EXPECT_NE(FormatReport(r).find("WARNING"), std::string::npos);
  const nlohmann::json j = ReportToJson(r);
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_EQ(j["warnings"][0], r.warnings[0]);
}

TEST(ClientReportRate, NoWarningWithinTenPercentClosedLoopOrTooFewCalls) {
  RunInfo info;
  info.mode = "open";
  info.rate = 50;
  // 46/s: within 10 %.
  EXPECT_TRUE(BuildReport(info, OkSamples(47, 1.0 / 46), 1.1).warnings.empty());
  EXPECT_TRUE(BuildReport(info, OkSamples(5, 0.5), 2.1).warnings.empty());  // too few to judge
  // The Poisson draw offered only 20/s (40 gaps over 2 s of schedule): answering at 20/s kept up.
  info.schedule_s = 2.0;
  EXPECT_TRUE(BuildReport(info, OkSamples(41, 0.05), 2.1).warnings.empty());
  info.schedule_s = 0;
  info.mode = "closed";
  EXPECT_TRUE(BuildReport(info, OkSamples(41, 0.05), 2.1).warnings.empty());
  EXPECT_TRUE(ReportToJson(BuildReport(info, OkSamples(41, 0.05), 2.1))["warnings"].empty());
}

TEST(ClientReportInterrupt, CancelledCallsAreNotCompletedAndJsonSaysInterrupted) {
  RunInfo info;
  info.planned = 100;
  info.interrupted_by = "SIGINT";
  std::vector<Sample> samples = OkSamples(7);
  Sample cancelled;
  cancelled.status = "CANCELLED";
  samples.push_back(cancelled);
  const Report r = BuildReport(info, samples, 1.0);
  EXPECT_EQ(r.sent, 8);
  EXPECT_EQ(r.completed, 7);
  const nlohmann::json j = ReportToJson(r);
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_EQ(j["interrupted_by"], "SIGINT");
  EXPECT_EQ(j["requests"]["planned"], 100);
  EXPECT_EQ(j["requests"]["completed"], 7);
  EXPECT_NE(FormatReport(r).find("INTERRUPTED         by SIGINT: partial report; planned 100 "
                                 "requests, completed 7"),
            std::string::npos)
      << FormatReport(r);
  EXPECT_EQ(ReportToJson(BuildReport(RunInfo{}, samples, 1.0))["interrupted"], false);
}

attention::v1::GetServerInfoResponse Server() {
  attention::v1::GetServerInfoResponse info;
  auto* cpu = info.add_backends();
  cpu->set_name("cpu");
  cpu->set_available(true);
  auto* fused = info.add_backends();
  fused->set_name("fused");
  fused->set_available(false);
  fused->set_unavailable_reason("no GPU");
  return info;
}

TEST(ClientSweepBackends, MissingOrUnavailableBackendIsNamed) {
  EXPECT_EQ(CheckSweepBackends(Server(), {"cpu", "auto", ""}), "");
  const std::string missing = CheckSweepBackends(Server(), {"cpu", "nosuch"});
  EXPECT_NE(missing.find("'nosuch' is not on the server"), std::string::npos) << missing;
  EXPECT_NE(missing.find("available: cpu, auto"), std::string::npos) << missing;
  const std::string off = CheckSweepBackends(Server(), {"fused"});
  EXPECT_NE(off.find("'fused' is not available on this server (no GPU)"), std::string::npos) << off;
}

TEST(ClientSweepCsv, FailedPointHasEmptyCellsAndAnError) {
  ModelShape base;
  std::string error;
  const std::vector<SweepPoint> points = SweepPoints("seq", base, 0, {16}, {}, &error);
  ASSERT_EQ(points.size(), 1u);
  Sample bad;
  bad.status = "FAILED_PRECONDITION";
  bad.error_message = "cannot run";
  std::vector<SweepRow> rows = {{points[0], "cpu", BuildReport(RunInfo{}, {bad}, 1.0)},
                                {points[0], "ok", BuildReport(RunInfo{}, OkSamples(2), 1.0)}};
  const std::string csv = SweepCsv("seq", rows);
  EXPECT_NE(csv.find(",error\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\nseq,T=16,cpu,1,16,8,8,64,bf16,1,0,1,,,,,,"
                     "FAILED_PRECONDITION: cannot run\n"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find("\nseq,T=16,ok,1,16,8,8,64,bf16,2,2,0,1,1,1,2,"), std::string::npos) << csv;
  const std::string table = FormatSweepTable("seq", rows);
  EXPECT_NE(table.find("n/a"), std::string::npos) << table;
}

TEST(ClientSweepTitle, NamesDeviceBackendsShapeAndDate) {
  attention::v1::GetServerInfoResponse info = Server();
  info.set_device_name("NVIDIA H200");
  info.set_version("1.2.3");
  ModelShape base;
  const std::string t = SweepTitle("seq", info, base, 256, "cpu,fused", "2026-12-02 00:30 UTC");
  for (const char* part :
       {"seq", "NVIDIA H200", "cpu,fused", "N=8", "H=64", "bf16", "2026-12-02 00:30 UTC"}) {
    EXPECT_NE(t.find(part), std::string::npos) << part << " not in " << t;
  }
  EXPECT_EQ(t.find("T=256"), std::string::npos) << t;  // the seq sweep varies T
  const std::string b = SweepTitle("batch", info, base, 256, "cpu", "d");
  EXPECT_NE(b.find("T=256 N=8 K=8"), std::string::npos) << b;
  EXPECT_EQ(b.find("B="), std::string::npos) << b;  // the batch sweep varies B
}

}  // namespace
}  // namespace attn::loadgen
