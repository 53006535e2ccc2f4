#include "security/token_table.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace attn::security {
namespace {

constexpr size_t kMaxIdentity = 128;
constexpr size_t kMinToken = 16;
constexpr size_t kMaxToken = 4096;

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

}  // namespace

bool ValidIdentity(std::string_view id) {
  if (id.empty() || id.size() > kMaxIdentity) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("._@:/+-").find(c) != std::string_view::npos;
  });
}

TokenTable::Digest TokenTable::Hash(std::string_view token) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  return d;
}

StatusOr<TokenTable> TokenTable::Parse(std::string_view text, const std::string& source) {
  TokenTable table;
  std::set<Digest> seen;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    // Split on blanks into fields.
    std::vector<std::string_view> fields;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && IsBlank(line[i])) ++i;
      if (i >= line.size()) break;
      size_t j = i;
      while (j < line.size() && !IsBlank(line[j])) ++j;
      fields.push_back(line.substr(i, j - i));
      i = j;
    }
    if (fields.empty() || fields[0][0] == '#') continue;
    const std::string where = source + ":" + std::to_string(line_no) + ": ";
    if (fields.size() != 2) {
      return InvalidArgument(where + "expected \"identity token\", got " +
                             std::to_string(fields.size()) + " fields");
    }
    if (!ValidIdentity(fields[0])) {
      return InvalidArgument(where + "identity must be 1.." + std::to_string(kMaxIdentity) +
                             " characters of [A-Za-z0-9._@:/+-]");
    }
    const std::string_view token = fields[1];
    const bool printable = std::all_of(token.begin(), token.end(),
                                       [](char c) { return c > 0x20 && c < 0x7f; });
    if (token.size() < kMinToken || token.size() > kMaxToken || !printable) {
      // Never echo the token itself.
      return InvalidArgument(where + "token must be " + std::to_string(kMinToken) + ".." +
                             std::to_string(kMaxToken) +
                             " printable ASCII characters without spaces (got " +
                             std::to_string(token.size()) + " characters)");
    }
    Entry e{std::string(fields[0]), Hash(token)};
    if (!seen.insert(e.digest).second) {
      return InvalidArgument(where + "this token already appears on an earlier line");
    }
    table.entries_.push_back(std::move(e));
    if (end == text.size()) break;
  }
  if (table.entries_.empty()) return InvalidArgument(source + ": holds no token");
  return table;
}

StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("--auth-token-file: cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return InvalidArgument("--auth-token-file: error reading " + path);
  return Parse(ss.str(), path);
}

std::optional<std::string> TokenTable::Find(std::string_view token) const {
  const Digest d = Hash(token);
  const Entry* match = nullptr;
  for (const Entry& e : entries_) {
    // CRYPTO_memcmp takes time independent of the contents; every entry is compared.
    const bool equal = CRYPTO_memcmp(e.digest.data(), d.data(), d.size()) == 0;
    match = equal ? &e : match;
  }
  if (match == nullptr) return std::nullopt;
  return match->identity;
}

std::vector<std::string> TokenTable::Identities() const {
  std::set<std::string> ids;
  for (const Entry& e : entries_) ids.insert(e.identity);
  return {ids.begin(), ids.end()};
}

}  // namespace attn::security
