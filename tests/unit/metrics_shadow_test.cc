// Shadow checking (server/service/shadow_checker.h): the deterministic sampler, the relative
// error and tolerance logic, and the checker end to end on the cpu reference (correct output,
// corrupted output, full queue).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"
#include "metrics/metrics.h"
#include "service/shadow_checker.h"

namespace attn::metrics {
namespace {

using kernels::DType;

TEST(FractionSampler, ZeroAndOne) {
  FractionSampler none(0), all(1), neg(-3), over(7), nan(std::nan(""));
  for (int i = 0; i < 1000; ++i) {
    EXPECT_FALSE(none.Sample());
    EXPECT_TRUE(all.Sample());
    EXPECT_FALSE(neg.Sample());
    EXPECT_TRUE(over.Sample());
    EXPECT_FALSE(nan.Sample());
  }
}

TEST(FractionSampler, ExactCountEvenlySpread) {
  for (double f : {0.5, 0.25, 0.1, 0.3, 0.01, 0.999}) {
    FractionSampler s(f);
    int sampled = 0, longest_gap = 0, gap = 0;
    const int n = 10000;
    for (int i = 0; i < n; ++i) {
      if (s.Sample()) {
        ++sampled;
        gap = 0;
      } else {
        longest_gap = std::max(longest_gap, ++gap);
      }
    }
    EXPECT_EQ(sampled, static_cast<int>(std::floor(n * f + 1e-9))) << f;
    EXPECT_LE(longest_gap, static_cast<int>(std::ceil(1 / f))) << f;
  }
}

TEST(FractionSampler, ThreadSafeExactCount) {
  FractionSampler s(0.1);
  std::atomic<int> sampled{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25000; ++i) sampled += s.Sample() ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sampled.load(), 10000);
}

TEST(ShadowCompare, ToleranceByDtype) {
  EXPECT_EQ(ShadowTolerance(DType::kFloat32), 1e-5);
  EXPECT_EQ(ShadowTolerance(DType::kFloat16), 2e-3);
  EXPECT_EQ(ShadowTolerance(DType::kBFloat16), 1e-2);
  EXPECT_EQ(ShadowTolerance(DType::kFloat8E4M3), 6e-2);
}

TEST(ShadowCompare, KnownErrors) {
  const std::vector<double> ref = {3, 4, 0, 0};  // rows of 2: second row masked
  {
    const std::vector<float> out = {3, 4, 0, 0};
    auto c = CompareWithReference(out.data(), DType::kFloat32, ref.data(), 4, 2, 1e-5);
    EXPECT_EQ(c.relative_error, 0);
    EXPECT_EQ(c.worst_row_error, 0);
    EXPECT_FALSE(c.mismatch);
  }
  {
    const std::vector<float> out = {3, 4.5f, 0, 0};  // ‖(0, .5)‖ / ‖(3, 4)‖ = 0.1
    auto c = CompareWithReference(out.data(), DType::kFloat32, ref.data(), 4, 2, 1e-2);
    EXPECT_NEAR(c.relative_error, 0.1, 1e-12);
    EXPECT_NEAR(c.worst_row_error, 0.1, 1e-12);
    EXPECT_TRUE(c.mismatch);
    auto loose = CompareWithReference(out.data(), DType::kFloat32, ref.data(), 4, 2, 0.1);
    EXPECT_FALSE(loose.mismatch);
  }
  {
    const std::vector<float> out = {3, 4, 1e-30f, 0};  // a masked row must be exactly zero
    auto c = CompareWithReference(out.data(), DType::kFloat32, ref.data(), 4, 2, 1e-2);
    EXPECT_LT(c.relative_error, 1e-20);
    EXPECT_TRUE(std::isinf(c.worst_row_error));
    EXPECT_TRUE(c.mismatch);
  }
  {
    const std::vector<float> out = {3, std::nanf(""), 0, 0};
    auto c = CompareWithReference(out.data(), DType::kFloat32, ref.data(), 4, 2, 1);
    EXPECT_TRUE(std::isinf(c.relative_error));
    EXPECT_TRUE(c.mismatch);
  }
  {
    const std::vector<double> zeros = {0, 0};
    const std::vector<float> out = {0, 0};
    EXPECT_FALSE(CompareWithReference(out.data(), DType::kFloat32, zeros.data(), 2, 2, 1e-5)
                     .mismatch);
  }
}

TEST(ShadowCompare, OneBadRowFailsEvenWhenTheTotalPasses) {
  // 100 rows of 4; one row off by 6% of its norm: total error ~0.6% < 1e-2 but the row is
  // over 5 × 1e-2.
  std::vector<double> ref(400, 1.0);
  std::vector<float> out(400, 1.0f);
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(40 + i)] = 1.06f;
  auto c = CompareWithReference(out.data(), DType::kFloat32, ref.data(), 400, 4, 1e-2);
  EXPECT_LT(c.relative_error, 1e-2);
  EXPECT_NEAR(c.worst_row_error, 0.06, 1e-6);
  EXPECT_TRUE(c.mismatch);
}

