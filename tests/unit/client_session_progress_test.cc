// The session workload's progress line and verification line (client/loadgen): decode steps
// and errors recorded through SessionStats reach the Progress line with their unit; a run
// without verification says "off" rather than "verified 0 outputs, 0 mismatches".
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
