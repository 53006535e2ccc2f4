// Size suffixes of the -bytes flags (config/byte_size.h) and their use on the command line and
// in ATTN_ variables.
#include "config/byte_size.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "config/server_flags.h"
#include "parse_captured.h"

namespace attn {
namespace {

TEST(ByteSize, PlainCountsAndBinarySuffixes) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"0", 0},
      {"1048576", 1048576},
      {"64K", 64 << 10},
      {"64k", 64 << 10},
      {"64KiB", 64 << 10},
      {"512M", 512ll << 20},
      {"512MiB", 512ll << 20},
      {"1G", 1ll << 30},
      {"1g", 1ll << 30},
      {"1GiB", 1ll << 30},
      {"1gib", 1ll << 30},
      {"2T", 2ll << 40},
      {"2TiB", 2ll << 40},
      {"9223372036854775807", 9223372036854775807ll},
  };
  for (const auto& [text, want] : cases) {
    int64_t got = -1;
    EXPECT_EQ(ParseByteSize(text, &got), "") << text;
    EXPECT_EQ(got, want) << text;
  }
}

TEST(ByteSize, BadSuffixesAndOverflowAreRefusedWithTheRule) {
  for (const std::string& bad :
       {"1GB", "1KB", "1X", "1 G", "1.5G", "-1", "G", "", "1Gi", "1e9", "0x10"}) {
    int64_t got = 7;
    const std::string error = ParseByteSize(bad, &got);
    EXPECT_NE(error, "") << bad;
    EXPECT_EQ(got, 7) << bad;
  }
  int64_t got = 0;
  EXPECT_NE(ParseByteSize("1GB", &got).find("K, M, G, T or KiB, MiB, GiB, TiB"), std::string::npos);
  EXPECT_NE(ParseByteSize("8388608T", &got).find("too large"), std::string::npos);  // 2^63
  EXPECT_NE(ParseByteSize("9223372036854775808", &got).find("too large"), std::string::npos);
  EXPECT_EQ(ParseByteSize("8388607T", &got), "");
  EXPECT_EQ(got, 8388607ll << 40);
}

// --help shows sizes in binary units that parse back as the same bytes.
TEST(ByteSize, HelpShowsBinaryUnitsThatParseBack) {
  for (int64_t b : {int64_t{0}, int64_t{1000}, int64_t{1} << 10, int64_t{1536} << 10,
                    int64_t{1} << 30, int64_t{16} << 40, int64_t{2147483647}}) {
    int64_t back = -1;
    EXPECT_EQ(ParseByteSize(ShowByteSize(b), &back), "") << ShowByteSize(b);
    EXPECT_EQ(back, b) << ShowByteSize(b);
  }
  EXPECT_EQ(ShowByteSize(int64_t{1} << 30), "1GiB");
  EXPECT_EQ(ShowByteSize(int64_t{1536} << 10), "1536KiB");
  EXPECT_EQ(ShowByteSize(1000), "1000");
  ServerConfig probe;
  CLI::App app;
  AddServerFlags(app, &probe);
  const std::string help = app.help();
  EXPECT_NE(help.find("--kv-cache-bytes SIZE:in [64KiB - 16TiB]=1GiB"), std::string::npos) << help;
  EXPECT_EQ(help.find("=1.07374e+09"), std::string::npos) << help;  // the default in full
  EXPECT_NE(help.find("=1073741824"), std::string::npos) << help;
}

TEST(ByteSize, EveryBytesFlagTakesSuffixes) {
  ServerConfig probe;
  CLI::App app;
  AddServerFlags(app, &probe);
  int bytes_flags = 0;
  for (CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_lnames().empty() ? "" : opt->get_lnames().front();
    if (name.size() < 6 || name.substr(name.size() - 6) != "-bytes") continue;
    ++bytes_flags;
    ServerConfig c;
    std::string out;
    EXPECT_EQ(ParseCaptured({"--" + name, "1G"}, &c, &out), -1) << name << ": " << out;
    EXPECT_NE(ParseCaptured({"--" + name, "1GB"}, &c, &out), -1) << name;
    EXPECT_NE(out.find("unknown size suffix \"GB\""), std::string::npos) << name << ": " << out;
  }
  EXPECT_GE(bytes_flags, 9);
  ServerConfig c;
  std::string out;
  ASSERT_EQ(ParseCaptured({"--kv-cache-bytes", "1G", "--max-message-bytes", "64MiB",
                           "--replay-cache-bytes=512m", "--grpc-memory-bytes", "2147483648"},
                          &c, &out),
            -1)
      << out;
  EXPECT_EQ(c.kv_cache_bytes, 1ll << 30);
  EXPECT_EQ(c.max_message_bytes, 64ll << 20);
  EXPECT_EQ(c.replay_cache_bytes, 512ll << 20);
  EXPECT_EQ(c.grpc_memory_bytes, 2ll << 30);
  // The range check sees the converted count: 2T is over --max-message-bytes' 2^31-1.
  EXPECT_NE(ParseCaptured({"--max-message-bytes", "2T"}, &c, &out), -1);
  setenv("ATTN_KV_CACHE_BYTES", "256MiB", 1);
  ServerConfig e;
  EXPECT_EQ(ParseCaptured({}, &e, &out), -1) << out;
  unsetenv("ATTN_KV_CACHE_BYTES");
  EXPECT_EQ(e.kv_cache_bytes, 256ll << 20);
}

}  // namespace
}  // namespace attn
