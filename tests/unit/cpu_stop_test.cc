// The cpu reference stops when its StopCheck says so (issue 16 item 1): a long computation
// returns CANCELLED within milliseconds of the check turning true, and a check that never
// fires changes nothing (bitwise-equal output).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/cpu_attention.h"

namespace attn::kernels {
namespace {

AttentionShape Shape(int64_t t) {  // q = k = v of (1, t, 1, 1), float32: one long work item
  AttentionShape s;
  s.batch = 1;
  s.max_q_len = t;
  s.max_kv_len = t;
  s.num_heads = 1;
  s.num_kv_heads = 1;
  s.head_dim = 1;
  s.dtype = DType::kFloat32;
  s.scale = 1.0f;
  return s;
}

TEST(CpuStop, LongComputationStopsSoonAfterTheCheckFires) {
  const int64_t t = 60000;  // 3.6e9 pairs: tens of seconds if it ran to the end
  std::vector<float> x(t, 0.5f), o(t);
  AttentionTensors tensors;
  tensors.q = tensors.k = tensors.v = x.data();
  tensors.o = o.data();
  const auto start = std::chrono::steady_clock::now();
  const auto fire_at = start + std::chrono::milliseconds(200);
  std::atomic<int64_t> checks{0};
  const Status s = CpuAttention(Shape(t), tensors, 2, [&] {
    checks.fetch_add(1);
    return std::chrono::steady_clock::now() >= fire_at;
  });
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_LT(ms, 200 + 150) << "stopped " << ms - 200 << " ms after the check fired";
  EXPECT_GT(checks.load(), 10) << "the check must be asked in chunks, not once";
}

TEST(CpuStop, ACheckThatNeverFiresChangesNothing) {
  const int64_t t = 3000;
  std::vector<float> q(t), k(t), v(t), o1(t), o2(t);
  for (int64_t i = 0; i < t; ++i) {
    q[i] = static_cast<float>(i % 7) * 0.1f;
    k[i] = static_cast<float>(i % 5) * 0.2f;
    v[i] = static_cast<float>(i % 3);
  }
  AttentionTensors a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o1.data();
  ASSERT_TRUE(CpuAttention(Shape(t), a, 2).ok());
  a.o = o2.data();
  std::atomic<int64_t> checks{0};
  ASSERT_TRUE(CpuAttention(Shape(t), a, 2, [&] {
                checks.fetch_add(1);
                return false;
              }).ok());
  EXPECT_GT(checks.load(), 0);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), t * sizeof(float)), 0);
}

}  // namespace
}  // namespace attn::kernels
