#include "kv_cache/sequence_id.h"

namespace attn {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void AppendHex(uint32_t v, size_t digits, std::string *out) {
  for (size_t i = 0; i < digits; ++i) {
    out->push_back(kHex[(v >> (4 * (digits - 1 - i))) & 0xf]);
  }
}

}  // namespace

uint32_t NewReplicaTag() {
  std::random_device rd;
  return static_cast<uint32_t>(rd());
}

std::string ReplicaTagHex(uint32_t tag) {
  std::string s;
  s.reserve(kReplicaTagHexDigits);
  AppendHex(tag, kReplicaTagHexDigits, &s);
  return s;
}

std::string NewSequenceId(uint32_t tag, std::random_device &rd) {
  std::string id = ReplicaTagHex(tag);
  id.reserve(kSequenceIdHexDigits);
  while (id.size() < kSequenceIdHexDigits) AppendHex(static_cast<uint32_t>(rd()), 8, &id);
  return id;
}

bool IsSequenceId(const std::string &id) {
  return id.size() == kSequenceIdHexDigits &&
         id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string ReplicaTagOfId(const std::string &id) {
  return IsSequenceId(id) ? id.substr(0, kReplicaTagHexDigits) : std::string();
}

}  // namespace attn
