#include <gtest/gtest.h>

#include <sstream>

#include "loadgen/trace.h"

namespace attn::loadgen {
namespace {

TEST(ClientTrace, TimestampHasFractionalSeconds) {
  double t0 = 0, t1 = 0;
  ASSERT_TRUE(ParseAzureTimestamp("2023-11-16 18:17:03.9799600", &t0));
  ASSERT_TRUE(ParseAzureTimestamp("2023-11-16 18:17:04.0319600", &t1));
  EXPECT_NEAR(t1 - t0, 0.052, 1e-6);
  // 2023-11-16 00:00:00 UTC is 1700092800 s after the epoch.
  EXPECT_NEAR(t0, 1700092800.0 + 18 * 3600 + 17 * 60 + 3.97996, 1e-6);
  double t2 = 0;
  ASSERT_TRUE(ParseAzureTimestamp("2023-11-16 18:17:03", &t2));
  EXPECT_NEAR(t0 - t2, 0.97996, 1e-6);
}

TEST(ClientTrace, MalformedTimestamps) {
  double t = 0;
  EXPECT_FALSE(ParseAzureTimestamp("", &t));
  EXPECT_FALSE(ParseAzureTimestamp("2023-11-16", &t));
  EXPECT_FALSE(ParseAzureTimestamp("2023-13-16 18:17:03.1", &t));
  EXPECT_FALSE(ParseAzureTimestamp("2023-11-16 18:17:03.", &t));
  EXPECT_FALSE(ParseAzureTimestamp("2023-11-16 18:17:03.12x", &t));
}

TEST(ClientTrace, ParsesCsvWithCrLfAndNoFinalNewline) {
  std::istringstream in(
      "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
      "2023-11-16 18:15:46.6805900,374,44\r\n"
      "2023-11-16 18:15:50.9951690,396,109");
  std::vector<TraceRecord> rows;
  std::string error;
  ASSERT_TRUE(ParseAzureCsv(in, &rows, &error)) << error;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].context_tokens, 374);
  EXPECT_EQ(rows[0].generated_tokens, 44);
  EXPECT_EQ(rows[1].context_tokens, 396);
  EXPECT_NEAR(rows[1].time_s - rows[0].time_s, 4.314579, 1e-6);
}

TEST(ClientTrace, MalformedLineIsAnErrorNamingTheLine) {
  std::vector<TraceRecord> rows;
  std::string error;
  std::istringstream bad_count(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
      "2023-11-16 18:15:47.00,abc,1\n");
  EXPECT_FALSE(ParseAzureCsv(bad_count, &rows, &error));
  EXPECT_NE(error.find("line 3"), std::string::npos) << error;

  std::istringstream missing_field(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374\n");
  EXPECT_FALSE(ParseAzureCsv(missing_field, &rows, &error));
  EXPECT_NE(error.find("line 2"), std::string::npos) << error;

  std::istringstream bad_header("time,ctx,gen\n2023-11-16 18:15:46.68,374,44\n");
  EXPECT_FALSE(ParseAzureCsv(bad_header, &rows, &error));
  EXPECT_NE(error.find("header"), std::string::npos) << error;
}

TEST(ClientTrace, ReadsTheShippedAzureTraces) {
  std::vector<TraceRecord> conv, code;
  std::string error;
  ASSERT_TRUE(ReadTrace(ATTN_CLIENT_DATA_DIR "/AzureLLMInferenceTrace_conv.csv", &conv, &error))
      << error;
  ASSERT_TRUE(ReadTrace(ATTN_CLIENT_DATA_DIR "/AzureLLMInferenceTrace_code.csv", &code, &error))
      << error;
  EXPECT_EQ(conv.size(), 19366u);
  EXPECT_EQ(code.size(), 8819u);
  EXPECT_EQ(conv.front().context_tokens, 374);
  EXPECT_EQ(conv.front().generated_tokens, 44);
  EXPECT_EQ(conv.back().context_tokens, 197);  // 2023-11-16 19:14:08.4025270,197,183
  EXPECT_EQ(conv.back().generated_tokens, 183);
  EXPECT_NEAR(conv[1].time_s - conv[0].time_s, 4.314579, 1e-6);
  // The conv trace spans 18:15:46.68059 to 19:14:08.402527.
  EXPECT_NEAR(conv.back().time_s - conv.front().time_s, 3501.721937, 1e-5);
  for (size_t i = 1; i < conv.size(); ++i) ASSERT_GE(conv[i].time_s, conv[i - 1].time_s) << i;
}

TEST(ClientTrace, ReadsTheShippedMooncakeTrace) {
  std::vector<TraceRecord> rows;
  std::string error;
  ASSERT_TRUE(ReadTrace(ATTN_CLIENT_DATA_DIR "/conversation_trace.jsonl", &rows, &error)) << error;
  EXPECT_EQ(rows.size(), 12031u);
  EXPECT_EQ(rows[0].context_tokens, 6758);
  EXPECT_EQ(rows[0].generated_tokens, 500);
  EXPECT_DOUBLE_EQ(rows[0].time_s, 0.0);
}

TEST(ClientTrace, MissingFileIsAnError) {
  std::vector<TraceRecord> rows;
  std::string error;
  EXPECT_FALSE(ReadTrace("/nonexistent/trace.csv", &rows, &error));
  EXPECT_NE(error.find("/nonexistent/trace.csv"), std::string::npos);
}

}  // namespace
}  // namespace attn::loadgen
