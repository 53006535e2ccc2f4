#include "common/gpu_uuid.h"

#include <cctype>

#include "common/client_text.h"

namespace attn {
namespace {

constexpr char kHex[] = "0123456789abcdef";
// Hex digits per dash-separated group of the 16 bytes.
constexpr int kGroups[5] = {8, 4, 4, 4, 12};

}  // namespace

std::string FormatGpuUuid(const unsigned char *bytes) {
  std::string out = "GPU-";
  size_t b = 0;
  for (int g = 0; g < 5; ++g) {
    if (g > 0) out.push_back('-');
    for (int i = 0; i < kGroups[g] / 2; ++i, ++b) {
      out.push_back(kHex[bytes[b] >> 4]);
      out.push_back(kHex[bytes[b] & 0xf]);
    }
  }
  return out;
}

StatusOr<std::string> CanonicalGpuUuid(const std::string &text) {
  auto bad = [&text] {
    return InvalidArgument("device_uuid: expected \"GPU-\" and 8-4-4-4-12 hex digits (as "
                           "nvidia-smi -L prints it), got \"" + EchoClientText(text) + "\"");
  };
  size_t at = 0;
  if (text.size() >= 4 && std::tolower(static_cast<unsigned char>(text[0])) == 'g' &&
      std::tolower(static_cast<unsigned char>(text[1])) == 'p' &&
      std::tolower(static_cast<unsigned char>(text[2])) == 'u' && text[3] == '-') {
    at = 4;
  }
  std::string out = "GPU-";
  for (int g = 0; g < 5; ++g) {
    if (g > 0) {
      if (at >= text.size() || text[at] != '-') return bad();
      out.push_back('-');
      ++at;
    }
    for (int i = 0; i < kGroups[g]; ++i, ++at) {
      if (at >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[at]))) return bad();
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(text[at]))));
    }
  }
  if (at != text.size()) return bad();
  return out;
}

}  // namespace attn
