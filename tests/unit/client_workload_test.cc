#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/dtype_codec.h"
#include "loadgen/random_normal.h"
#include "loadgen/workload.h"

namespace attn::loadgen {
namespace {

TEST(ClientWorkload, ScaleTokensRoundsAndClamps) {
  TokenScaling s;  // scale 1, [1, 16384]
  EXPECT_EQ(ScaleTokens(374, s), 374);
  EXPECT_EQ(ScaleTokens(0, s), 1);
  EXPECT_EQ(ScaleTokens(20000, s), 16384);
  s.scale = 0.5;
  EXPECT_EQ(ScaleTokens(375, s), 188);  // 187.5 rounds half away from zero
  EXPECT_EQ(ScaleTokens(374, s), 187);
  EXPECT_EQ(ScaleTokens(1, s), 1);  // 0.5 -> 1
  s.scale = 0.1;
  s.min_tokens = 16;
  s.max_tokens = 128;
  EXPECT_EQ(ScaleTokens(100, s), 16);
  EXPECT_EQ(ScaleTokens(1004, s), 100);
  EXPECT_EQ(ScaleTokens(14050, s), 128);
}

TEST(ClientWorkload, PlanSchedulesFromTheFirstRowAndCycles) {
  std::vector<TraceRecord> rows = {{100.0, 10, 1}, {100.5, 20, 1}, {102.0, 30, 1}};
  TokenScaling s;
  const RequestPlan unscheduled(rows, s, 0);
  EXPECT_EQ(unscheduled.At(1).tokens, 20);
  EXPECT_EQ(unscheduled.At(2).send_offset_s, 0);
  const RequestPlan plan(rows, s, 2.0);
  EXPECT_TRUE(plan.At(0).scheduled);
  EXPECT_FALSE(unscheduled.At(0).scheduled);
  EXPECT_DOUBLE_EQ(plan.At(0).send_offset_s, 0);
  EXPECT_DOUBLE_EQ(plan.At(1).send_offset_s, 1.0);
  EXPECT_DOUBLE_EQ(plan.At(2).send_offset_s, 4.0);
  // Cycle: span 2 s + mean gap 1 s = 3 s of trace time per cycle.
  EXPECT_EQ(plan.At(3).tokens, 10);
  EXPECT_DOUBLE_EQ(plan.At(3).send_offset_s, 6.0);
  EXPECT_DOUBLE_EQ(plan.At(4).send_offset_s, 7.0);
  const RequestPlan fixed = RequestPlan::Fixed(512);
  EXPECT_EQ(fixed.At(0).tokens, 512);
  EXPECT_EQ(fixed.At(99).tokens, 512);
  EXPECT_EQ(fixed.At(99).send_offset_s, 0);
}

TEST(ClientWorkload, BuildsCausalSelfAttentionRequest) {
  ModelShape shape;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  attention::v1::AttendRequest request;
  BuildAttendRequest(shape, 37, 7, &request);
  EXPECT_EQ(request.layout(), attention::v1::LAYOUT_PADDED);
  EXPECT_EQ(request.mask().causal(), attention::v1::CAUSAL_BOTTOM_RIGHT);
  ASSERT_EQ(request.q().shape_size(), 4);
  EXPECT_EQ(request.q().shape(1), 37);
  EXPECT_EQ(request.q().shape(2), 4);
  EXPECT_EQ(request.k().shape(1), 37);
  EXPECT_EQ(request.k().shape(2), 2);
  EXPECT_EQ(request.q().dtype(), attention::v1::BFLOAT16);
  EXPECT_EQ(request.q().data().size(), 37u * 4 * 16 * 2);
  EXPECT_EQ(request.v().data().size(), 37u * 2 * 16 * 2);
  EXPECT_FALSE(request.has_scale());
  EXPECT_TRUE(request.q_lengths().empty());

  std::vector<double> q;
  ASSERT_TRUE(DecodeValues(request.q().data(), request.q().dtype(), &q));
  double sum = 0, sum_sq = 0;
  for (double x : q) {
    EXPECT_NE(x, 0.0);
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / q.size();
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(sum_sq / q.size() - mean * mean, 1.0, 0.1);

  attention::v1::AttendRequest again, other;
  BuildAttendRequest(shape, 37, 7, &again);
  BuildAttendRequest(shape, 37, 8, &other);
  EXPECT_EQ(again.q().data(), request.q().data());
  EXPECT_NE(other.q().data(), request.q().data());
  EXPECT_NE(request.q().data(), request.k().data());
}

TEST(ClientWorkload, ShapeValidation) {
  ModelShape shape;
  EXPECT_EQ(ValidateShape(shape), "");
  shape.kv_heads = 3;
  EXPECT_NE(ValidateShape(shape), "");
}

TEST(ClientWorkload, VerifySampleIsDeterministicWithTheRightFraction) {
  int hits = 0;
  for (int i = 0; i < 10000; ++i) {
    const bool v = ShouldVerify(42, i, 0.1);
    EXPECT_EQ(v, ShouldVerify(42, i, 0.1));
    hits += v;
  }
  EXPECT_NEAR(hits, 1000, 150);
  EXPECT_FALSE(ShouldVerify(42, 3, 0.0));
  EXPECT_TRUE(ShouldVerify(42, 3, 1.0));
}

TEST(ClientWorkload, NormalQuantileMatchesKnownValues) {
  EXPECT_NEAR(NormalQuantile(0.5), 0.0, 1e-12);
  EXPECT_NEAR(NormalQuantile(0.975), 1.959963984540054, 1e-9);
  EXPECT_NEAR(NormalQuantile(0.001), -3.090232306167813, 1e-9);
}

}  // namespace
}  // namespace attn::loadgen
