#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "loadgen/oracle.h"
#include "loadgen/random_normal.h"

namespace attn::loadgen {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::vector<double> Random(int64_t n, uint64_t seed) {
  std::vector<float> f(static_cast<size_t>(n));
  NormalGenerator(seed).Fill(f.data(), n);
  return std::vector<double>(f.begin(), f.end());
}

// Problem with B=1, N=K=1, H=2, identical keys, v row j = (j + 1, 10 (j + 1)).
struct IdenticalKeys {
  OracleProblem p;
  std::vector<double> q, k, v;
  IdenticalKeys(int64_t t, int64_t s, Causal causal) {
    p.q_len = t;
    p.kv_len = s;
    p.head_dim = 2;
    p.causal = causal;
    q = Random(t * 2, 1);
    k.assign(static_cast<size_t>(s * 2), 0.5);
    for (int64_t j = 0; j < s; ++j) {
      v.push_back(j + 1.0);
      v.push_back(10.0 * (j + 1));
    }
  }
  // Mean of v rows first..last, component c.
  double Mean(int64_t first, int64_t last, int c) const {
    double sum = 0;
    for (int64_t j = first; j <= last; ++j) sum += v[static_cast<size_t>(j * 2 + c)];
    return sum / static_cast<double>(last - first + 1);
  }
};

TEST(ClientOracle, IdenticalKeysGiveTheMeanOfV) {
  IdenticalKeys c(3, 5, Causal::kNone);
  std::vector<double> out, lse;
  ReferenceAttention(c.p, c.q, c.k, c.v, &out, &lse);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(out[i * 2], 3.0, 1e-12);
    EXPECT_NEAR(out[i * 2 + 1], 30.0, 1e-12);
  }
}

TEST(ClientOracle, HandComputedSoftmaxAndLse) {
  OracleProblem p;
  p.q_len = 1;
  p.kv_len = 2;
  p.head_dim = 1;
  p.scale = 1.0;
  const std::vector<double> q = {1.0}, k = {0.0, std::log(2.0)}, v = {3.0, 6.0};
  std::vector<double> out, lse;
  ReferenceAttention(p, q, k, v, &out, &lse);
  EXPECT_NEAR(out[0], 3.0 / 3 + 6.0 * 2 / 3, 1e-12);  // weights 1/3, 2/3
  EXPECT_NEAR(lse[0], std::log(3.0), 1e-12);
  // Default scale 1/sqrt(H): H = 4, logits q.k / 2.
  p.head_dim = 4;
  p.scale.reset();
  const std::vector<double> q4 = {1, 1, 1, 1}, k4 = {0, 0, 0, 0, 1, 1, 1, 1},
                            v4 = {0, 0, 0, 0, 1, 1, 1, 1};
  ReferenceAttention(p, q4, k4, v4, &out, &lse);
  const double w1 = std::exp(2.0) / (1 + std::exp(2.0));
  EXPECT_NEAR(out[0], w1, 1e-12);
  EXPECT_NEAR(lse[0], std::log(1 + std::exp(2.0)), 1e-12);
}

TEST(ClientOracle, CausalFirstRowIsV0) {
  for (Causal causal : {Causal::kTopLeft, Causal::kBottomRight}) {
    OracleProblem p;
    p.q_len = p.kv_len = 6;
    p.heads = p.kv_heads = 2;
    p.head_dim = 8;
    p.causal = causal;
    const auto q = Random(6 * 2 * 8, 1), k = Random(6 * 2 * 8, 2), v = Random(6 * 2 * 8, 3);
    std::vector<double> out, lse;
    ReferenceAttention(p, q, k, v, &out, &lse);
    for (int n = 0; n < 2; ++n) {
      for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(out[n * 8 + h], v[n * 8 + h]);
      // lse of one key is its scaled logit.
      double dot = 0;
      for (int h = 0; h < 8; ++h) dot += q[n * 8 + h] * k[n * 8 + h];
      EXPECT_NEAR(lse[n * 6 + 0], dot / std::sqrt(8.0), 1e-12);
    }
  }
}

TEST(ClientOracle, BottomRightAndTopLeftDifferWhenTNotEqualS) {
  std::vector<double> out, lse;
  // T = 2 queries over S = 4 keys.
  IdenticalKeys tl(2, 4, Causal::kTopLeft);
  ReferenceAttention(tl.p, tl.q, tl.k, tl.v, &out, &lse);
  EXPECT_NEAR(out[0], tl.Mean(0, 0, 0), 1e-12);  // row 0 sees key 0
  EXPECT_NEAR(out[2], tl.Mean(0, 1, 0), 1e-12);  // row 1 sees keys 0..1
  IdenticalKeys br(2, 4, Causal::kBottomRight);
  ReferenceAttention(br.p, br.q, br.k, br.v, &out, &lse);
  EXPECT_NEAR(out[0], br.Mean(0, 2, 0), 1e-12);  // row 0 sees keys 0..2
  EXPECT_NEAR(out[3], br.Mean(0, 3, 1), 1e-12);  // row 1 sees keys 0..3
  EXPECT_NEAR(lse[1], std::log(4.0) + 0.5 * (br.q[2] + br.q[3]) / std::sqrt(2.0), 1e-12);

  // T = 4 over S = 2, bottom-right: rows 0 and 1 see no key -> zeros and lse = -inf.
  IdenticalKeys br2(4, 2, Causal::kBottomRight);
  ReferenceAttention(br2.p, br2.q, br2.k, br2.v, &out, &lse);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[3], 0.0);
  EXPECT_EQ(lse[0], kNegInf);
  EXPECT_EQ(lse[1], kNegInf);
  EXPECT_NEAR(out[4], br2.Mean(0, 0, 0), 1e-12);
  EXPECT_NEAR(out[6], br2.Mean(0, 1, 0), 1e-12);
}

