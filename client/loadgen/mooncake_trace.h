// The Mooncake trace (JSONL: timestamp ms, input_length, output_length, hash_ids) and the prefix
// arithmetic of its replay: how many leading hash blocks two requests share and how many tokens
// a child forks from its parent (ForkSequence).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace attn::loadgen {

/// Tokens per Mooncake hash block (before --token-scale).
inline constexpr int64_t kMooncakeBlockTokens = 512;

/// One Mooncake request with its prefix block hashes.
struct MooncakeRequest {
  double time_s = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
};

/// Parses Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids).
bool ParseMooncakeRequests(std::istream& in, std::vector<MooncakeRequest>* out, std::string* error);
bool ReadMooncakeRequests(const std::string& path, std::vector<MooncakeRequest>* out,
                          std::string* error);

/// Number of equal leading hash ids.
int64_t SharedBlocks(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

/// Tokens a child forks from its parent: round(shared_blocks × 512 × token_scale), capped to
/// the parent's context tokens and to child_context − 1 (the child always extends at least one
/// token); never negative.
int64_t ForkLength(int64_t shared_blocks, double token_scale, int64_t parent_context,
                   int64_t child_context);

}  // namespace attn::loadgen
