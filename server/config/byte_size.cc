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

// The whole text as a non-negative int64, or -1.
int64_t Digits(const std::string& text) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return -1;
  }
  return std::stoll(text);
}

// A SIZE option's help: its range tag "INT in [65536 - 17592186044416]" and default
// "1073741824" in binary units ("in [64KiB - 16TiB]", "1GiB"), which parse back as the same
// bytes.
void ShowInBinaryUnits(CLI::Option* opt) {
  for (int i = 0;; ++i) {
    CLI::Validator* v = nullptr;
    try {
      v = opt->get_validator(i);
    } catch (const CLI::OptionNotFound&) {
      break;
    }
    const std::string d = v->get_description();
    static const std::string kHead = "INT in [";
    const size_t dash = d.find(" - ");
    if (d.rfind(kHead, 0) != 0 || dash == std::string::npos || d.back() != ']') continue;
    const int64_t lo = Digits(d.substr(kHead.size(), dash - kHead.size()));
    const int64_t hi = Digits(d.substr(dash + 3, d.size() - dash - 4));
    if (lo < 0 || hi < 0) continue;
    v->description("in [" + ShowByteSize(lo) + " - " + ShowByteSize(hi) + "]");
  }
  const int64_t def = Digits(opt->get_default_str());
  if (def >= 0) opt->default_str(ShowByteSize(def));
}

}  // namespace

std::string ShowByteSize(int64_t bytes) {
  static const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    const int shift = 10 * (4 - i);
    if (bytes > 0 && bytes % (int64_t{1} << shift) == 0) {
      return std::to_string(bytes >> shift) + kUnits[i];
    }
  }
  return std::to_string(bytes);
}

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
      ShowInBinaryUnits(opt);
    }
  }
}

}  // namespace attn
