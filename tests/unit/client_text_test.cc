// Echoes of client text in error messages are bounded and never split a UTF-8 character
// (issue 16 item 7): the helper itself, and its users (shape, backend name, duplicate id).
#include "common/client_text.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "attention/v1/sequence.pb.h"
#include "backends/backend_registry.h"
#include "validation/attend_validator.h"
#include "validation/sequence_validator.h"

namespace attn {
namespace {

// True when `s` is well-formed UTF-8 (no cut character at its end).
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

TEST(ClientText, ShortTextIsUnchanged) {
  EXPECT_EQ(EchoClientText("cpu"), "cpu");
  EXPECT_EQ(CapStatusMessage("short"), "short");
}

TEST(ClientText, CutNeverSplitsACharacter) {
  // "a"×63 + "é" (2 bytes) + 4-byte characters: every cut point from 60 to 70 bytes.
  const std::string s = std::string(63, 'a') + "\xC3\xA9" + "\xF0\x9F\x98\x80\xF0\x9F\x98\x80";
  for (size_t max = 60; max <= 70; ++max) {
    const size_t n = Utf8PrefixLength(s, max);
    EXPECT_LE(n, max);
    EXPECT_GE(n + 3, max) << "cut more than one character at " << max;
    EXPECT_TRUE(ValidUtf8(s.substr(0, n))) << "cut at " << max;
  }
  const std::string echo = EchoClientText(s, 64);
  EXPECT_EQ(echo, std::string(63, 'a') + "...(73 bytes)");
}

TEST(ClientText, LongTextIsCutAndNamesItsLength) {
  const std::string big(20000, 'x');
  const std::string echo = EchoClientText(big);
  EXPECT_LE(echo.size(), kMaxEchoBytes + 32);
  EXPECT_NE(echo.find("(20000 bytes)"), std::string::npos) << echo;
  std::string many;
  for (int i = 0; i < 3000; ++i) many += "\xE2\x82\xAC";
  const std::string capped = CapStatusMessage(many);
  EXPECT_LE(capped.size(), kMaxStatusMessageBytes);
  EXPECT_TRUE(ValidUtf8(capped));
}

TEST(ClientText, ListShowsTheFirstEntriesAndTheCount) {
  EXPECT_EQ(EchoList(3, [](int64_t i) { return i; }), "[0,1,2]");
  EXPECT_EQ(EchoList(
                5000, [](int64_t) { return 1; }, 4),
            "[1,1,1,1,...] (5000 entries)");
}

TEST(ClientText, ValidatorEchoesAreBounded) {
  // A q shape with 5,000 entries: INVALID_ARGUMENT with a short message.
  attention::v1::AttendRequest r;
  for (int i = 0; i < 5000; ++i) r.mutable_q()->add_shape(1);
  r.mutable_q()->set_dtype(attention::v1::FLOAT32);
  auto v = ValidateAttend(r);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_LT(v.status().message().size(), 512u) << v.status().message().substr(0, 512);
  EXPECT_NE(v.status().message().find("5000 entries"), std::string::npos);

  // A 200 KB duplicate sequence id in ExtendBatch.
  attention::v1::ExtendBatchRequest batch;
  const std::string id(200000, 'f');
  batch.add_steps()->set_sequence_id(id);
  batch.add_steps()->set_sequence_id(id);
  const Status b = ValidateExtendBatch(batch);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.code(), StatusCode::kInvalidArgument);
  EXPECT_LT(b.message().size(), 512u);
  EXPECT_NE(b.message().find("(200000 bytes)"), std::string::npos);

  // A 20 KB backend name.
  BackendRegistry registry;
  auto c = registry.Resolve(std::string(20000, 'n'), "auto", kernels::AttentionShape{});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_LT(c.status().message().size(), 512u);
  EXPECT_NE(c.status().message().find("(20000 bytes)"), std::string::npos);
}

TEST(ClientText, EchoFloatKeepsTinyAndSpecialValues) {
  EXPECT_EQ(EchoFloat(-1e-10f), "-1.00000001e-10");  // std::to_string: "-0.000000"
  EXPECT_EQ(EchoFloat(0.5), "0.5");
  EXPECT_EQ(EchoFloat(3e38), "3e+38");
  EXPECT_EQ(EchoFloat(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(EchoFloat(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_NE(EchoFloat(std::numeric_limits<double>::quiet_NaN()).find("nan"), std::string::npos);
}

}  // namespace
}  // namespace attn
