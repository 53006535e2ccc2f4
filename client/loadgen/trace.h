// Request traces: the Azure LLM inference 2023 CSVs and the Mooncake conversation JSONL.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace attn::loadgen {

/// One request of a trace.
struct TraceRecord {
  double time_s = 0;  // arrival time in seconds (absolute for Azure, relative for Mooncake)
  int64_t context_tokens = 0;    // prompt tokens
  int64_t generated_tokens = 0;  // output tokens
};

/// Parses an Azure timestamp such as "2023-11-16 18:17:03.9799600" (UTC, any number of
/// fractional digits, optional) into seconds since 1970-01-01. Returns false if malformed.
bool ParseAzureTimestamp(const std::string& text, double* seconds);

/// Parses an Azure trace CSV: header "TIMESTAMP,ContextTokens,GeneratedTokens", then one row per
/// request. Accepts LF or CRLF line endings and a missing final newline; skips blank lines.
/// On a malformed line returns false with `error` naming the line number and the problem.
bool ParseAzureCsv(std::istream& in, std::vector<TraceRecord>* records, std::string* error);

/// Parses a Mooncake JSONL trace: one object per line with "timestamp" (ms from the trace start),
/// "input_length" and "output_length". Returns false with `error` on a malformed line.
bool ParseMooncakeJsonl(std::istream& in, std::vector<TraceRecord>* records, std::string* error);

/// Reads a trace file; the format follows the extension (".jsonl": Mooncake, otherwise Azure CSV).
/// Returns false with `error` (including the path) if the file cannot be read or parsed, or
/// holds no requests.
bool ReadTrace(const std::string& path, std::vector<TraceRecord>* records, std::string* error);

}  // namespace attn::loadgen
