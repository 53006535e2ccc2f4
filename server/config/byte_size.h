// Byte sizes on the command line: every attention-server flag whose name ends in -bytes takes a
// plain count of bytes or a count with a binary suffix (--kv-cache-bytes 1G).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace attn {

/// Parses `text` as a byte count: digits, optionally followed by one suffix, each a power of
/// 1024 (never 1000): K or KiB = 2^10, M or MiB = 2^20, G or GiB = 2^30, T or TiB = 2^40; the
/// suffix's letters may be any case ("1g", "64kib"). No sign, fraction, space or decimal "KB"/
/// "GB" (ambiguous between 1000 and 1024). On success stores the count in `*bytes` and returns
/// ""; otherwise returns the reason, naming the accepted suffixes (`*bytes` untouched). A
/// count above INT64_MAX is refused.
std::string ParseByteSize(const std::string& text, int64_t* bytes);

/// `bytes` in the largest binary unit it is a whole multiple of ("1GiB", "64KiB", "1536KiB"),
/// else plain digits ("1000", "0"); ParseByteSize reads every result back as `bytes`.
std::string ShowByteSize(int64_t bytes);

/// A CLI11 transform that rewrites a byte size (ParseByteSize) as its plain decimal count, so
/// the option's range check and conversion see bytes.
CLI::Validator ByteSizeTransform();

/// Adds ByteSizeTransform, ahead of the existing checks, to every option of `app` whose long
/// name ends in "-bytes", and names their value SIZE in --help.
void AcceptByteSuffixes(CLI::App& app);

}  // namespace attn
