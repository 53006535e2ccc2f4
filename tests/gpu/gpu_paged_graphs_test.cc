// CUDA graph replay of GPU paged steps (issue 18 item 4; device/lane.h, gpu_paged_graph_key.h):
// the same batches of sequence steps run through two GPU KV caches, one whose GpuPagedAttention
// replays captured graphs and one that launches every kernel (graphs off). The outputs must be
// bit-identical on every step: the graph's nodes are the plain path's launches. The decode
// steps cross every boundary that changes a launch: 64-key tiles (the split plan's tile count),
// the decode split itself (for B=1, K=8 the keys per partition change past 1024 keys on a
// GPU with >= 32 resident decode blocks), the 512-token band of the block-table stride, the
// batch size (1 and 3 steps per call) and append-only steps (an append-only trip has a graph of
// its own); with 16-bit and FP8 pages. A stale graph replayed across any of these gives another
// result and fails. The graph side must have replayed graphs (hits) and captured fewer than
// it ran; the plain side must have neither. A third side replays with device timing on one trip
// in three (--kv-timing-every 3): its outputs match too, its untimed steps report no device
// times (ExtendOutcome::device_timed false, times 0) and the others report them.
// ctest label `gpu`; skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn/kernels/host_dtype.h"
#include "backends/paged/device_kv_memory.h"
#include "backends/paged/extend_batch.h"
#include "backends/paged/gpu_paged_attention.h"
#include "device/device_pool.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "paged_step_kit.h"

namespace attn {
namespace {

using kernels::DType;
using paged_test::Config;
using paged_test::FillStep;
using paged_test::HaveDevice;
using paged_test::OwnedStep;
using paged_test::SequenceConfigFor;

constexpr int64_t kPoolBytes = 256ll << 20;
constexpr int32_t kPageTokens = 16;
constexpr int kSides = 3;         // graphs off; graphs on; graphs on, timed one trip in three
constexpr int kTimingEvery = 3;

/// One GPU KV cache with graphs on or off.
struct Side {
  std::unique_ptr<KvMemory> memory;
  std::unique_ptr<PagePool> pages;
  std::unique_ptr<SequenceStore> store;
  std::unique_ptr<GpuPagedAttention> compute;
};

OwnedStep MakeStep(const Config &c, int64_t position, int64_t T, bool append_only,
                   std::mt19937 &rng) {
  OwnedStep st;
  FillStep(&st, c, 0, position, T, rng);
  if (append_only) SetAppendOnly(&st.args);
  return st;
}

class GpuPagedGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
    auto dev = DevicePool::Create(0, 0.05);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    device_pool_ = std::move(*dev);
    for (int g = 0; g < kSides; ++g) {
      Side &s = sides_[g];
      auto mem = DeviceKvMemory::Create(device_pool_.get(), kPoolBytes);
      ASSERT_TRUE(mem.ok()) << mem.status().ToString();
      s.memory = std::move(*mem);
      auto compute = GpuPagedAttention::Create(0, device_pool_.get(),
                                               GpuPagedAttention::kDefaultLanes, g >= 1,
                                               g == 2 ? kTimingEvery : 1);
      ASSERT_TRUE(compute.ok()) << compute.status().ToString();
      s.compute = std::move(*compute);
      s.pages = std::make_unique<PagePool>(s.memory.get(), PagePoolOptions{kPageTokens, 8, true});
      s.store = std::make_unique<SequenceStore>(s.pages.get(), SequenceStoreOptions{});
    }
  }

  /// Runs `steps` (positions already set; sequence ids per side in ids[side][j]) as one batch
  /// on every side and checks that every output is bit-identical to the plain side's.
  void RunBoth(std::vector<OwnedStep> &steps, const std::vector<int> &seqs,
               std::string ids[kSides][3], const std::string &what) {
    std::string outs[kSides][3];
    const std::string owner = "test";
    for (int side = 0; side < kSides; ++side) {
      std::vector<ExtendArgs> args(steps.size());
      std::vector<BatchedExtend> batch(steps.size());
      std::vector<ExtendOutcome> outcomes(steps.size());
      for (size_t j = 0; j < steps.size(); ++j) {
        args[j] = steps[j].args;
        args[j].sequence_id = ids[side][seqs[j]];
        batch[j].args = &args[j];
        batch[j].owner = &owner;
        batch[j].o = &outs[side][j];
        batch[j].outcome = &outcomes[j];
      }
      RunExtendSteps(sides_[side].store.get(), sides_[side].compute.get(), batch.data(),
                     batch.size());
      for (size_t j = 0; j < steps.size(); ++j) {
        ASSERT_TRUE(batch[j].status.ok())
            << what << " side " << side << " step " << j << ": " << batch[j].status.ToString();
        const ExtendOutcome &o = outcomes[j];
        if (o.device_timed) {
          ++timed_[side];
          if (!steps[j].args.append_only) {
            EXPECT_GT(o.kernel_us + o.h2d_us + o.d2h_us, 0) << what << " side " << side;
          }
        } else {
          ++untimed_[side];
          EXPECT_EQ(o.kernel_us + o.h2d_us + o.d2h_us, 0) << what << ": untimed, yet times";
        }
      }
    }
    for (int side = 1; side < kSides; ++side) {
      for (size_t j = 0; j < steps.size(); ++j) {
        ASSERT_EQ(outs[0][j].size(), outs[side][j].size()) << what << " step " << j;
        ASSERT_EQ(std::memcmp(outs[0][j].data(), outs[side][j].data(), outs[0][j].size()), 0)
            << what << " side " << side << " step " << j
            << ": the graph replay differs from the plain launches";
      }
    }
  }

