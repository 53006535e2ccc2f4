// Host logic of the fused kernel's paged K/V path (no device needed): FusedPagedSupports'
// acceptances and refusals (codes and reasons), plan refusals that happen before the device is
// touched, the paged tile list (each tile is also a contiguous variant and fits an L4), and the
// page arithmetic the kernel shares with the page format (PagedRowElement vs PagedKvPool).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "attn/kernels/fused_attention.h"
#include "attn/kernels/paged_kv.h"
#include "fused_params.h"  // kernels/fused: PagedRowElement, the variant lists

namespace attn::kernels {
namespace {

FusedPagedShape Valid() {
  FusedPagedShape s;
  s.dtype = DType::kBFloat16;
  s.kv_dtype = DType::kBFloat16;
  s.batch = 3;
  s.max_q_len = 4096;
  s.max_kv_len = 8192;
  s.total_q = 5000;
  s.num_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.page_tokens = 16;
  s.scale = 0.088f;
  return s;
}

void ExpectRefused(const FusedPagedShape& s, StatusCode code, const std::string& words) {
  const Status st = FusedPagedSupports(s);
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
}

TEST(FusedPagedSupports, Accepts16BitPagesAtHeadDims64And128) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int64_t hd : {64, 128})
      for (int64_t pt : {1, 8, 16, 64, 128, 65536}) {
        FusedPagedShape s = Valid();
        s.dtype = s.kv_dtype = dt;
        s.head_dim = hd;
        s.page_tokens = pt;
        EXPECT_TRUE(FusedPagedSupports(s).ok()) << FusedPagedSupports(s).ToString();
      }
  FusedPagedShape s = Valid();
  for (MaskSpec m : {MaskSpec{CausalAlignment::kNone, -1, -1},
                     MaskSpec{CausalAlignment::kTopLeft, -1, -1},
                     MaskSpec{CausalAlignment::kBottomRight, 128, -1}}) {
    s.mask = m;
    EXPECT_TRUE(FusedPagedSupports(s).ok());
  }
  s = Valid();
  s.batch = 0;  // empty launches are fine
  s.total_q = 0;
  s.max_q_len = 0;
  EXPECT_TRUE(FusedPagedSupports(s).ok());
  EXPECT_EQ(Valid().mask.causal, CausalAlignment::kBottomRight);  // the default mask
}

TEST(FusedPagedSupports, Refusals) {
  FusedPagedShape s = Valid();
  s.kv_dtype = DType::kFloat8E4M3;
  ExpectRefused(s, StatusCode::kUnimplemented, "FP8");
  ExpectRefused(s, StatusCode::kUnimplemented, "paged decode");
  s = Valid();
  s.kv_dtype = DType::kFloat16;  // q bf16, pages fp16
  ExpectRefused(s, StatusCode::kInvalidArgument, "must be the query dtype");
  for (int64_t hd : {32, 80, 96, 256, 48}) {
    s = Valid();
    s.head_dim = hd;
    ExpectRefused(s, StatusCode::kUnimplemented, "head dim " + std::to_string(hd));
  }
  s = Valid();
  s.dtype = s.kv_dtype = DType::kFloat32;
  ExpectRefused(s, StatusCode::kFailedPrecondition, "dtype");
  for (int64_t pt : {0, -16, 24, 131072}) {
    s = Valid();
    s.page_tokens = pt;
    ExpectRefused(s, StatusCode::kInvalidArgument, "page_tokens");
  }
  s = Valid();
  s.num_kv_heads = 7;
  ExpectRefused(s, StatusCode::kInvalidArgument, "multiple");
  s = Valid();
  s.head_dim = 0;
  ExpectRefused(s, StatusCode::kInvalidArgument, "positive");
  s = Valid();
  s.scale = 0.f;
  ExpectRefused(s, StatusCode::kFailedPrecondition, "scale");
  s = Valid();
  s.batch = 70000;
  ExpectRefused(s, StatusCode::kInvalidArgument, "65535");
  s = Valid();
  s.max_kv_len = int64_t{1} << 30;
  ExpectRefused(s, StatusCode::kInvalidArgument, "2^30");
  s = Valid();
  s.total_q = -1;
  EXPECT_EQ(FusedPagedSupports(s).code(), StatusCode::kInvalidArgument);
}

