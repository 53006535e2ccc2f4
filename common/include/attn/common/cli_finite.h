// Rejects non-finite numbers in command-line options (CLI11). CLI::Range lets NaN through
// (every comparison with NaN is false), and "nan"/"inf" parse as doubles, so without this a
// flag such as --drain-timeout-s nan or --rate nan is accepted and misbehaves later.
// Header-only; used by attention-server's and attention-loadgen's flag parsers.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

namespace attn {

/// Adds to every option of `app` and of its subcommands a check that fails when the value is a
/// number that is not finite (NaN, inf). Other values (strings, paths) are left alone.
inline void RejectNonFiniteNumbers(CLI::App& app) {
  const CLI::Validator finite(
      [](std::string& value) -> std::string {
        const char* begin = value.c_str();
        char* end = nullptr;
        const double x = std::strtod(begin, &end);
        if (end != begin && *end == '\0' && !std::isfinite(x)) {
          return "must be a finite number, got " + value;
        }
        return std::string();
      },
      "");  // no tag in --help: it applies to every option
  for (CLI::Option* o : app.get_options()) {
    if (o->get_expected_max() != 0) o->check(finite);  // flags take no value
  }
  for (CLI::App* sub : app.get_subcommands({})) RejectNonFiniteNumbers(*sub);
}

}  // namespace attn
