// Unit tests of the bearer-token file (security/token_table.h): identities, tokens, comments
// and blank lines; malformed files refused naming the line, never the token; the constant-time
// lookup refuses prefixes, longer strings and identities.
#include "security/token_table.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace attn::security {
namespace {

constexpr char kTokA[] = "aaaaaaaaaaaaaaaa-token-A";
constexpr char kTokB[] = "bbbbbbbbbbbbbbbb-token-B";

TEST(TokenTable, ParsesIdentitiesTokensCommentsAndBlankLines) {
  const std::string text = std::string("# comment\n\n  alice ") + kTokA + "\n\tbob\t" + kTokB +
                           "\r\nalice second-token-for-alice\n   # indented comment";
  auto t = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 3u);
  EXPECT_EQ(t->Find(kTokA), std::optional<std::string>("alice"));
  EXPECT_EQ(t->Find(kTokB), std::optional<std::string>("bob"));
  EXPECT_EQ(t->Find("second-token-for-alice"), std::optional<std::string>("alice"));
  EXPECT_EQ(t->Identities(), (std::vector<std::string>{"alice", "bob"}));
  EXPECT_FALSE(t->Find("").has_value());
  EXPECT_FALSE(t->Find(std::string(kTokA).substr(0, 20)).has_value());  // a prefix
  EXPECT_FALSE(t->Find(std::string(kTokA) + "x").has_value());          // longer
  EXPECT_FALSE(t->Find("alice").has_value());                           // an identity
}

TEST(TokenTable, RejectsMalformedFilesNamingTheLineNeverTheToken) {
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"alice\n", "f:1: expected \"identity token\", got 1 fields"},
      {"# c\nalice tok-0123456789abcdef extra\n", "f:2: expected \"identity token\", got 3"},
      {"alice secret-short\n", "f:1: token must be 16..4096"},
      {"al ice-has-space tok-0123456789abcdef\n", "f:1: expected"},
      {"al*ce tok-0123456789abcdef\n", "f:1: identity must be"},
      {"a tok-0123456789abcdef\nb tok-0123456789abcdef\n", "f:2: this token already appears"},
      {"# only comments\n\n", "f: holds no token"},
      {"", "f: holds no token"},
  };
  for (const Case& c : cases) {
    auto t = TokenTable::Parse(c.text, "f");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find("secret-short"), std::string::npos);
    EXPECT_EQ(t.status().message().find("tok-0123"), std::string::npos);
  }
  EXPECT_FALSE(TokenTable::Load("/nonexistent/tokens").ok());
}

}  // namespace
}  // namespace attn::security
