// Unit tests of the authenticator (security/authenticator.h): bearer header parsing, and the
// identities a token reload revokes (a failed reload revokes nothing).
#include "security/authenticator.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace attn::security {
namespace {

constexpr char kTokA[] = "aaaaaaaaaaaaaaaa-token-A";
constexpr char kTokB[] = "bbbbbbbbbbbbbbbb-token-B";

TEST(Authenticator, BearerHeaderParsing) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer   abc"), "abc");
  EXPECT_EQ(BearerToken("BEARER abc"), "abc");
  EXPECT_EQ(BearerToken("Bearerabc"), "");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
  EXPECT_EQ(BearerToken("abc"), "");
}

// A reload reports the identities left without any token (issue 16 item 10): bob rotated his
// token (not revoked), alice lost hers; a failed reload revokes nothing.
TEST(Authenticator, ReloadListsTheIdentitiesThatLostTheirLastToken) {
  const std::string path = ::testing::TempDir() + "/attn_reload_tokens";
  std::ofstream(path) << "alice " << kTokA << "\nbob " << kTokB << "\n";
  auto auth = Authenticator::Create(path, false);
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  std::ofstream(path) << "bob cccccccccccccccc-token-C\n";
  std::vector<std::string> revoked;
  ASSERT_TRUE((*auth)->Reload(&revoked).ok());
  EXPECT_EQ(revoked, std::vector<std::string>{"alice"});
  std::ofstream(path) << "not a token file\n";
  revoked = {"x"};
  EXPECT_FALSE((*auth)->Reload(&revoked).ok());
  EXPECT_EQ(revoked, std::vector<std::string>{"x"});  // untouched on error
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attn::security
