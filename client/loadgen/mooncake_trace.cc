#include "loadgen/mooncake_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace attn::loadgen {

bool ParseMooncakeRequests(std::istream& in, std::vector<MooncakeRequest>* out,
                           std::string* error) {
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("input_length") ||
        !j["input_length"].is_number_integer() || j["input_length"].get<int64_t>() < 0) {
      *error = "line " + std::to_string(line_no) + ": expected a JSON object with input_length";
      return false;
    }
    MooncakeRequest r;
    if (j.contains("timestamp") && j["timestamp"].is_number()) {
      r.time_s = j["timestamp"].get<double>() / 1000.0;
    }
    r.input_length = j["input_length"].get<int64_t>();
    if (j.contains("output_length") && j["output_length"].is_number_integer()) {
      r.output_length = j["output_length"].get<int64_t>();
    }
    if (j.contains("hash_ids")) {
      if (!j["hash_ids"].is_array()) {
        *error = "line " + std::to_string(line_no) + ": hash_ids is not an array";
        return false;
      }
      for (const auto& h : j["hash_ids"]) {
        if (!h.is_number_integer()) {
          *error = "line " + std::to_string(line_no) + ": hash_ids holds a non-integer";
          return false;
        }
        r.hash_ids.push_back(h.get<int64_t>());
      }
    }
    out->push_back(std::move(r));
  }
  return true;
}

bool ReadMooncakeRequests(const std::string& path, std::vector<MooncakeRequest>* out,
                          std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open trace '" + path + "'";
    return false;
  }
  std::string detail;
  if (!ParseMooncakeRequests(in, out, &detail)) {
    *error = "trace '" + path + "': " + detail;
    return false;
  }
  if (out->empty()) {
    *error = "trace '" + path + "' holds no requests";
    return false;
  }
  return true;
}

int64_t SharedBlocks(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

int64_t ForkLength(int64_t shared_blocks, double token_scale, int64_t parent_context,
                   int64_t child_context) {
  const double tokens =
      std::round(static_cast<double>(shared_blocks) * kMooncakeBlockTokens * token_scale);
  int64_t length = static_cast<int64_t>(tokens);
  length = std::min(length, parent_context);
  length = std::min(length, child_context - 1);
  return std::max<int64_t>(length, 0);
}

}  // namespace attn::loadgen
