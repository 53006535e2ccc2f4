// Pure logic of the cudnn family (no device, no cuDNN): version check, length buckets, graph
// spec candidates and keys, and the shape checks of CudnnShapeSupports.
#include <gtest/gtest.h>

#include <set>

#include "attn/kernels/cudnn_attention_supports.h"
#include "attn/kernels/cudnn_graph_key.h"
#include "attn/kernels/cudnn_version.h"

namespace attn::kernels {
namespace {

AttentionShape Shape(int64_t B, int64_t T, int64_t S, bool lengths = false) {
  AttentionShape s;
  s.dtype = DType::kBFloat16;
  s.batch = B;
  s.max_q_len = T;
  s.max_kv_len = S;
  s.num_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.scale = 0.088f;
  s.has_lengths = lengths;
  return s;
}

TEST(CudnnVersion, StringAndCheck) {
  EXPECT_EQ(CudnnVersionString(91900), "9.19.0");
  EXPECT_EQ(CudnnVersionString(90102), "9.1.2");
  EXPECT_EQ(CudnnVersionString(0), "unknown");
  EXPECT_TRUE(CheckCudnnVersion(91900, 91900).ok());
  EXPECT_TRUE(CheckCudnnVersion(91900, 92600).ok());
  const Status older = CheckCudnnVersion(92600, 91900);
  EXPECT_EQ(older.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(older.message().find("9.19.0"), std::string::npos) << older.message();
  EXPECT_NE(older.message().find("9.26.0"), std::string::npos) << older.message();
  EXPECT_NE(older.message().find("minor"), std::string::npos) << older.message();
  EXPECT_TRUE(CheckCudnnVersion(91901, 91900).ok());  // patch level only: compatible
  EXPECT_EQ(CheckCudnnVersion(91900, 100100).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckCudnnVersion(91900, 0).code(), StatusCode::kFailedPrecondition);
}

// Windows are int32 band bounds in cuDNN: one that would be narrowed is refused, never cast
// (the Attend validator normalises wide windows to unbounded before any backend; issue 14).
TEST(CudnnSupports, RefusesWindowsThatDoNotFitInt32) {
  AttentionShape s = Shape(1, 6, 3);
  for (int64_t w : {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40}) {
    s.mask = {CausalAlignment::kNone, w, w};
    EXPECT_EQ(CudnnShapeSupports(s, 90, false).code(), StatusCode::kFailedPrecondition) << w;
    s.mask = {CausalAlignment::kBottomRight, w, -1};
    EXPECT_EQ(CudnnShapeSupports(s, 90, false).code(), StatusCode::kFailedPrecondition) << w;
  }
  s.mask = {CausalAlignment::kNone, 1000, 1000};
  EXPECT_TRUE(CudnnShapeSupports(s, 90, false).ok());
}

TEST(CudnnBuckets, PowersOfTwoWithMinimum) {
  EXPECT_EQ(BucketPow2(1, 64), 64);
  EXPECT_EQ(BucketPow2(64, 64), 64);
  EXPECT_EQ(BucketPow2(65, 64), 128);
  EXPECT_EQ(BucketPow2(1000, 1), 1024);
  EXPECT_EQ(BucketPow2(1, 1), 1);
  EXPECT_EQ(BucketPow2(3, 1), 4);
}

TEST(CudnnSpecs, RaggedBucketsShareOneKey) {
  // Different padded and varlen shapes within one bucket map to the same ragged graph.
  std::set<std::string> keys;
  for (int64_t t : {130, 200, 255, 256}) {
    AttentionShape s = Shape(3, t, t, true);
    const auto specs = CudnnSpecCandidates(s, 90, false);
    ASSERT_FALSE(specs.empty());
    EXPECT_TRUE(specs[0].ragged);
    EXPECT_EQ(specs[0].batch, 4);
    EXPECT_EQ(specs[0].q_len, 256);
    keys.insert(specs[0].Key());
  }
  AttentionShape v = Shape(4, 250, 256);
  v.layout = Layout::kVarlen;
  v.has_lengths = true;
  keys.insert(CudnnSpecCandidates(v, 90, false)[0].Key());
  EXPECT_EQ(keys.size(), 1u) << *keys.begin();
}

TEST(CudnnSpecs, DenseFirstOnBucketThenRagged) {
  const auto on = CudnnSpecCandidates(Shape(2, 1024, 1024), 90, false);
  ASSERT_EQ(on.size(), 2u);
  EXPECT_FALSE(on[0].ragged);
  EXPECT_TRUE(on[1].ragged);
  const auto off = CudnnSpecCandidates(Shape(2, 1000, 1000), 90, false);
  ASSERT_EQ(off.size(), 2u);
  EXPECT_TRUE(off[0].ragged);
  EXPECT_FALSE(off[1].ragged);
  EXPECT_EQ(off[1].q_len, 1000);
  // T > S (bottom-right rows with no keys) never goes dense; nor do lengths.
  for (const auto& s : CudnnSpecCandidates(Shape(1, 256, 128), 90, false)) EXPECT_TRUE(s.ragged);
  for (const auto& s : CudnnSpecCandidates(Shape(1, 256, 256, true), 90, false)) {
    EXPECT_TRUE(s.ragged);
  }
}

TEST(CudnnSpecs, KeyDistinguishesEverythingThatChangesTheGraph) {
  const AttentionShape base = Shape(1, 512, 512, true);
  const std::string k0 = CudnnSpecCandidates(base, 90, false)[0].Key();
  std::vector<AttentionShape> variants(8, base);
  variants[0].dtype = DType::kFloat16;
  variants[1].num_heads = 16;
  variants[2].num_kv_heads = 8;
  variants[3].head_dim = 64;
  variants[4].mask.causal = CausalAlignment::kTopLeft;
  variants[5].mask.window_left = 10;
  variants[6].return_lse = true;
  variants[7].max_kv_len = 2048;
  std::set<std::string> keys{k0};
  for (const auto& v : variants) keys.insert(CudnnSpecCandidates(v, 90, false)[0].Key());
  EXPECT_EQ(keys.size(), variants.size() + 1);
  EXPECT_NE(CudnnSpecCandidates(base, 89, false)[0].Key(), k0);  // target SM
  AttentionShape scaled = base;
  scaled.scale = 1.f;  // a runtime value: same graph
  EXPECT_EQ(CudnnSpecCandidates(scaled, 90, false)[0].Key(), k0);
  // Causal ignores window_right (BandKeyRange forces 0): one key.
  AttentionShape c1 = base, c2 = base;
  c1.mask.causal = c2.mask.causal = CausalAlignment::kBottomRight;
  c2.mask.window_right = 0;
  EXPECT_EQ(CudnnSpecCandidates(c1, 90, false)[0].Key(),
            CudnnSpecCandidates(c2, 90, false)[0].Key());
}

TEST(CudnnSpecs, Fp8UsesExactPaddedGraphsOnly) {
  auto specs = CudnnSpecCandidates(Shape(2, 300, 300, true), 90, true);
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_FALSE(specs[0].ragged);
  EXPECT_TRUE(specs[0].padding);
  EXPECT_EQ(specs[0].q_len, 300);
  EXPECT_EQ(specs[0].kind, CudnnGraphKind::kFp8);
  specs = CudnnSpecCandidates(Shape(2, 256, 256), 90, true);
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_FALSE(specs[0].padding);
  AttentionShape v = Shape(2, 256, 256, true);
  v.layout = Layout::kVarlen;
  EXPECT_TRUE(CudnnSpecCandidates(v, 90, true).empty());
}

TEST(CudnnSupports, RefusesWithReasons) {
  AttentionShape s = Shape(1, 128, 128);
  EXPECT_TRUE(CudnnShapeSupports(s, 90, false).ok());
  EXPECT_TRUE(CudnnShapeSupports(s, 90, true).ok());
  AttentionShape f32 = s;
  f32.dtype = DType::kFloat32;
  EXPECT_NE(CudnnShapeSupports(f32, 90, false).message().find("float32"), std::string::npos);
  AttentionShape h = s;
  h.head_dim = 60;
  EXPECT_EQ(CudnnShapeSupports(h, 90, false).code(), StatusCode::kFailedPrecondition);
  h.head_dim = 264;
  EXPECT_EQ(CudnnShapeSupports(h, 90, false).code(), StatusCode::kFailedPrecondition);
  h.head_dim = 72;  // multiple of 8, not of 16
  EXPECT_TRUE(CudnnShapeSupports(h, 90, false).ok());
  EXPECT_EQ(CudnnShapeSupports(h, 90, true).code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(CudnnShapeSupports(s, 75, false).message().find("sm_80"), std::string::npos);
  const Status l4 = CudnnShapeSupports(s, 89, true);
  EXPECT_NE(l4.message().find("sm_90"), std::string::npos) << l4.message();
  AttentionShape br = s;
  br.mask.causal = CausalAlignment::kBottomRight;
  EXPECT_TRUE(CudnnShapeSupports(br, 90, false).ok());
  EXPECT_TRUE(CudnnShapeSupports(br, 90, true).ok());  // T == S, no lengths: = top-left
  EXPECT_EQ(CudnnSpecCandidates(br, 90, true)[0].mask.causal, CausalAlignment::kTopLeft);
  br.max_kv_len = 256;
  const Status fbr = CudnnShapeSupports(br, 90, true);
  EXPECT_NE(fbr.message().find("bottom-right"), std::string::npos) << fbr.message();
  EXPECT_TRUE(CudnnShapeSupports(br, 100, true).ok());
  AttentionShape win = s;  // kNone + window: bottom-right diagonal
  win.mask.window_left = 16;
  EXPECT_EQ(CudnnShapeSupports(win, 90, true).code(), StatusCode::kFailedPrecondition);
  AttentionShape v = s;
  v.layout = Layout::kVarlen;
  EXPECT_NE(CudnnShapeSupports(v, 90, true).message().find("varlen"), std::string::npos);
  AttentionShape big = s;
  big.batch = 1 << 16;
  big.max_q_len = big.max_kv_len = 1 << 12;  // 2^16·2^12·8·128 elements >= 2^31
  EXPECT_NE(CudnnShapeSupports(big, 90, false).message().find("2^31"), std::string::npos);
  AttentionShape bad_scale = s;
  bad_scale.scale = 0.f;
  EXPECT_EQ(CudnnShapeSupports(bad_scale, 90, false).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace attn::kernels
