// --log-format json (common/logging.h): every line carries Cloud Logging's severity and message
// fields, so GKE files a line by its level rather than as ERROR for being on stderr.
#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

namespace attn {
namespace {

TEST(Logging, SeverityNamesAreCloudLoggings) {
  EXPECT_STREQ(SeverityName(spdlog::level::trace), "DEBUG");
  EXPECT_STREQ(SeverityName(spdlog::level::debug), "DEBUG");
  EXPECT_STREQ(SeverityName(spdlog::level::info), "INFO");
  EXPECT_STREQ(SeverityName(spdlog::level::warn), "WARNING");
  EXPECT_STREQ(SeverityName(spdlog::level::err), "ERROR");
  EXPECT_STREQ(SeverityName(spdlog::level::critical), "CRITICAL");
}

TEST(Logging, LineRateLimitAdmitsAtMostMaxPerWindowAndCountsTheRest) {
  using namespace std::chrono_literals;
  LineRateLimit limit(2, 10s);
  const auto t0 = LineRateLimit::Clock::time_point{} + 100s;
  int64_t left_out = -1;
  EXPECT_TRUE(limit.Admit(t0, &left_out));
  EXPECT_EQ(left_out, 0);
  EXPECT_TRUE(limit.Admit(t0 + 1s, &left_out));
  EXPECT_EQ(left_out, 0);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limit.Admit(t0 + 2s, &left_out)) << i;
  EXPECT_FALSE(limit.Admit(t0 + 9s, &left_out)) << "still the first window";
  EXPECT_TRUE(limit.Admit(t0 + 10s, &left_out)) << "a new window";
  EXPECT_EQ(left_out, 6) << "the admitted line says how many were left out";
  EXPECT_TRUE(limit.Admit(t0 + 11s, &left_out));
  EXPECT_EQ(left_out, 0);
}

TEST(Logging, JsonLinesCarrySeverityAndMessage) {
  testing::internal::CaptureStderr();
  ASSERT_TRUE(ConfigureLogging("trace", "json").ok());
  spdlog::trace("t0");
  spdlog::debug("d1");
  spdlog::info("i2 \"quoted\"\n");
  spdlog::warn("w3");
  spdlog::error("e4");
  spdlog::critical("c5");
  spdlog::default_logger()->flush();
  const std::string out = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(ConfigureLogging("info", "text").ok());  // leave the default for other tests
  std::istringstream in(out);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"DEBUG", "t0"},   {"DEBUG", "d1"}, {"INFO", "i2 \\\"quoted\\\"\\n"},
      {"WARNING", "w3"}, {"ERROR", "e4"}, {"CRITICAL", "c5"}};
  ASSERT_EQ(lines.size(), want.size()) << out;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string& line = lines[i];
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
    EXPECT_NE(line.find("\"severity\":\"" + want[i].first + "\""), std::string::npos) << line;
    EXPECT_NE(line.find("\"message\":\"" + want[i].second + "\"}"), std::string::npos) << line;
    EXPECT_NE(line.find("\"time\":\"20"), std::string::npos) << line;
    EXPECT_EQ(line.find("\"level\""), std::string::npos) << line;
    EXPECT_EQ(line.find("\"msg\""), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace attn
