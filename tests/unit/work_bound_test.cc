// The per-call work bound (issue 16 item 1): the issue's repro is refused on cpu naming the
// flag; the largest requests frontends send on purpose pass with the default bounds.
#include "validation/work_bound.h"

#include <gtest/gtest.h>

#include "config/server_config.h"

namespace attn {
namespace {

void Fill(attention::v1::Tensor* t, std::vector<int64_t> shape) {
  t->set_dtype(attention::v1::BFLOAT16);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  t->mutable_data()->assign(n * 2, '\0');
}

WorkBounds Defaults() {
  const ServerConfig c;
  return {c.max_cpu_score_pairs, c.max_gpu_flops};
}

TEST(WorkBound, IssueReproIsRefusedOnCpuNamingTheFlag) {
  attention::v1::AttendRequest r;  // q = k = v of shape (1, 60000, 1, 1), float32
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v()}) {
    t->set_dtype(attention::v1::FLOAT32);
    for (int64_t d : {1, 60000, 1, 1}) t->add_shape(d);
    t->mutable_data()->assign(60000 * 4, '\0');
  }
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_DOUBLE_EQ(v->score_pairs, 3.6e9);
  const Status s = CheckWorkBound(*v, /*on_cpu=*/true, Defaults());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max-cpu-score-pairs"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckWorkBound(*v, true, {0, 0}).ok()) << "0 means unlimited";
}

TEST(WorkBound, PackedPrefillOf32x512TokensPassesOnCpu) {
  // 32 sequences × 512 tokens, causal, varlen, 64 heads: one layer's call. The pairs do not
  // depend on the head dim, so H = 1 here keeps the test small; FLOPs scale with H (128).
  attention::v1::AttendRequest r;
  Fill(r.mutable_q(), {32 * 512, 64, 1});
  Fill(r.mutable_k(), {32 * 512, 8, 1});
  Fill(r.mutable_v(), {32 * 512, 8, 1});
  r.set_layout(attention::v1::LAYOUT_VARLEN);
  for (int i = 0; i < 32; ++i) {
    r.add_q_lengths(512);
    r.add_kv_lengths(512);
  }
  r.mutable_mask()->set_causal(attention::v1::CAUSAL_BOTTOM_RIGHT);
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_DOUBLE_EQ(v->score_pairs, 32 * 512.0 * 512 / 2 * 64);
  EXPECT_TRUE(CheckWorkBound(*v, true, Defaults()).ok());
  v->flops *= 128;
  EXPECT_TRUE(CheckWorkBound(*v, false, Defaults()).ok());
}

TEST(WorkBound, GpuPrefillOf32kTokensPassesAndAMuchBiggerOneIsRefused) {
  attention::v1::AttendRequest r;  // B = 1, T = S = 32768, N = 64, K = 8, dense, H = 128
  Fill(r.mutable_q(), {1, 32768, 64, 1});
  Fill(r.mutable_k(), {1, 32768, 8, 1});
  Fill(r.mutable_v(), {1, 32768, 8, 1});
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  v->flops *= 128;  // FLOPs scale with H: built with H = 1 to keep the request small
  EXPECT_DOUBLE_EQ(v->flops, 4.0 * 32768 * 32768 * 64 * 128);
  EXPECT_TRUE(CheckWorkBound(*v, false, Defaults()).ok());
  WorkBounds tight = Defaults();
  tight.max_gpu_flops = v->flops / 2;
  const Status s = CheckWorkBound(*v, false, tight);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max-gpu-flops"), std::string::npos) << s.message();
}

TEST(WorkBound, WindowCapsThePairsCounted) {
  attention::v1::AttendRequest r;  // T = S = 100000, causal with a 127-token window
  Fill(r.mutable_q(), {1, 100000, 1, 8});
  Fill(r.mutable_k(), {1, 100000, 1, 8});
  Fill(r.mutable_v(), {1, 100000, 1, 8});
  r.mutable_mask()->set_causal(attention::v1::CAUSAL_BOTTOM_RIGHT);
  r.mutable_mask()->set_window_left(127);
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_DOUBLE_EQ(v->score_pairs, 100000.0 * 128);
  EXPECT_TRUE(CheckWorkBound(*v, true, Defaults()).ok());
}

