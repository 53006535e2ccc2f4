// The session workload's progress line and verification line (client/loadgen): decode steps
// and errors recorded through SessionStats reach the Progress line with their unit; a run
// without verification says "off" rather than "verified 0 outputs, 0 mismatches"; a step the
// server ran without device timing (PhaseTimes.device_untimed) counts toward the batch's wall
// time but not toward the kernel, copy or own-time columns.
#include <gtest/gtest.h>

#include <string>

#include "loadgen/progress.h"
#include "loadgen/session_report.h"
#include "loadgen/session_stats.h"

namespace attn::loadgen {
namespace {

TEST(SessionProgress, StepsAndErrorsReachTheLineWithTheirUnit) {
  Progress progress(/*enabled=*/false, stderr, "decode steps");  // Line() only, no printer
  SessionStats st;
  st.progress = &progress;
  st.StepDone(2000);
  st.StepDone(4000);
  st.Error(grpc::StatusCode::UNAVAILABLE, "Extend", "gone");
  const std::string line = progress.Line();
  EXPECT_NE(line.find("done 3 decode steps"), std::string::npos) << line;
  EXPECT_NE(line.find("errors 1"), std::string::npos) << line;
  EXPECT_EQ(st.step_us.count(), 2);  // the histograms still get every step
  SessionStats quiet;                // no progress sink: steps are only recorded
  quiet.StepDone(10);
  EXPECT_EQ(quiet.step_us.count(), 1);
}

TEST(SessionStatsServer, UntimedStepsCountOnlyTowardTheBatchWallTime) {
  SessionStats st;
  attention::v1::ExecutionReport timed;
  timed.set_batch_size(1);
  timed.mutable_times()->set_batch_us(90);
  timed.mutable_times()->set_batch_kernel_us(16);
  timed.mutable_times()->set_host_to_device_us(3);
  attention::v1::ExecutionReport untimed = timed;
  untimed.mutable_times()->set_batch_kernel_us(0);
  untimed.mutable_times()->set_host_to_device_us(0);
  untimed.mutable_times()->set_device_untimed(true);
  st.Server(timed, /*prefill=*/false);
  st.Server(untimed, /*prefill=*/false);
  st.Server(untimed, /*prefill=*/false);
  EXPECT_EQ(st.server_batch_us.count(), 3);
  EXPECT_EQ(st.server_batch_kernel_us.count(), 1);  // the timed step only, not two zeros
  EXPECT_EQ(st.server_overhead_us.count(), 1);
  EXPECT_EQ(st.server_copy_us.count(), 1);
  EXPECT_EQ(st.server_total_us.count(), 3);
}

TEST(SessionProgress, VerificationOffIsSaidSo) {
  SessionReport off;
  off.verify_fraction = 0;
  const std::string text = FormatSessionReport(off);
  EXPECT_NE(text.find("verification           off"), std::string::npos) << text;
  EXPECT_EQ(text.find("verified "), std::string::npos) << text;
  SessionReport on;
  on.verify_fraction = 0.5;
  on.verified = 7;
  EXPECT_NE(FormatSessionReport(on).find("verified               7 outputs"), std::string::npos);
}

}  // namespace
}  // namespace attn::loadgen
