#include "loadgen/trace.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace attn::loadgen {
namespace {

// Days from 1970-01-01 to the given proleptic Gregorian date (H. Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// Reads exactly `n` digits at text[*pos] into *value.
bool Digits(const std::string& text, size_t* pos, int n, int64_t* value) {
  int64_t v = 0;
  for (int i = 0; i < n; ++i) {
    if (*pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[*pos]))) return false;
    v = v * 10 + (text[(*pos)++] - '0');
  }
  *value = v;
  return true;
}

bool Expect(const std::string& text, size_t* pos, char c) {
  if (*pos >= text.size() || text[*pos] != c) return false;
  ++*pos;
  return true;
}

// Parses a non-negative decimal integer filling the whole of `text`.
bool ParseCount(const std::string& text, int64_t* value) {
  if (text.empty() || text.size() > 18) return false;
  int64_t v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

void StripCr(std::string* line) {
  if (!line->empty() && line->back() == '\r') line->pop_back();
}

}  // namespace

bool ParseAzureTimestamp(const std::string& text, double* seconds) {
  size_t pos = 0;
  int64_t year, month, day, hour, minute, second;
  if (!Digits(text, &pos, 4, &year) || !Expect(text, &pos, '-') || !Digits(text, &pos, 2, &month) ||
      !Expect(text, &pos, '-') || !Digits(text, &pos, 2, &day) ||
      !(Expect(text, &pos, ' ') || Expect(text, &pos, 'T')) || !Digits(text, &pos, 2, &hour) ||
      !Expect(text, &pos, ':') || !Digits(text, &pos, 2, &minute) || !Expect(text, &pos, ':') ||
      !Digits(text, &pos, 2, &second)) {
    return false;
  }
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return false;
  }
  double fraction = 0;
  if (pos < text.size()) {
    if (!Expect(text, &pos, '.') || pos == text.size()) return false;
    double unit = 0.1;
    for (; pos < text.size(); ++pos, unit /= 10) {
      if (!std::isdigit(static_cast<unsigned char>(text[pos]))) return false;
      fraction += (text[pos] - '0') * unit;
    }
  }
  const int64_t whole =
      DaysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
  *seconds = static_cast<double>(whole) + fraction;
  return true;
}

bool ParseAzureCsv(std::istream& in, std::vector<TraceRecord>* records, std::string* error) {
  std::string line;
  int64_t line_no = 0;
  bool header_seen = false;
  while (std::getline(in, line)) {
    ++line_no;
    StripCr(&line);
    if (line.empty()) continue;
    if (!header_seen) {
      if (line != "TIMESTAMP,ContextTokens,GeneratedTokens") {
        *error = "line " + std::to_string(line_no) +
                 ": expected header 'TIMESTAMP,ContextTokens,GeneratedTokens', got '" + line + "'";
        return false;
      }
      header_seen = true;
      continue;
    }
    const size_t c1 = line.find(',');
    const size_t c2 = c1 == std::string::npos ? c1 : line.find(',', c1 + 1);
    if (c2 == std::string::npos || line.find(',', c2 + 1) != std::string::npos) {
      *error =
          "line " + std::to_string(line_no) + ": expected 3 comma-separated fields: '" + line + "'";
      return false;
    }
    TraceRecord r;
    if (!ParseAzureTimestamp(line.substr(0, c1), &r.time_s)) {
      *error = "line " + std::to_string(line_no) + ": bad TIMESTAMP '" + line.substr(0, c1) + "'";
      return false;
    }
    if (!ParseCount(line.substr(c1 + 1, c2 - c1 - 1), &r.context_tokens) ||
        !ParseCount(line.substr(c2 + 1), &r.generated_tokens)) {
      *error = "line " + std::to_string(line_no) + ": bad token count in '" + line + "'";
      return false;
    }
    records->push_back(r);
  }
  if (!header_seen) {
    *error = "empty file (no header)";
    return false;
  }
  return true;
}

bool ParseMooncakeJsonl(std::istream& in, std::vector<TraceRecord>* records, std::string* error) {
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    StripCr(&line);
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("timestamp") ||
        !j["timestamp"].is_number() || !j.contains("input_length") ||
        !j["input_length"].is_number_integer() || j["input_length"].get<int64_t>() < 0) {
      *error = "line " + std::to_string(line_no) +
               ": expected a JSON object with numeric timestamp and input_length";
      return false;
    }
    TraceRecord r;
    r.time_s = j["timestamp"].get<double>() / 1000.0;
    r.context_tokens = j["input_length"].get<int64_t>();
    if (j.contains("output_length") && j["output_length"].is_number_integer()) {
      r.generated_tokens = j["output_length"].get<int64_t>();
    }
    records->push_back(r);
  }
  return true;
}

bool ReadTrace(const std::string& path, std::vector<TraceRecord>* records, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open trace '" + path + "'";
    return false;
  }
  const bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  std::string detail;
  const bool ok =
      jsonl ? ParseMooncakeJsonl(in, records, &detail) : ParseAzureCsv(in, records, &detail);
  if (!ok) {
    *error = "trace '" + path + "': " + detail;
    return false;
  }
  if (records->empty()) {
    *error = "trace '" + path + "' holds no requests";
    return false;
  }
  return true;
}

}  // namespace attn::loadgen
