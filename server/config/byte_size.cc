#include "config/byte_size.h"

#include <cctype>
#include <limits>

namespace attn {
namespace {

// Lowercases ASCII letters.
std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// log2 of the multiple `suffix` (already lowercased) stands for; -1 when it is none of them.
int SuffixShift(const std::string& suffix) {
  if (suffix.empty()) return 0;
  static const char kLetters[] = "kmgt";
  for (int i = 0; i < 4; ++i) {
    const std::string one(1, kLetters[i]);
    if (suffix == one || suffix == one + "ib") return 10 * (i + 1);
  }
  return -1;
}

}  // namespace

std::string ParseByteSize(const std::string& text, int64_t* bytes) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0) {
    return "expected a byte count such as 1073741824, 64K, 512MiB or 1G (binary multiples), "
           "got \"" +
           text + "\"";
  }
  const std::string suffix = text.substr(digits);
  const int shift = SuffixShift(Lower(suffix));
  if (shift < 0) {
    return "unknown size suffix \"" + suffix + "\" in \"" + text +
           "\": use K, M, G, T or KiB, MiB, GiB, TiB (all powers of 1024), or plain bytes";
  }
  const uint64_t max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t count = 0;
  for (size_t i = 0; i < digits; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (count > (max - d) / 10) return "byte count \"" + text + "\" is too large";
    count = count * 10 + d;
  }
  if (shift > 0 && count > (max >> shift)) return "byte count \"" + text + "\" is too large";
  *bytes = static_cast<int64_t>(count << shift);
  return "";
}

CLI::Validator ByteSizeTransform() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        int64_t bytes = 0;
        std::string error = ParseByteSize(value, &bytes);
        if (error.empty()) value = std::to_string(bytes);
        return error;
      },
      "");  // the option's type name says SIZE
}

void AcceptByteSuffixes(CLI::App& app) {
  static const std::string kEnd = "-bytes";
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    if (name.size() > kEnd.size() &&
        name.compare(name.size() - kEnd.size(), kEnd.size(), kEnd) == 0) {
      opt->transform(ByteSizeTransform())->type_name("SIZE");
    }
  }
}

}  // namespace attn
