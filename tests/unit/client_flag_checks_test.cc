// The range checks of both binaries' flags (attn/common/cli_range.h): readable messages where
// CLI::PositiveNumber printed DBL_MAX in full and CLI::Range "0.000000"; non-finite values left
// to RejectNonFiniteNumbers; the same --help tags as CLI11's own validators.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/common/cli_finite.h"
#include "attn/common/cli_range.h"

namespace attn {
namespace {

// Parses `args` (argv[0] added) into an app with --x checked by `v` and the finite check; returns
// CLI11's error message, "" when the parse succeeded.
template <typename T>
std::string ParseError(const CLI::Validator& v, std::vector<std::string> args, T* x) {
  CLI::App app;
  app.add_option("--x", *x)->check(v);
  RejectNonFiniteNumbers(app);
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(FlagChecks, PositiveAndNonNegativeSayTheRuleAndTheValue) {
  double d = 0;
  EXPECT_EQ(ParseError(Positive(), {"--x", "0"}, &d), "--x: must be > 0, got 0");
  EXPECT_EQ(ParseError(Positive(), {"--x", "-2.5"}, &d), "--x: must be > 0, got -2.5");
  EXPECT_EQ(ParseError(Positive(), {"--x", "1e-300"}, &d), "");
  EXPECT_DOUBLE_EQ(d, 1e-300);
  EXPECT_EQ(ParseError(NonNegative(), {"--x", "-1"}, &d), "--x: must be >= 0, got -1");
  EXPECT_EQ(ParseError(NonNegative(), {"--x", "0"}, &d), "");
  int64_t n = 0;
  EXPECT_EQ(ParseError(NonNegative(), {"--x", "abc"}, &n), "--x: must be a number >= 0, got abc");
  EXPECT_EQ(ParseError(Positive(), {"--x", "7"}, &n), "");
  EXPECT_EQ(n, 7);
}

TEST(FlagChecks, InRangeSaysTheBoundsAsWritten) {
  int i = 0;
  EXPECT_EQ(ParseError(InRange(1, 4096), {"--x", "0"}, &i), "--x: must be in [1, 4096], got 0");
  EXPECT_EQ(ParseError(InRange(1, 4096), {"--x", "4097"}, &i),
            "--x: must be in [1, 4096], got 4097");
  EXPECT_EQ(ParseError(InRange(1, 4096), {"--x", "1.5"}, &i),
            "--x: must be an integer in [1, 4096], got 1.5");
  EXPECT_EQ(ParseError(InRange(1, 4096), {"--x", "4096"}, &i), "");
  EXPECT_EQ(i, 4096);
  int64_t big = 0;
  EXPECT_EQ(ParseError(InRange(int64_t{1}, int64_t{1} << 40), {"--x", "0"}, &big),
            "--x: must be in [1, 1099511627776], got 0");
  double f = 0;
  EXPECT_EQ(ParseError(InRange(0.0, 1.0), {"--x", "2"}, &f), "--x: must be in [0, 1], got 2");
  EXPECT_EQ(ParseError(InRange(0.0, 1.0), {"--x", "0.25"}, &f), "");
  EXPECT_DOUBLE_EQ(f, 0.25);
}

TEST(FlagChecks, NonFiniteValuesGetTheFiniteChecksMessage) {
  double d = 0;
  for (const char* v : {"nan", "inf", "-inf"}) {
    const std::string want = std::string("--x: must be a finite number, got ") + v;
    EXPECT_EQ(ParseError(Positive(), {"--x", v}, &d), want);
    EXPECT_EQ(ParseError(NonNegative(), {"--x", v}, &d), want);
    EXPECT_EQ(ParseError(InRange(0.0, 1.0), {"--x", v}, &d), want);
  }
  int i = 0;
  EXPECT_EQ(ParseError(InRange(1, 4096), {"--x", "nan"}, &i),
            "--x: must be a finite number, got nan");
}

TEST(FlagChecks, HelpTagsAreCli11s) {
  EXPECT_EQ(Positive().get_description(), CLI::PositiveNumber.get_description());
  EXPECT_EQ(NonNegative().get_description(), CLI::NonNegativeNumber.get_description());
  EXPECT_EQ(InRange(1, 4096).get_description(), CLI::Range(1, 4096).get_description());
  EXPECT_EQ(InRange(int64_t{1}, int64_t{1} << 40).get_description(),
            CLI::Range(int64_t{1}, int64_t{1} << 40).get_description());
  EXPECT_EQ(InRange(0.0, 1.0).get_description(), CLI::Range(0.0, 1.0).get_description());
}

}  // namespace
}  // namespace attn
