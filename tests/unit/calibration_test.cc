// auto from measurement: buckets, the pure selection from (injected) timings, the table's file
// round trip and device-key check, the warm-up list parser, the registry's use of a table, and
// a real calibration run with the cpu backend alone on a tiny grid.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "backends/backend_registry.h"
#include "backends/calibration.h"
#include "backends/calibration_runner.h"
#include "backends/cpu_backend.h"
#include "backends/cudnn_warmup.h"
#include "backends/unavailable_backend.h"

namespace attn {
namespace {

using kernels::AttentionShape;
using kernels::CausalAlignment;
using kernels::DType;

AttentionShape Shape(int64_t T, int64_t S, int64_t N = 16, int64_t K = 16) {
  AttentionShape s;
  s.dtype = DType::kBFloat16;
  s.batch = 1;
  s.max_q_len = T;
  s.max_kv_len = S;
  s.num_heads = N;
  s.num_kv_heads = K;
  s.head_dim = 64;
  s.scale = 0.125f;
  s.mask.causal = CausalAlignment::kBottomRight;
  return s;
}

const std::vector<int64_t> kLengths{128, 512, 2048, 8192};

TEST(CalibrationBuckets, NearestLengthClassInLog2) {
  EXPECT_EQ(BucketOf(Shape(512, 512), kLengths), "bf16 h64 mha br padded L512");
  EXPECT_EQ(BucketOf(Shape(1, 700), kLengths), "bf16 h64 mha br padded L512");
  EXPECT_EQ(BucketOf(Shape(1024, 1024), kLengths), "bf16 h64 mha br padded L2048");  // tie: up
  EXPECT_EQ(BucketOf(Shape(10, 10), kLengths), "bf16 h64 mha br padded L128");
  EXPECT_EQ(BucketOf(Shape(100000, 100000), kLengths), "bf16 h64 mha br padded L8192");
  EXPECT_EQ(BucketOf(Shape(128, 128, 16, 4), kLengths), "bf16 h64 gqa br padded L128");
  EXPECT_EQ(BucketOf(Shape(128, 128, 16, 1), kLengths), "bf16 h64 mqa br padded L128");
  AttentionShape w = Shape(128, 128);
  w.mask.window_left = 8;
  EXPECT_EQ(BucketOf(w, kLengths), "bf16 h64 mha br+win padded L128");
  w.layout = kernels::Layout::kVarlen;
  EXPECT_EQ(BucketOf(w, kLengths), "bf16 h64 mha br+win varlen L128");
}

// The grid times 3/4 of each length class: inside the class (BucketOf maps it back) and off
// the powers of two where cudnn would run its dense graph rather than the ragged one most
// requests get.
TEST(CalibrationGrid, RepresentativeShapesAreInsideTheirClassAndOffPowersOfTwo) {
  CalibrationGrid g;
  g.dtypes = {DType::kBFloat16};
  g.head_dims = {64};
  g.groups = {"mha"};
  g.masks = {CausalAlignment::kBottomRight};
  g.lengths = {128, 512, 2048, 8192};
  const std::vector<AttentionShape> shapes = GridShapes(g);
  ASSERT_EQ(shapes.size(), g.lengths.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t L = g.lengths[i];
    EXPECT_EQ(shapes[i].max_q_len, L * 3 / 4);
    EXPECT_EQ(shapes[i].max_kv_len, L * 3 / 4);
    EXPECT_NE(shapes[i].max_q_len & (shapes[i].max_q_len - 1), 0) << "a power of two";
    EXPECT_EQ(BucketOf(shapes[i], g.lengths), "bf16 h64 mha br padded L" + std::to_string(L));
  }
}

TEST(CalibrationSelect, FastestThatPassedParityWins) {
  // Injected timings: cudnn fastest in A but failed parity; fused then wins A.
  std::vector<CalibrationSample> samples = {
      {"A", "fused", true, 120.0, ""},  {"A", "cudnn", false, 50.0, "parity failed"},
      {"A", "naive", true, 900.0, ""},  {"B", "fused", true, 300.0, ""},
      {"B", "cudnn", true, 250.0, ""},  {"C", "naive", false, 0.0, "unsupported"}};
  const CalibrationTable t = SelectFastest(samples, kLengths, "dev");
  EXPECT_EQ(t.choice.at("A"), "fused");
  EXPECT_EQ(t.choice.at("B"), "cudnn");
  EXPECT_EQ(t.choice.count("C"), 0u);
  EXPECT_EQ(t.samples.at("A").size(), 3u);
  // Ties keep the earlier sample.
  const CalibrationTable tie = SelectFastest({{"X", "a", true, 10, ""}, {"X", "b", true, 10, ""}},
                                             kLengths, "dev");
  EXPECT_EQ(tie.choice.at("X"), "a");
}

TEST(CalibrationFile, RoundTripAndDeviceKey) {
  const std::string key = CalibrationDeviceKey("NVIDIA H200", "13.0", "gcc cuda13 90a");
  std::vector<CalibrationSample> samples = {{"bf16 h64 mha br padded L512", "fused", true, 80, ""},
                                            {"bf16 h64 mha br padded L512", "cudnn", true, 70, ""},
                                            {"bf16 h64 mha br padded L512", "naive", false, 0,
                                             "parity failed: rel_l2 0.5"}};
  const CalibrationTable t = SelectFastest(samples, kLengths, key);
  const std::string path = ::testing::TempDir() + "/calibration_roundtrip.json";
  ASSERT_TRUE(SaveCalibration(path, t).ok());
  auto back = LoadCalibration(path, key);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->choice, t.choice);
  EXPECT_EQ(back->lengths, t.lengths);
  ASSERT_EQ(back->samples.at("bf16 h64 mha br padded L512").size(), 3u);
  EXPECT_EQ(back->samples.at("bf16 h64 mha br padded L512")[2].note, "parity failed: rel_l2 0.5");
  std::string bucket;
  EXPECT_EQ(back->ChoiceFor(Shape(600, 600), &bucket), "cudnn");
  EXPECT_EQ(bucket, "bf16 h64 mha br padded L512");
  // Another device or build: refused with both keys named.
  auto other = LoadCalibration(path, CalibrationDeviceKey("NVIDIA L4", "13.0", "x"));
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("NVIDIA L4"), std::string::npos);
  EXPECT_EQ(LoadCalibration(path + ".missing", key).status().code(), StatusCode::kNotFound);
  // A hand-edited choice that contradicts the samples is caught.
  std::string json = CalibrationToJson(t);
  const size_t at = json.find("\"choice\": \"cudnn\"");
  ASSERT_NE(at, std::string::npos) << json;
  json.replace(at, 17, "\"choice\": \"naive\"");
  EXPECT_EQ(CalibrationFromJson(json).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibrationFromJson("{not json").status().code(), StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

TEST(CalibrationRegistry, AutoUsesTheTableThenTheStaticOrder) {
  BackendRegistry reg;
  reg.Add(std::make_unique<UnavailableBackend>("fused", "no GPU", "test"), 10);
  reg.Add(std::make_unique<CpuBackend>(1), 100);
  auto table = std::make_shared<CalibrationTable>(
      SelectFastest({{"bf16 h64 mha br padded L512", "cpu", true, 5, ""},
                     {"bf16 h64 mha br padded L2048", "fused", true, 1, ""}},
                    kLengths, "k"));
  reg.SetCalibration(table);
  auto c = reg.Resolve("", "auto", Shape(500, 500));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend->name(), "cpu");
  EXPECT_EQ(c->bucket, "bf16 h64 mha br padded L512");
  EXPECT_NE(c->reason.find("calibrated"), std::string::npos) << c->reason;
  // The bucket's choice is unavailable here: static order, bucket still named.
  auto f = reg.Resolve("", "auto", Shape(2000, 2000));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->backend->name(), "cpu");
  EXPECT_EQ(f->bucket, "bf16 h64 mha br padded L2048");
  EXPECT_NE(f->reason.find("preference order"), std::string::npos) << f->reason;
  // A named backend ignores the table.
  auto n = reg.Resolve("cpu", "auto", Shape(500, 500));
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(n->bucket.empty());
  reg.SetCalibration(nullptr);
  auto s = reg.Resolve("", "auto", Shape(500, 500));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->bucket.empty());
}

