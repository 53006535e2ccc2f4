// Unit tests of the paged K/V page format on the host (kernels/paged_kv_cpu.h): every FP8 E4M3
// code round-trips and saturates, and append/gather through a shuffled block table, in fp32,
// bf16 and fp8, with the element layout (page, head, slot, dim). No network, no device.
#include "attn/kernels/paged_kv_cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "kv_cache/page_pool.h"
#include "kv_cache/host_pool.h"
#include "kv_test_fixtures.h"

namespace attn {
namespace {

using kernels::DType;

TEST(Fp8E4M3, EveryCodeRoundTripsAndSaturates) {
  for (int b = 0; b < 256; ++b) {
    const float x = kernels::Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(x)) {
      EXPECT_TRUE((b & 0x7f) == 0x7f);
      continue;
    }
    bool sat = true;
    const uint8_t back = kernels::FloatToFp8E4M3(x, &sat);
    EXPECT_FALSE(sat);
    if (x == 0.f) {
      EXPECT_EQ(back & 0x7f, 0);
    } else {
      EXPECT_EQ(back, b) << "code " << b << " value " << x;
    }
  }
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(0x7e), 448.f);
  bool sat = false;
  EXPECT_EQ(kernels::FloatToFp8E4M3(1000.f, &sat), 0x7e);
  EXPECT_TRUE(sat);
  EXPECT_EQ(kernels::FloatToFp8E4M3(-1e9f, &sat), 0xfe);
  EXPECT_TRUE(sat);
  // Round to nearest even: 1.0625 lies halfway between 1 (mantissa 0) and 1.125
  // (mantissa 1).
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(kernels::FloatToFp8E4M3(1.0625f)), 1.f);
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(kernels::FloatToFp8E4M3(1.1875f)), 1.25f);
  // Subnormals: 2^-9 is the smallest.
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(kernels::FloatToFp8E4M3(std::ldexp(1.f, -9))),
            std::ldexp(1.f, -9));
  EXPECT_EQ(kernels::FloatToFp8E4M3(std::nanf("")), 0x7f);
}

using testing::PoolFixture;

TEST(PagedKvCpu, AppendGatherThroughShuffledBlockTable) {
  PoolFixture f;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat8E4M3}) {
    SubPool *sub = *f.pool.GetClass({2, 8, dt});
    const int64_t T = 11, K = 2, H = 8;
    std::vector<int32_t> pages(3);
    ASSERT_TRUE(f.pool.Allocate(sub, 3, pages.data()).ok());
    std::swap(pages[0], pages[2]);
    std::vector<float> k(T * K * H), v(T * K * H);
    std::mt19937 rng(1);
    std::normal_distribution<float> n;
    for (auto &x : k) x = n(rng);
    for (auto &x : v) x = n(rng);
    const float ks[2] = {0.02f, 0.03f}, vs[2] = {0.02f, 0.025f};
    int64_t sat = 0;
    // Two appends: 5 tokens, then 6 (crossing page boundaries).
    ASSERT_TRUE(kernels::PagedAppendCpu(sub->view(), pages.data(), 3, 0, 5, k.data(), v.data(),
                                        DType::kFloat32, ks, vs, &sat)
                    .ok());
    ASSERT_TRUE(kernels::PagedAppendCpu(sub->view(), pages.data(), 3, 5, 6, k.data() + 5 * K * H,
                                        v.data() + 5 * K * H, DType::kFloat32, ks, vs, &sat)
                    .ok());
    std::vector<float> ko(T * K * H), vo(T * K * H);
    ASSERT_TRUE(kernels::PagedGatherCpu(sub->view(), pages.data(), 3, T, ks, vs, DType::kFloat32,
                                        ko.data(), vo.data())
                    .ok());
    const double tol = dt == DType::kFloat32 ? 0 : dt == DType::kBFloat16 ? 1e-2 : 7e-2;
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_LE(std::fabs(ko[i] - k[i]), tol * std::max(1.f, std::fabs(k[i]))) << i;
      ASSERT_LE(std::fabs(vo[i] - v[i]), tol * std::max(1.f, std::fabs(v[i]))) << i;
    }
    // The page format: element (page, head, slot, dim) at ((p*K +
    // h)*page_tokens + t)*H + d.
    if (dt == DType::kFloat32) {
      const float *kp = static_cast<const float *>(sub->view().k_pages);
      const int64_t tok = 6, h = 1, d = 3;
      EXPECT_EQ(kp[sub->view().Offset(pages[tok / 4], h, tok % 4) + d], k[(tok * K + h) * H + d]);
      EXPECT_EQ(sat, 0);
    }
    f.pool.Release(sub, pages.data(), 3);
    // Too few blocks is refused.
    EXPECT_FALSE(kernels::PagedGatherCpu(sub->view(), pages.data(), 1, T, ks, vs, DType::kFloat32,
                                         ko.data(), vo.data())
                     .ok());
  }
  EXPECT_EQ(f.memory->used(), 0u);
}

}  // namespace
}  // namespace attn