  std::unique_ptr<DevicePool> device_pool_;
  Side sides_[kSides];  // [0]: graphs off, [1]: graphs on, [2]: on, timed 1 trip in 3
  int64_t timed_[kSides] = {}, untimed_[kSides] = {};  // steps by ExtendOutcome::device_timed
};

TEST_F(GpuPagedGraphsTest, ReplaysMatchPlainLaunchesAcrossEveryLayoutBoundary) {
  const std::vector<Config> configs = {
      {DType::kBFloat16, DType::kBFloat16, 32, 8, 128},
      {DType::kFloat16, DType::kFloat16, 8, 2, 64},
      {DType::kBFloat16, DType::kFloat8E4M3, 16, 4, 128},
  };
  std::mt19937 rng(7);
  for (const Config &c : configs) {
    const std::string name = std::string(kernels::DTypeName(c.dtype)) + "/" +
                             kernels::DTypeName(c.kv_dtype) + " N" + std::to_string(c.num_heads);
    const SequenceConfig sc = SequenceConfigFor(c, 1);
    std::string ids[kSides][3];
    for (int side = 0; side < kSides; ++side) {
      for (int j = 0; j < 3; ++j) {
        auto created = sides_[side].store->Create("test", sc);
        ASSERT_TRUE(created.ok()) << created.status().ToString();
        ids[side][j] = created->seq->id;
      }
    }
    // Histories (one prefill each, plain launches on both sides): decode then crosses the tiles
    // at 64/128, the block-table band at 512, and 1024 (B=1: the split changes there).
    int64_t len[3] = {40, 470, 990};
    for (int j = 0; j < 3; ++j) {
      std::vector<OwnedStep> one;
      one.push_back(MakeStep(c, 0, len[j], false, rng));
      RunBoth(one, {j}, ids, name + " history " + std::to_string(j));
    }
    const GraphCounts before = sides_[1].compute->graph_counts();
    constexpr int kRounds = 110;
    int calls = 0;
    for (int r = 0; r < kRounds; ++r) {
      // A batch of three decode steps, then the third sequence alone (B=1), and every 16th
      // round an append-only step of 3 tokens on the first.
      std::vector<OwnedStep> batch;
      for (int j = 0; j < 3; ++j) batch.push_back(MakeStep(c, len[j], 1, false, rng));
      RunBoth(batch, {0, 1, 2}, ids, name + " round " + std::to_string(r) + " batch");
      for (int64_t &l : len) ++l;
      std::vector<OwnedStep> single;
      single.push_back(MakeStep(c, len[2], 1, false, rng));
      RunBoth(single, {2}, ids, name + " round " + std::to_string(r) + " single");
      ++len[2];
      calls += 2;
      if (r % 16 == 5) {
        std::vector<OwnedStep> append;
        append.push_back(MakeStep(c, len[0], 3, true, rng));
        RunBoth(append, {0}, ids, name + " round " + std::to_string(r) + " append-only");
        len[0] += 3;
        ++calls;
      }
      if (HasFatalFailure()) return;
    }
    const GraphCounts after = sides_[1].compute->graph_counts();
    const int64_t replays = after.replays - before.replays;
    const int64_t captures = after.captures - before.captures;
    std::printf("  %-24s %d calls: %lld graph replays, %lld captures, final lengths %lld %lld "
                "%lld\n",
                name.c_str(), calls, static_cast<long long>(replays),
                static_cast<long long>(captures), static_cast<long long>(len[0]),
                static_cast<long long>(len[1]), static_cast<long long>(len[2]));
    EXPECT_EQ(replays + captures, calls) << name << ": every call without prefill is a graph";
    EXPECT_GT(replays, captures) << name << ": the layouts repeat, so most calls replay";
    EXPECT_GE(captures, 6) << name << ": the tile, band, batch and append boundaries each "
                              "need a graph of their own";
    const GraphCounts plain = sides_[0].compute->graph_counts();
    EXPECT_EQ(plain.replays + plain.captures, 0) << "graphs off: no graph";
    EXPECT_EQ(untimed_[0] + untimed_[1], 0) << "timing on every trip: every step is timed";
    // Side 2 times one graph trip in three per lane (lanes are taken first-free, so one caller
    // keeps lane 0): about a third of its steps are timed.
    std::printf("  %-24s timed one trip in %d: %lld steps timed, %lld untimed\n", name.c_str(),
                kTimingEvery, static_cast<long long>(timed_[2]),
                static_cast<long long>(untimed_[2]));
    EXPECT_GT(timed_[2], 0) << name;
    // Decode plans are made once per shape band and reused (DecodePlanCache).
    EXPECT_GT(sides_[1].compute->plans().hits(), 10 * sides_[1].compute->plans().misses())
        << name;
    EXPECT_GT(untimed_[2], timed_[2]) << name << ": most replays run without the event nodes";
    for (int side = 0; side < kSides; ++side) {
      for (int j = 0; j < 3; ++j) {
        ASSERT_TRUE(sides_[side].store->Release(ids[side][j], "test", nullptr).ok());
      }
    }
  }
}

}  // namespace
}  // namespace attn
