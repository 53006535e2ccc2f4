// Float64 reference attention for the PADDED layout, written from the attention.v1 .proto
// comments and DESIGN.md §4, independently of the server's code. Pure, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace attn::loadgen {

/// Causal alignment (attention.v1 CausalAlignment).
enum class Causal { kNone, kTopLeft, kBottomRight };

/// One padded attention problem. Tensors are row-major: q (B,T,N,H); k, v (B,S,K,H);
/// out (B,T,N,H); lse (B,N,T).
struct OracleProblem {
  int64_t batch = 1;     // B
  int64_t q_len = 0;     // T (padded extent)
  int64_t kv_len = 0;    // S (padded extent)
  int64_t heads = 1;     // N
  int64_t kv_heads = 1;  // K; query head h reads KV head h / (N / K)
  int64_t head_dim = 1;  // H
  Causal causal = Causal::kNone;
  std::optional<int64_t> window_left;   // keys left of the diagonal kept; unset: unbounded
  std::optional<int64_t> window_right;  // keys right of the diagonal kept; unset: unbounded
  std::vector<int32_t> q_lengths;       // empty, or B values in [0, T]
  std::vector<int32_t> kv_lengths;      // empty, or B values in [0, S]
  std::optional<double> scale;          // unset: 1/sqrt(H)
};

/// The visible key range of query row `i` in an entry with `t` queries and `s` keys:
/// keys j with *first <= j <= *last are kept (none when *first > *last). The diagonal is
/// d = i (top-left) or i + s − t (bottom-right, none); windows keep d − left <= j <= d + right;
/// causal keeps j <= d; and always 0 <= j < s.
void VisibleKeys(const OracleProblem& problem, int64_t i, int64_t t, int64_t s, int64_t* first,
                 int64_t* last);

/// Computes out = softmax(scale · q kᵀ + mask) v and lse (natural log of the sum of exp of the
/// kept scaled logits) in float64. Padding rows (i >= q_lengths[b]) and rows that see no key
/// give zeros and lse = −inf. Inputs must have the sizes the problem implies (checked with
/// assert only); the caller validates the problem.
void ReferenceAttention(const OracleProblem& problem, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>* out, std::vector<double>* lse);

}  // namespace attn::loadgen