ExtendArgs Step(int64_t position, int64_t t, int64_t n, int64_t h) {
  ExtendArgs a;
  a.position = position;
  a.q_shape = {t, n, h};
  a.k_shape = a.v_shape = {t, 1, h};
  return a;
}

TEST(WorkBound, SequenceStepPairsCountTheCausalTriangleOverThePrefix) {
  // Query token i of a step at `position` sees position + i + 1 keys.
  EXPECT_DOUBLE_EQ(StepScorePairs(Step(0, 4, 2, 8)), 2.0 * (1 + 2 + 3 + 4));
  EXPECT_DOUBLE_EQ(StepScorePairs(Step(100, 1, 32, 128)), 32.0 * 101);
  EXPECT_DOUBLE_EQ(StepScorePairs(Step(10, 3, 1, 8)), 11.0 + 12 + 13);
  ExtendArgs append = Step(0, 4096, 0, 128);
  append.append_only = true;
  EXPECT_DOUBLE_EQ(StepScorePairs(append), 0.0) << "an append-only step attends nothing";
}

TEST(WorkBound, OverLargeSequenceCallIsRefusedOnPagedCpuNamingTheFlag) {
  // The review's repro: a 200000-token prefill of N = 4 heads in one Extend (4·10^10 pairs).
  const double huge = StepScorePairs(Step(0, 200000, 4, 16));
  const Status s = CheckStepsWorkBound(huge, 16, /*on_cpu=*/true, Defaults());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max-cpu-score-pairs"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckStepsWorkBound(huge, 16, true, {0, 0}).ok()) << "0 means unlimited";
  // What frontends send on purpose passes: a 4096-token prefill of 32 heads (2.7e8 pairs), and
  // 64 decode steps at 4k context.
  EXPECT_TRUE(
      CheckStepsWorkBound(StepScorePairs(Step(0, 4096, 32, 128)), 128, true, Defaults()).ok());
  EXPECT_TRUE(
      CheckStepsWorkBound(64 * StepScorePairs(Step(4096, 1, 32, 128)), 128, true, Defaults()).ok());
}

TEST(WorkBound, SequenceCallOnPagedGpuIsBoundedInFlops) {
  // A 32k-token prefill of 64 heads of dim 128 (4·128·pairs = 3.5e13 FLOPs) passes; half the
  // bound refuses it naming --max-gpu-flops.
  const double pairs = StepScorePairs(Step(0, 32768, 64, 128));
  EXPECT_TRUE(CheckStepsWorkBound(pairs, 128, /*on_cpu=*/false, Defaults()).ok());
  WorkBounds tight = Defaults();
  tight.max_gpu_flops = 4.0 * pairs * 128 / 2;
  const Status s = CheckStepsWorkBound(pairs, 128, false, tight);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max-gpu-flops"), std::string::npos) << s.message();
}

TEST(WorkBound, PositionBeyondWhatAnyLayerCanHoldIsAFailedPreconditionNotTooCostly) {
  // A new-user review's case: an Extend at a huge position on a paged-cpu server was refused as
  // too costly (RESOURCE_EXHAUSTED, from the work bound), though no layer is that long.
  const uint64_t pool = uint64_t{1} << 30;  // 1 GiB: 2^30 / (2 · 1 · 128) = 4194304 tokens
  const ExtendArgs wrong = Step(1000000000000, 1, 32, 128);
  const Status s = CheckStepReach(wrong, pool);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("4194304 tokens"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckStepReach(Step(4194303, 1, 32, 128), pool).ok()) << "the last token fits";
  EXPECT_EQ(CheckStepReach(Step(4194303, 2, 32, 128), pool).code(), StatusCode::kFailedPrecondition)
      << "one token past the reach";
  EXPECT_TRUE(CheckStepReach(Step(4096, 1, 32, 128), pool).ok()) << "what frontends send";
}

}  // namespace
}  // namespace attn