TEST(ClientOracle, SlidingWindow) {
  IdenticalKeys c(5, 5, Causal::kBottomRight);
  c.p.window_left = 1;
  std::vector<double> out, lse;
  ReferenceAttention(c.p, c.q, c.k, c.v, &out, &lse);
  EXPECT_NEAR(out[0], c.Mean(0, 0, 0), 1e-12);
  EXPECT_NEAR(out[4 * 2], c.Mean(3, 4, 0), 1e-12);
  // Non-causal with both windows: row 2 sees keys 1..4 for left 1, right 2.
  IdenticalKeys n(5, 5, Causal::kNone);
  n.p.window_left = 1;
  n.p.window_right = 2;
  ReferenceAttention(n.p, n.q, n.k, n.v, &out, &lse);
  EXPECT_NEAR(out[2 * 2], n.Mean(1, 4, 0), 1e-12);
  EXPECT_NEAR(out[0], n.Mean(0, 2, 0), 1e-12);
}

TEST(ClientOracle, GqaEqualsRepeatedHeads) {
  const int64_t T = 5, S = 7, N = 4, K = 2, H = 3;
  OracleProblem gqa;
  gqa.q_len = T;
  gqa.kv_len = S;
  gqa.heads = N;
  gqa.kv_heads = K;
  gqa.head_dim = H;
  gqa.causal = Causal::kBottomRight;
  const auto q = Random(T * N * H, 1), k = Random(S * K * H, 2), v = Random(S * K * H, 3);
  // Repeat each KV head N/K times: head n of the MHA problem is KV head n / 2.
  std::vector<double> k_rep, v_rep;
  for (int64_t j = 0; j < S; ++j) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t h = 0; h < H; ++h) {
        k_rep.push_back(k[static_cast<size_t>((j * K + n / 2) * H + h)]);
        v_rep.push_back(v[static_cast<size_t>((j * K + n / 2) * H + h)]);
      }
    }
  }
  OracleProblem mha = gqa;
  mha.kv_heads = N;
  std::vector<double> out_gqa, lse_gqa, out_mha, lse_mha;
  ReferenceAttention(gqa, q, k, v, &out_gqa, &lse_gqa);
  ReferenceAttention(mha, q, k_rep, v_rep, &out_mha, &lse_mha);
  EXPECT_EQ(out_gqa, out_mha);
  EXPECT_EQ(lse_gqa, lse_mha);
}

TEST(ClientOracle, PaddedLengthsGiveZeroRows) {
  // B = 2, T = S = 4; entry 0 has 2 queries over 3 keys, entry 1 is full.
  OracleProblem p;
  p.batch = 2;
  p.q_len = p.kv_len = 4;
  p.head_dim = 2;
  p.causal = Causal::kBottomRight;
  p.q_lengths = {2, 4};
  p.kv_lengths = {3, 4};
  const auto q = Random(2 * 4 * 2, 1);
  std::vector<double> k(2 * 4 * 2, 0.25), v;
  for (int j = 0; j < 8; ++j) {
    v.push_back(j);
    v.push_back(-j);
  }
  std::vector<double> out, lse;
  ReferenceAttention(p, q, k, v, &out, &lse);
  // Entry 0: diagonal offset S_b - T_b = 1; row 0 sees keys 0..1, row 1 keys 0..2.
  EXPECT_NEAR(out[0], 0.5, 1e-12);
  EXPECT_NEAR(out[2], 1.0, 1e-12);
  for (int i = 2; i < 4; ++i) {  // padding rows
    EXPECT_EQ(out[i * 2], 0.0);
    EXPECT_EQ(out[i * 2 + 1], 0.0);
    EXPECT_EQ(lse[i], kNegInf);
  }
  // Entry 1: row 3 sees keys 4..7 of the flat v (its own keys 0..3).
  EXPECT_NEAR(out[(4 + 3) * 2], 5.5, 1e-12);
  // An entry with no keys yields zeros and -inf.
  p.kv_lengths = {0, 4};
  ReferenceAttention(p, q, k, v, &out, &lse);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(lse[0], kNegInf);
  EXPECT_EQ(lse[1], kNegInf);
}

}  // namespace
}  // namespace attn::loadgen
