// config/memory_limit: the cgroup/meminfo parsers and the default gRPC transport quota.
#include "config/memory_limit.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "config/server_config.h"
#include "config/server_flags.h"

namespace attn {
namespace {

TEST(MemoryLimitTest, CgroupV2AndV1Limits) {
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), -1);
  EXPECT_EQ(ParseCgroupMemoryLimit("25769803776\n"), 25769803776);  // 24 GiB (v2)
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), -1);   // v1 "unlimited"
  EXPECT_EQ(ParseCgroupMemoryLimit(""), -1);                        // file absent
  EXPECT_EQ(ParseCgroupMemoryLimit("12x"), -1);
  EXPECT_EQ(ParseCgroupMemoryLimit("0"), -1);
}

TEST(MemoryLimitTest, MemTotal) {
  EXPECT_EQ(ParseMemTotal("MemTotal:       131072000 kB\nMemFree:  10 kB\n"),
            int64_t{131072000} * 1024);
  EXPECT_EQ(ParseMemTotal("MemFree:  10 kB\n"), -1);
  EXPECT_EQ(ParseMemTotal("MemTotal: lots\n"), -1);
}

TEST(MemoryLimitTest, DefaultQuotaIsAQuarterWithFloors) {
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(DefaultGrpcMemoryBytes(128 * gib, 256 << 20), 32 * gib);
  EXPECT_EQ(DefaultGrpcMemoryBytes(2 * gib, 256 << 20), gib);   // never below 1 GiB
  EXPECT_EQ(DefaultGrpcMemoryBytes(-1, 256 << 20), gib);        // unknown memory
  EXPECT_EQ(DefaultGrpcMemoryBytes(8 * gib, gib), 2 * gib);     // the largest request fits
  // A host of 23.54 GiB (this CI machine's MemTotal): 5 GiB, shown as "5GiB" in --help.
  EXPECT_EQ(DefaultGrpcMemoryBytes(24683664 * int64_t{1024}, 256 << 20), 5 * gib);
  EXPECT_EQ(DefaultGrpcMemoryBytes(10 * gib + 12345, 256 << 20), 2560 * (int64_t{1} << 20));
}

TEST(MemoryLimitTest, ThisProcessHasALimitAndTheFlagDefaultFollowsIt) {
  const int64_t limit = ProcessMemoryLimit();
  ASSERT_GT(limit, 0) << "/proc/meminfo unreadable";
  ServerConfig c;
  char prog[] = "attention-server";
  char* argv[] = {prog};
  ASSERT_EQ(ParseServerFlags(1, argv, &c), -1);
  EXPECT_EQ(c.grpc_memory_bytes, DefaultGrpcMemoryBytes(limit, c.max_message_bytes));
  // A larger --max-message-bytes raises the default with it (was: the server exited 2).
  ServerConfig big;
  char flag[] = "--max-message-bytes=2000000000";
  char* argv2[] = {prog, flag};
  ASSERT_EQ(ParseServerFlags(2, argv2, &big), -1);
  EXPECT_GE(big.grpc_memory_bytes, 2 * big.max_message_bytes);
  // Given explicitly, it is kept.
  ServerConfig given;
  char q[] = "--grpc-memory-bytes=3G";
  char* argv3[] = {prog, q};
  ASSERT_EQ(ParseServerFlags(2, argv3, &given), -1);
  EXPECT_EQ(given.grpc_memory_bytes, 3 * (int64_t{1} << 30));
  // Given through its ATTN_ variable, it is kept too.
  ::setenv("ATTN_GRPC_MEMORY_BYTES", "5G", 1);
  ServerConfig from_env;
  const int parsed = ParseServerFlags(1, argv, &from_env);
  ::unsetenv("ATTN_GRPC_MEMORY_BYTES");
  ASSERT_EQ(parsed, -1);
  EXPECT_EQ(from_env.grpc_memory_bytes, 5 * (int64_t{1} << 30));
}

}  // namespace
}  // namespace attn