// Refusals come from FusedPagedSupports before any device is touched: the same codes with or
// without a GPU.
TEST(FusedPagedPlan, RefusesBeforeTouchingTheDevice) {
  FusedPagedShape s = Valid();
  s.kv_dtype = DType::kFloat8E4M3;
  EXPECT_EQ(FusedPagedPlanFor(s, 0).status().code(), StatusCode::kUnimplemented);
  s = Valid();
  s.page_tokens = 24;
  EXPECT_EQ(FusedPagedPlanFor(s, 0).status().code(), StatusCode::kInvalidArgument);
  s = Valid();
  s.head_dim = 96;
  EXPECT_EQ(FusedPagedPlanFor(s, 0).status().code(), StatusCode::kUnimplemented);
}

// Every paged tile is one of the contiguous variants of its head dim (FusedPagedPlan::variant,
// the bit-identical comparison of the GPU test) and fits an L4's 99 KB of shared memory.
TEST(FusedPagedPlan, PagedTilesAreContiguousVariants) {
  struct Tile {
    int h, bm, bn, w;
  };
  std::vector<Tile> all, paged;
#define ATTN_TEST_TILE_ALL(H, BM, BN, W) all.push_back({H, BM, BN, W});
#define ATTN_TEST_TILE_PAGED(H, BM, BN, W) paged.push_back({H, BM, BN, W});
  ATTN_FUSED_ALL_VARIANTS(ATTN_TEST_TILE_ALL)
  ATTN_FUSED_PAGED_ALL_VARIANTS(ATTN_TEST_TILE_PAGED)
#undef ATTN_TEST_TILE_ALL
#undef ATTN_TEST_TILE_PAGED
  ASSERT_EQ(paged.size(), 2u);  // one per head dim: 64 and 128
  for (const Tile& p : paged) {
    bool found = false;
    for (const Tile& a : all) found |= a.h == p.h && a.bm == p.bm && a.bn == p.bn && a.w == p.w;
    EXPECT_TRUE(found) << "paged tile h" << p.h << " " << p.bm << "x" << p.bn << "/" << p.w;
    EXPECT_LE(fused::FusedSmemBytes(p.h, p.bm, p.bn), 101376);
    EXPECT_EQ(p.bn % (p.w * 32 / 8), 0) << "whole copy passes";
  }
}

// The kernel's shift form of the page format equals PagedKvPool::Offset (token j at page
// block_table[j / page_tokens], slot j % page_tokens) for every page size, with 64-bit offsets.
TEST(FusedPagedPlan, PagedRowElementMatchesThePageFormat) {
  std::mt19937_64 rng(5);
  for (int shift = 0; shift <= 16; ++shift) {
    PagedKvPool pool;
    pool.page_tokens = 1 << shift;
    for (int k : {1, 2, 8}) {
      pool.num_kv_heads = k;
      for (int hd : {64, 128}) {
        pool.head_dim = hd;
        for (int i = 0; i < 200; ++i) {
          const int64_t page = static_cast<int64_t>(rng() % (int64_t{1} << 22));
          const int64_t h = static_cast<int64_t>(rng() % k);
          const int64_t j = static_cast<int64_t>(rng() % (int64_t{1} << 29));
          ASSERT_EQ(fused::PagedRowElement(page, k, h, shift, j, hd),
                    pool.Offset(page, h, j % pool.page_tokens))
              << "shift " << shift << " page " << page << " j " << j;
        }
      }
    }
  }
  // Offsets past 2^31 elements stay exact.
  EXPECT_EQ(fused::PagedRowElement(int64_t{1} << 24, 8, 7, 4, 15, 128),
            (((int64_t{1} << 24) * 8 + 7) * 16 + 15) * 128);
}

}  // namespace
}  // namespace attn::kernels
