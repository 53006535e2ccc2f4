// Range checks of attention-loadgen's numeric flags with messages people can read:
// "--rate: must be > 0, got 0" where CLI::PositiveNumber printed "Value 0 not in range 0.000000
// to 1797693134862315708145274237317...". Their --help tags are CLI11's own (POSITIVE,
// NONNEGATIVE, "INT in [1 - 4096]"), so the help screen is unchanged.
// Non-finite values (nan, inf) pass these checks: RejectNonFiniteNumbers (attn/common/cli_finite.h)
// refuses them with its own message. Header-only (CLI11).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <type_traits>

namespace attn::loadgen {

namespace flag_checks_internal {

/// `x` as a person writes it: integers in full, other numbers with %g.
template <typename T>
std::string Show(T x) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(x);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(x));
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

}  // namespace flag_checks_internal

/// Value > 0 ("must be > 0, got 0"). --help tag POSITIVE.
inline CLI::Validator Positive() {
  return flag_checks_internal::Check<double>("> 0", "POSITIVE", [](double x) { return x > 0; });
}

/// Value >= 0 ("must be >= 0, got -1"). --help tag NONNEGATIVE.
inline CLI::Validator NonNegative() {
  return flag_checks_internal::Check<double>(">= 0", "NONNEGATIVE",
                                             [](double x) { return x >= 0; });
}

/// lo <= value <= hi, both inclusive ("must be in [1, 4096], got 0"). --help tag as
/// CLI::Range's: "INT in [1 - 4096]", "FLOAT in [0 - 1]".
template <typename T>
CLI::Validator InRange(T lo, T hi) {
  std::ostringstream tag;
  tag << CLI::detail::type_name<T>() << " in [" << lo << " - " << hi << "]";
  const std::string rule =
      "in [" + flag_checks_internal::Show(lo) + ", " + flag_checks_internal::Show(hi) + "]";
  return flag_checks_internal::Check<T>(rule, tag.str(),
                                        [lo, hi](T x) { return x >= lo && x <= hi; });
}

}  // namespace attn::loadgen