TEST(ShadowCompare, Bf16RoundingIsWithinTolerance) {
  std::mt19937 rng(7);
  std::normal_distribution<double> nd;
  std::vector<double> ref(4096);
  std::vector<uint16_t> out(4096);
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = nd(rng);
    out[i] = kernels::FloatToBf16(static_cast<float>(ref[i]));
  }
  auto c = CompareWithReference(out.data(), DType::kBFloat16, ref.data(), 4096, 64, 1e-2);
  EXPECT_GT(c.relative_error, 1e-4);
  EXPECT_LT(c.relative_error, 4e-3);
  EXPECT_FALSE(c.mismatch);
}

// A small padded fp32 problem with its inputs and a correct output from the cpu backend.
struct Problem {
  ValidatedAttend v;
  std::vector<float> q, k, v_data, o;
  explicit Problem(DType dtype = DType::kFloat32) {
    auto& s = v.shape;
    s.layout = kernels::Layout::kPadded;
    s.dtype = dtype;
    s.batch = 2;
    s.max_q_len = 5;
    s.max_kv_len = 7;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 16;
    s.mask.causal = kernels::CausalAlignment::kBottomRight;
    s.scale = 0.25f;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    q.resize(static_cast<size_t>(s.q_elements()));
    k.resize(static_cast<size_t>(s.kv_elements()));
    v_data.resize(k.size());
    for (auto* t : {&q, &k, &v_data}) {
      for (auto& x : *t) x = nd(rng);
    }
    o.resize(q.size());
    v.q = q.data();
    v.k = k.data();
    v.v = v_data.data();
    v.o_bytes = o.size() * sizeof(float);
    kernels::AttentionTensors t;
    t.q = q.data();
    t.k = k.data();
    t.v = v_data.data();
    t.o = o.data();
    EXPECT_TRUE(kernels::CpuAttention(s, t, 1).ok());
  }
};

TEST(ShadowChecker, DisabledAtZero) {
  ShadowChecker c({0.0}, nullptr);
  EXPECT_FALSE(c.enabled());
  EXPECT_FALSE(c.ShouldSample());
}

TEST(ShadowChecker, ChecksCorrectAndCorruptOutputs) {
  Metrics m({"cpu"}, {});
  const int cpu = m.BackendIndex("cpu");
  ShadowChecker c({1.0}, &m);
  ASSERT_TRUE(c.enabled());
  Problem p;
  ASSERT_TRUE(c.ShouldSample());
  c.Submit(cpu, p.v, p.o.data());
  ASSERT_TRUE(c.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(c.checked(), 1);
  EXPECT_EQ(c.mismatches(), 0);
  // Corrupt one output row: a mismatch.
  std::vector<float> bad = p.o;
  for (int i = 0; i < 16; ++i) bad[static_cast<size_t>(16 * 3 + i)] += 0.5f;
  c.Submit(cpu, p.v, bad.data());
  ASSERT_TRUE(c.WaitIdle(std::chrono::seconds(20)));
  EXPECT_EQ(c.checked(), 2);
  EXPECT_EQ(c.mismatches(), 1);
  const std::string t = m.Render();
  EXPECT_NE(t.find("attn_shadow_relative_error_count{backend=\"cpu\"} 2"), std::string::npos)
      << t;
  EXPECT_NE(t.find("attn_shadow_mismatches_total{backend=\"cpu\"} 1"), std::string::npos);
  // The correct output (fp32, rounded once from float64) lands in the lowest buckets.
  EXPECT_NE(t.find("attn_shadow_relative_error_bucket{backend=\"cpu\",le=\"1e-06\"} 1"),
            std::string::npos);
  c.Stop();
  c.Stop();  // idempotent
}

TEST(ShadowChecker, FullQueueDropsAndCounts) {
  Metrics m({"cpu"}, {});
  ShadowChecker::Options o;
  o.fraction = 1;
  o.max_queued = 0;  // every sampled call is dropped
  ShadowChecker c(o, &m);
  Problem p;
  for (int i = 0; i < 3; ++i) c.Submit(1, p.v, p.o.data());
  EXPECT_EQ(c.dropped(), 3);
  EXPECT_EQ(c.checked(), 0);
  EXPECT_NE(m.Render().find("attn_shadow_dropped_total{backend=\"cpu\"} 3"), std::string::npos);

  ShadowChecker::Options small;
  small.fraction = 1;
  small.max_queued_bytes = 16;  // smaller than any job
  ShadowChecker d(small, nullptr);
  d.Submit(1, p.v, p.o.data());
  EXPECT_EQ(d.dropped(), 1);
}

TEST(ShadowChecker, StopDiscardsWaitingJobs) {
  ShadowChecker::Options o;
  o.fraction = 1;
  o.max_queued = 64;
  auto c = std::make_unique<ShadowChecker>(o, nullptr);
  Problem p;
  for (int i = 0; i < 64; ++i) c->Submit(1, p.v, p.o.data());
  c->Stop();
  EXPECT_LE(c->checked(), 64);
  c.reset();  // no hang, no leak
}

}  // namespace
}  // namespace attn::metrics
