// Range checks of numeric command-line flags (attention-server's and attention-loadgen's) with
// messages people can read: "--rate: must be > 0, got 0" where CLI::PositiveNumber printed
// "Value 0 not in range 0.000000 to 1797693134862315708145274237317..." and CLI::Range
// "Value -1 not in range 0.000000 to 1000000000.000000". Their --help tags are CLI11's own
// (POSITIVE, NONNEGATIVE, "INT in [1 - 4096]"), so the help screen is unchanged.
// Non-finite values (nan, inf) pass these checks: RejectNonFiniteNumbers (attn/common/cli_finite.h)
// refuses them with its own message. Header-only; needs CLI11 on the include path.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>

namespace attn {

namespace cli_range_internal {

/// `x` as a person writes it: integers in full, other numbers with %.15g (2592000, 1e+18, 0.01).
template <typename T>
std::string Show(T x) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(x);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.15g", static_cast<double>(x));
    return buf;
  }
}

/// True when `value` is a number that is not finite ("nan", "inf", "-inf").
inline bool NonFinite(const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  const double x = std::strtod(begin, &end);
  return end != begin && *end == '\0' && !std::isfinite(x);
}

/// A validator of `T` values: `ok(v)` true, else "must be <rule>, got <value>". A value that is
/// not a `T` gets "must be <a number|an integer> <rule>, got <value>".
template <typename T, typename Ok>
CLI::Validator Check(std::string rule, std::string description, Ok ok) {
  CLI::Validator v(
      [rule, ok](std::string& value) -> std::string {
        T x{};
        if (!CLI::detail::lexical_cast(value, x)) {
          if (NonFinite(value)) return std::string();  // refused by RejectNonFiniteNumbers
          const char* kind = std::is_integral_v<T> ? "an integer " : "a number ";
          return "must be " + std::string(kind) + rule + ", got " + value;
        }
        if (std::is_floating_point_v<T> && !std::isfinite(static_cast<double>(x))) {
          return std::string();  // refused by RejectNonFiniteNumbers
        }
        return ok(x) ? std::string() : "must be " + rule + ", got " + value;
      },
      std::move(description));
  return v;
}

}  // namespace cli_range_internal

/// Value > 0 ("must be > 0, got 0"). --help tag POSITIVE.
inline CLI::Validator Positive() {
  return cli_range_internal::Check<double>("> 0", "POSITIVE", [](double x) { return x > 0; });
}

/// Value >= 0 ("must be >= 0, got -1"). --help tag NONNEGATIVE.
inline CLI::Validator NonNegative() {
  return cli_range_internal::Check<double>(">= 0", "NONNEGATIVE",
                                             [](double x) { return x >= 0; });
}

/// lo <= value <= hi, both inclusive ("must be in [1, 4096], got 0"). --help tag as
/// CLI::Range's: "INT in [1 - 4096]", "FLOAT in [0 - 1]".
template <typename T>
CLI::Validator InRange(T lo, T hi) {
  std::ostringstream tag;
  tag << CLI::detail::type_name<T>() << " in [" << lo << " - " << hi << "]";
  const std::string rule =
      "in [" + cli_range_internal::Show(lo) + ", " + cli_range_internal::Show(hi) + "]";
  return cli_range_internal::Check<T>(rule, tag.str(),
                                        [lo, hi](T x) { return x >= lo && x <= hi; });
}

}  // namespace attn