TEST(CalibrationRun, CpuAloneOnATinyGrid) {
  CpuBackend cpu(2);
  UnavailableBackend gone("fused", "no GPU", "test");
  CalibrationOptions opt;
  opt.grid.head_dims = {32};
  opt.grid.groups = {"mha", "mqa"};
  opt.grid.masks = {CausalAlignment::kNone, CausalAlignment::kBottomRight};
  opt.grid.lengths = {16, 64};
  opt.reps = 2;
  auto t = RunCalibration({&gone, &cpu}, opt, "cpu-test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->choice.size(), 8u);
  for (const auto& [bucket, backend] : t->choice) EXPECT_EQ(backend, "cpu") << bucket;
  for (const auto& [bucket, samples] : t->samples) {
    ASSERT_EQ(samples.size(), 1u) << bucket;  // the unavailable backend is not timed
    EXPECT_TRUE(samples[0].parity_ok) << samples[0].note;
    EXPECT_GE(samples[0].median_us, 0.0);
  }
  EXPECT_EQ(t->device_key, "cpu-test");
}

TEST(CudnnWarmup, ParsesEntriesAndRejectsBadOnes) {
  auto shapes = ParseCudnnWarmup("bf16:8:8:64:bottom_right:64-256;fp16:16:4:128:none:100-128");
  ASSERT_TRUE(shapes.ok()) << shapes.status().ToString();
  // 64, 128, 256 (x2: with and without lengths) + 128 (the only power of two in 100-128, x2).
  ASSERT_EQ(shapes->size(), 8u);
  EXPECT_EQ((*shapes)[0].max_q_len, 64);
  EXPECT_TRUE((*shapes)[0].has_lengths);
  EXPECT_FALSE((*shapes)[1].has_lengths);
  EXPECT_EQ((*shapes)[0].mask.causal, CausalAlignment::kBottomRight);
  EXPECT_EQ((*shapes)[6].dtype, DType::kFloat16);
  EXPECT_EQ((*shapes)[6].max_kv_len, 128);
  EXPECT_EQ((*shapes)[6].num_kv_heads, 4);
  EXPECT_TRUE(ParseCudnnWarmup("")->empty());
  for (const char* bad : {"bf16:8:8:64:bottom_right", "f32:8:8:64:none:64-64",
                          "bf16:8:3:64:none:64-64", "bf16:8:8:64:diag:64-64",
                          "bf16:8:8:64:none:256-64", "bf16:8:8:x:none:64-64"}) {
    auto r = ParseCudnnWarmup(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--cudnn-warmup"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace attn
