#include "loadgen/oracle.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace attn::loadgen {

void VisibleKeys(const OracleProblem& problem, int64_t i, int64_t t, int64_t s, int64_t* first,
                 int64_t* last) {
  const int64_t diagonal = problem.causal == Causal::kTopLeft ? i : i + (s - t);
  int64_t lo = 0;
  int64_t hi = s - 1;
  if (problem.window_left) lo = std::max(lo, diagonal - *problem.window_left);
  if (problem.window_right) hi = std::min(hi, diagonal + *problem.window_right);
  if (problem.causal != Causal::kNone) hi = std::min(hi, diagonal);
  *first = lo;
  *last = hi;
}

void ReferenceAttention(const OracleProblem& p, const std::vector<double>& q,
                        const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>* out, std::vector<double>* lse) {
  const int64_t B = p.batch, T = p.q_len, S = p.kv_len, N = p.heads, K = p.kv_heads, H = p.head_dim;
  assert(static_cast<int64_t>(q.size()) == B * T * N * H);
  assert(static_cast<int64_t>(k.size()) == B * S * K * H);
  assert(static_cast<int64_t>(v.size()) == B * S * K * H);
  const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(H));
  const int64_t group = N / K;
  out->assign(static_cast<size_t>(B * T * N * H), 0.0);
  lse->assign(static_cast<size_t>(B * N * T), -std::numeric_limits<double>::infinity());
  std::vector<double> logits(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t_b = p.q_lengths.empty() ? T : p.q_lengths[b];
    const int64_t s_b = p.kv_lengths.empty() ? S : p.kv_lengths[b];
    for (int64_t n = 0; n < N; ++n) {
      const int64_t kv_head = n / group;
      for (int64_t i = 0; i < t_b; ++i) {
        int64_t first, last;
        VisibleKeys(p, i, t_b, s_b, &first, &last);
        if (first > last) continue;  // sees no key: zeros, lse = -inf
        const double* q_row = &q[static_cast<size_t>(((b * T + i) * N + n) * H)];
        double max_logit = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          const double* k_row = &k[static_cast<size_t>(((b * S + j) * K + kv_head) * H)];
          double dot = 0;
          for (int64_t h = 0; h < H; ++h) dot += q_row[h] * k_row[h];
          logits[j] = scale * dot;
          max_logit = std::max(max_logit, logits[j]);
        }
        double sum = 0;
        for (int64_t j = first; j <= last; ++j) {
          logits[j] = std::exp(logits[j] - max_logit);
          sum += logits[j];
        }
        double* o_row = &(*out)[static_cast<size_t>(((b * T + i) * N + n) * H)];
        for (int64_t j = first; j <= last; ++j) {
          const double weight = logits[j] / sum;
          const double* v_row = &v[static_cast<size_t>(((b * S + j) * K + kv_head) * H)];
          for (int64_t h = 0; h < H; ++h) o_row[h] += weight * v_row[h];
        }
        (*lse)[static_cast<size_t>((b * N + n) * T + i)] = max_logit + std::log(sum);
      }
    }
  }
}

}  // namespace attn::loadgen
