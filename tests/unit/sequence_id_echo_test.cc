// Echoes of client strings in protobuf string fields (issue 16 item 2): the sequence id quoted
// by INVALID_ARGUMENT and the result messages must be valid UTF-8, or the client cannot parse
// the response and loses the results of the steps that were applied (ExtendBatch with a good
// step and the id "a" x 63 + "é" gave INTERNAL "Exception deserializing response!").
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "validation/sequence_validator.h"

namespace attn {
namespace {

constexpr size_t kNoLimit = std::numeric_limits<size_t>::max();

TEST(Utf8SafeEcho, CutsAtACharacterBoundary) {
  const std::string id = std::string(63, 'a') + "\xc3\xa9";  // 65 bytes, é at 63..64
  EXPECT_EQ(Utf8SafeEcho(id, 64), std::string(63, 'a') + "... (65 bytes)");
  EXPECT_EQ(Utf8SafeEcho(id, 65), id);
  Status s = ValidateSequenceId(id);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "sequence_id: expected 32 lowercase hex digits, got \"" +
                             std::string(63, 'a') + "... (65 bytes)\"");
}

TEST(Utf8SafeEcho, EscapesEveryByteThatIsNotPartOfAValidCharacter) {
  EXPECT_EQ(Utf8SafeEcho("a\xff"
                         "b",
                         kNoLimit),
            "a\\xffb");
  EXPECT_EQ(Utf8SafeEcho("\xc0\xaf", kNoLimit), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(Utf8SafeEcho("\xed\xa0\x80", kNoLimit), "\\xed\\xa0\\x80");           // surrogate
  EXPECT_EQ(Utf8SafeEcho("x\xe2\x82", kNoLimit), "x\\xe2\\x82");                  // cut short
  EXPECT_EQ(Utf8SafeEcho("\xf4\x90\x80\x80", kNoLimit), "\\xf4\\x90\\x80\\x80");  // > U+10FFFF
  EXPECT_EQ(Utf8SafeEcho("\xe2\x82\xac \xf0\x9f\x98\x80", kNoLimit),
            "\xe2\x82\xac \xf0\x9f\x98\x80");  // € and an emoji stay
  // An escape is never split either.
  EXPECT_EQ(Utf8SafeEcho("ab\xff", 5), "ab... (3 bytes)");
}

TEST(Utf8SafeEcho, DuplicateIdInABatchIsQuotedSafely) {
  attention::v1::ExtendBatchRequest r;
  const std::string id = std::string(100, 'b') + "\xc3\xa9";
  for (int i = 0; i < 2; ++i) {
    auto *step = r.add_steps();
    step->set_sequence_id(id);
  }
  Status s = ValidateExtendBatch(r);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::string(64, 'b') + "... (102 bytes)"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace attn
