// attention-server's flags (config/server_flags.h): the grouped --help screen, errors for bad
// values that came from ATTN_ variables, the variables that are meaningful when set but empty,
// connection age, replica tag, non-finite numbers, every flag's ATTN_ variable (the command line
// wins), the advertise address, and exit 2 for a bad flag.
#include "config/server_flags.h"
#include "parse_captured.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "config/flag_groups.h"

namespace attn {
namespace {

TEST(ServerFlagsHelp, IsGroupedAndListsEveryFlag) {
  ServerConfig c;
  std::string help;
  ASSERT_EQ(ParseCaptured({"--help"}, &c, &help), 0);
  for (const std::string& group : ServerFlagGroups()) {
    EXPECT_NE(help.find("\n" + group + ":\n"), std::string::npos) << group << "\n" << help;
  }
  EXPECT_EQ(help.find("\nOptions:\n"), std::string::npos) << "a flag without a group\n" << help;
  ServerConfig probe;
  CLI::App app;
  AddServerFlags(app, &probe);
  int listed = 0;
  for (CLI::Option* opt : app.get_options()) {
    ASSERT_FALSE(opt->get_lnames().empty());
    const std::string flag = "--" + opt->get_lnames().front();
    if (opt->get_group().empty()) {  // hidden on purpose (tests only)
      EXPECT_EQ(help.find(flag), std::string::npos) << flag;
      continue;
    }
    EXPECT_NE(opt->get_group(), "Options") << flag << " has no group";
    EXPECT_NE(help.find(flag + " "), std::string::npos) << flag;
    ++listed;
  }
  EXPECT_GE(listed, 55);
  EXPECT_NE(help.find("--kv-cache-bytes SIZE"), std::string::npos) << help;
}

TEST(ServerFlagsEnv, BadValueFromAVariableNamesTheVariable) {
  setenv("ATTN_KV_CACHE_BYTES", "12", 1);  // below the range's 64 KiB
  ServerConfig c;
  std::string out;
  EXPECT_GT(ParseCaptured({}, &c, &out), 0);
  EXPECT_NE(out.find("environment variable ATTN_KV_CACHE_BYTES=12 (for --kv-cache-bytes)"),
            std::string::npos)
      << out;
  // The same value on the command line: the flag is to blame, not the variable.
  EXPECT_GT(ParseCaptured({"--kv-cache-bytes", "13"}, &c, &out), 0);
  EXPECT_EQ(out.find("ATTN_KV_CACHE_BYTES"), std::string::npos) << out;
  EXPECT_NE(out.find("--kv-cache-bytes"), std::string::npos) << out;
  // A good command-line value wins over the bad variable.
  EXPECT_EQ(ParseCaptured({"--kv-cache-bytes=1G"}, &c, &out), -1) << out;
  unsetenv("ATTN_KV_CACHE_BYTES");
  setenv("ATTN_LOG_FORMAT", "yaml", 1);  // not one of text, json
  EXPECT_GT(ParseCaptured({}, &c, &out), 0);
  unsetenv("ATTN_LOG_FORMAT");
  EXPECT_NE(out.find("environment variable ATTN_LOG_FORMAT=yaml (for --log-format)"),
            std::string::npos)
      << out;
  setenv("ATTN_MAX_QUEUE_REQUESTS", "lots", 1);  // not a number
  EXPECT_GT(ParseCaptured({}, &c, &out), 0);
  unsetenv("ATTN_MAX_QUEUE_REQUESTS");
  EXPECT_NE(out.find("ATTN_MAX_QUEUE_REQUESTS=lots"), std::string::npos) << out;
}

TEST(ServerFlagsEnv, EmptyMetricsAddressVariableDisablesMetrics) {
  ServerConfig d;
  std::string out;
  ASSERT_EQ(ParseCaptured({}, &d, &out), -1) << out;
  EXPECT_FALSE(d.metrics_address.empty());  // on by default
  EXPECT_FALSE(d.cudnn_warmup.empty());
  setenv("ATTN_METRICS_ADDRESS", "", 1);
  setenv("ATTN_CUDNN_WARMUP", "", 1);
  ServerConfig c;
  ASSERT_EQ(ParseCaptured({}, &c, &out), -1) << out;
  EXPECT_EQ(c.metrics_address, "");
  EXPECT_FALSE(c.metrics_address_given);
  EXPECT_EQ(c.cudnn_warmup, "");
  // The command line still wins over the empty variable.
  ServerConfig f;
  ASSERT_EQ(ParseCaptured({"--metrics-address", "127.0.0.1:0"}, &f, &out), -1) << out;
  unsetenv("ATTN_METRICS_ADDRESS");
  unsetenv("ATTN_CUDNN_WARMUP");
  EXPECT_EQ(f.metrics_address, "127.0.0.1:0");
  EXPECT_TRUE(f.metrics_address_given);
}

TEST(ServerFlagsBatchStream, MaxBatchesInFlightDefaultsToFourWithinOneTo1024) {
  ServerConfig d;
  std::string out;
  ASSERT_EQ(ParseCaptured({}, &d, &out), -1) << out;
  EXPECT_EQ(d.max_batches_in_flight, 4);  // sequence.proto: default 4
  ServerConfig c;
  ASSERT_EQ(ParseCaptured({"--max-batches-in-flight", "16"}, &c, &out), -1) << out;
  EXPECT_EQ(c.max_batches_in_flight, 16);
  for (const char *bad : {"0", "1025", "x"}) {
    ServerConfig e;
    EXPECT_GT(ParseCaptured({"--max-batches-in-flight", bad}, &e, &out), 0) << bad;
    EXPECT_NE(out.find("--max-batches-in-flight"), std::string::npos) << out;
  }
}

TEST(ServerFlagsKvTiming, TimesOneGraphTripInSixteenByDefaultWithinOneTo2To20) {
  ServerConfig d;
  std::string out;
  ASSERT_EQ(ParseCaptured({}, &d, &out), -1) << out;
  EXPECT_EQ(d.kv_timing_every, 16);
  ServerConfig c;
  ASSERT_EQ(ParseCaptured({"--kv-timing-every", "1"}, &c, &out), -1) << out;
  EXPECT_EQ(c.kv_timing_every, 1);  // every trip timed, as before the flag
  for (const char *bad : {"0", "-3", "1048577", "x"}) {
    ServerConfig e;
    EXPECT_GT(ParseCaptured({"--kv-timing-every", bad}, &e, &out), 0) << bad;
    EXPECT_NE(out.find("--kv-timing-every"), std::string::npos) << out;
  }
}

TEST(ServerFlagsConnectionAge, OffByDefaultAndSetFromFlagsOrVariables) {
  ServerConfig d;
  std::string out;
  ASSERT_EQ(ParseCaptured({}, &d, &out), -1) << out;
  EXPECT_EQ(d.max_connection_age_s, 0.0);  // a bare server never ages connections out
  EXPECT_EQ(d.max_connection_age_grace_s, 0.0);
  ServerConfig c;
  ASSERT_EQ(ParseCaptured({"--max-connection-age-s", "300", "--max-connection-age-grace-s=150"},
                          &c, &out),
            -1)
      << out;
  EXPECT_EQ(c.max_connection_age_s, 300.0);
  EXPECT_EQ(c.max_connection_age_grace_s, 150.0);
  setenv("ATTN_MAX_CONNECTION_AGE_S", "1.5", 1);
  ServerConfig e;
  ASSERT_EQ(ParseCaptured({}, &e, &out), -1) << out;
  EXPECT_EQ(e.max_connection_age_s, 1.5);
  setenv("ATTN_MAX_CONNECTION_AGE_S", "-1", 1);  // below the range
  ServerConfig bad;
  EXPECT_GT(ParseCaptured({}, &bad, &out), 0);
  unsetenv("ATTN_MAX_CONNECTION_AGE_S");
  EXPECT_NE(out.find("environment variable ATTN_MAX_CONNECTION_AGE_S=-1"), std::string::npos)
      << out;
  std::string help;
  ASSERT_EQ(ParseCaptured({"--help"}, &d, &help), 0);
  const size_t group = help.find("\nLimits & hostile clients:\n");
  ASSERT_NE(group, std::string::npos) << help;
  EXPECT_GT(help.find("--max-connection-age-s "), group) << help;
  EXPECT_GT(help.find("--max-connection-age-grace-s "), group) << help;
}

TEST(ServerFlagsReplicaTag, AcceptsEightHexDigitsOnly) {
  ServerConfig d;
  std::string out;
  ASSERT_EQ(ParseCaptured({}, &d, &out), -1) << out;
  EXPECT_EQ(d.replica_tag, "");  // random per process (kv_cache/sequence_id.h)
  ServerConfig c;
  ASSERT_EQ(ParseCaptured({"--replica-tag", "0a1b2c3d"}, &c, &out), -1) << out;
  EXPECT_EQ(c.replica_tag, "0a1b2c3d");
  for (const char* bad : {"0A1B2C3D", "0a1b2c3", "0a1b2c3d4", "pod-1234"}) {
    ServerConfig b;
    EXPECT_GT(ParseCaptured({"--replica-tag", bad}, &b, &out), 0) << bad;
    EXPECT_NE(out.find("8 lowercase hex digits"), std::string::npos) << out;
  }
}

// NaN passes CLI::Range (every comparison with it is false); every numeric flag refuses it.
TEST(ServerFlags, NonFiniteNumbersAreRefused) {
  std::string out;
  for (const char* flag : {"--drain-timeout-s", "--sequence-ttl-s", "--gpu-memory-fraction",
                           "--shadow-check-fraction"}) {
    for (const char* value : {"nan", "inf", "-inf"}) {
      ServerConfig c;
      EXPECT_NE(ParseCaptured({flag, value}, &c, &out), -1) << flag << " " << value;
    }
  }
  ServerConfig ok;
  EXPECT_EQ(ParseCaptured({"--drain-timeout-s", "2.5", "--advertise-address", "inf-host:50051"},
                          &ok, &out),
            -1);
  EXPECT_DOUBLE_EQ(ok.drain_timeout_s, 2.5);
}

TEST(ServerFlags, EveryFlagHasAnAttnEnvironmentVariableAndTheCommandLineWins) {
  std::string out;
  setenv("ATTN_ADVERTISE_ADDRESS", "10.1.2.3:50051", 1);
  setenv("ATTN_DRAIN_TIMEOUT_S", "45", 1);
  setenv("ATTN_DRAIN_WAIT_SEQUENCES", "true", 1);
  setenv("ATTN_KV_CACHE_BYTES", "1048576", 1);
  setenv("ATTN_LISTEN", "0.0.0.0:7000", 1);
  ServerConfig c;
  EXPECT_EQ(ParseCaptured({"--listen", "127.0.0.1:0"}, &c, &out), -1);
  EXPECT_EQ(c.advertise_address, "10.1.2.3:50051");
  EXPECT_DOUBLE_EQ(c.drain_timeout_s, 45.0);
  EXPECT_TRUE(c.drain_wait_sequences);
  EXPECT_EQ(c.kv_cache_bytes, 1048576);
  EXPECT_EQ(c.listen_address, "127.0.0.1:0");  // flag beats ATTN_LISTEN
  for (const char* v : {"ATTN_ADVERTISE_ADDRESS", "ATTN_DRAIN_TIMEOUT_S",
                        "ATTN_DRAIN_WAIT_SEQUENCES", "ATTN_KV_CACHE_BYTES", "ATTN_LISTEN"}) {
    unsetenv(v);
  }
  ServerConfig d;
  EXPECT_EQ(ParseCaptured({}, &d, &out), -1);
  EXPECT_EQ(d.advertise_address, "");
  EXPECT_FALSE(d.drain_wait_sequences);
}

TEST(ServerFlags, BadAdvertiseAddressIsRefused) {
  std::string out;
  for (const std::string& bad :
       std::vector<std::string>{"nohostport", "host:", "host:0", "host:70000", ":50051"}) {
    ServerConfig c;
    EXPECT_NE(ParseCaptured({"--advertise-address", bad}, &c, &out), -1) << bad;
  }
  ServerConfig ok;
  EXPECT_EQ(ParseCaptured({"--advertise-address", "[fd00::1]:50051"}, &ok, &out), -1);
  EXPECT_EQ(ok.advertise_address, "[fd00::1]:50051");
}

// A bad flag exits 2 (as documented; CLI11's own codes are 105 and 109) with CLI11's message;
// --help exits 0.
TEST(ServerFlags, FlagErrorsExit2WithCli11sMessageAndHelpExits0) {
  std::string out;
  ServerConfig c;
  EXPECT_EQ(ParseCaptured({"--no-such-flag"}, &c, &out), 2);
  EXPECT_NE(out.find("The following argument was not expected: --no-such-flag"), std::string::npos)
      << out;
  EXPECT_NE(out.find("Run with --help for more information."), std::string::npos) << out;
  EXPECT_EQ(ParseCaptured({"--kv-cache-bytes", "12"}, &c, &out), 2);
  EXPECT_NE(out.find("--kv-cache-bytes"), std::string::npos) << out;
  setenv("ATTN_KV_CACHE_BYTES", "12", 1);
  EXPECT_EQ(ParseCaptured({}, &c, &out), 2);
  unsetenv("ATTN_KV_CACHE_BYTES");
  EXPECT_NE(out.find("ATTN_KV_CACHE_BYTES=12"), std::string::npos) << out;
  EXPECT_EQ(ParseCaptured({"--help"}, &c, &out), 0);
  EXPECT_NE(out.find("Usage:"), std::string::npos) << out;
}

}  // namespace
}  // namespace attn
