// GPU KV cache end to end below gRPC (DESIGN.md §7, §10): the same Extend steps run through
// SequenceStore + ExtendStep twice, once with pages in host memory and the CPU compute
// (CpuPagedAttention, float64-accumulating reference path) and once with pages in device memory
// and the GPU kernels (GpuPagedAttention: paged append + split-KV paged decode; prefill over
// 16-bit pages through the fused paged kernel, over FP8 pages chunked into 64-row decode
// pieces). Every step's output must agree within the dtype's tolerance
// (DESIGN.md §4: ‖gpu − cpu‖₂/‖cpu‖₂), including prefill longer than a page and than one
// 64-row chunk, a ~1000-token prefill over a cached history, decode steps across page
// boundaries, forks that diverge (copy-on-write of a shared partial page), truncation, FP8
// pages, batches mixing decode and prefill steps (one decode launch + one fused launch), and
// pools poisoned with NaN (garbage in unused or freed slots must never change a result). After
// releasing everything, no page is in use. Batches from several threads at once (the server's
// batch threads) run on GpuPagedAttention's lanes and must give the CPU path's results too.
// ctest label `gpu`; skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attn/kernels/host_dtype.h"
#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_batch.h"
#include "backends/paged/extend_step.h"
#include "backends/paged/gpu_paged_attention.h"
#include "backends/paged/gpu_paged_jobs.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "backends/paged/device_kv_memory.h"
#include "device/device_pool.h"
#include "kv_cache/host_pool.h"
#include "paged_step_kit.h"

namespace attn {
namespace {

using kernels::DType;
using paged_test::Config;
using paged_test::FillStep;
using paged_test::HaveDevice;
using paged_test::OwnedStep;
using paged_test::Random;
using paged_test::SequenceConfigFor;

/// One KV cache: memory, pages, store and compute.
struct Side {
  std::unique_ptr<KvMemory> memory;
  std::unique_ptr<PagePool> pages;
  std::unique_ptr<SequenceStore> store;
  std::unique_ptr<PagedAttentionBackend> compute;
};

constexpr int64_t kPoolBytes = 256ll << 20;
constexpr int32_t kPageTokens = 16;

class GpuPagedAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
    auto dev = DevicePool::Create(0, 0.05);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    device_pool_ = std::move(*dev);
    auto host_mem = HostPool::Create(kPoolBytes);
    ASSERT_TRUE(host_mem.ok());
    cpu_.memory = std::move(*host_mem);
    cpu_.compute = std::make_unique<CpuPagedAttention>(0);
    auto dev_mem = DeviceKvMemory::Create(device_pool_.get(), kPoolBytes);
    ASSERT_TRUE(dev_mem.ok()) << dev_mem.status().ToString();
    gpu_.memory = std::move(*dev_mem);
    auto compute = GpuPagedAttention::Create(0, device_pool_.get());
    ASSERT_TRUE(compute.ok()) << compute.status().ToString();
    gpu_.compute = std::move(*compute);
    for (Side *s : {&cpu_, &gpu_}) {
      // Poisoned: unused and freed slots hold NaN, so reading one shows up in the output.
      s->pages = std::make_unique<PagePool>(s->memory.get(), PagePoolOptions{kPageTokens, 8, true});
      s->store = std::make_unique<SequenceStore>(s->pages.get(), SequenceStoreOptions{});
    }
  }

  std::unique_ptr<DevicePool> device_pool_;
  Side cpu_, gpu_;
};

std::string Name(const Config &c) {
  return std::string(kernels::DTypeName(c.dtype)) + "/" + kernels::DTypeName(c.kv_dtype) +
         " N" + std::to_string(c.num_heads) + " K" + std::to_string(c.num_kv_heads) + " H" +
         std::to_string(c.head_dim);
}

double Tolerance(const Config &c) {
  // Both sides round to the dtype; FP8 pages hold identical bytes on both sides (the same
  // append rule), so the difference is the attention arithmetic, not the quantisation.
  return c.dtype == DType::kFloat16 ? 4e-3 : 2e-2;
}

/// Runs one step on both sides with the same inputs; checks agreement and finiteness.
void Step(Side &cpu, Side &gpu, const std::string &cpu_id, const std::string &gpu_id,
          const Config &c, int32_t layer, int64_t position, int64_t T, std::mt19937 &rng,
          const std::string &what) {
  OwnedStep st;
  FillStep(&st, c, layer, position, T, rng);
  ExtendArgs &a = st.args;
  std::string o_cpu, o_gpu;
  ExtendOutcome out_cpu, out_gpu;
  a.sequence_id = cpu_id;
  Status sc = ExtendStep(cpu.store.get(), cpu.compute.get(), "test", a, &o_cpu, &out_cpu);
  ASSERT_TRUE(sc.ok()) << what << " cpu: " << sc.ToString();
  a.sequence_id = gpu_id;
  Status sg = ExtendStep(gpu.store.get(), gpu.compute.get(), "test", a, &o_gpu, &out_gpu);
  ASSERT_TRUE(sg.ok()) << what << " gpu: " << sg.ToString();
  ASSERT_EQ(out_cpu.length, out_gpu.length) << what;
  ASSERT_EQ(o_cpu.size(), o_gpu.size()) << what;
  const int64_t n = T * c.num_heads * c.head_dim;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = kernels::LoadAsFloat(o_gpu.data(), c.dtype, i);
    const double r = kernels::LoadAsFloat(o_cpu.data(), c.dtype, i);
    ASSERT_TRUE(std::isfinite(g)) << what << ": gpu output " << i << " is " << g;
    diff += (g - r) * (g - r);
    ref += r * r;
  }
  const double rel = std::sqrt(diff / std::max(ref, 1e-30));
  EXPECT_LE(rel, Tolerance(c)) << what << " (" << Name(c) << "): relative L2 error " << rel;
  std::printf("  %-28s %-44s T=%-4lld len=%-5lld rel %.2e\n", Name(c).c_str(), what.c_str(),
              static_cast<long long>(T), static_cast<long long>(out_gpu.length), rel);
}

TEST_F(GpuPagedAttentionTest, ExtendMatchesCpuThroughLifecycle) {
  const std::vector<Config> configs = {
      {DType::kBFloat16, DType::kBFloat16, 32, 8, 128},
      {DType::kFloat16, DType::kFloat16, 8, 8, 64},
      {DType::kBFloat16, DType::kFloat8E4M3, 16, 4, 128},
      {DType::kFloat16, DType::kFloat8E4M3, 4, 1, 64},
  };
  std::mt19937 rng(1234);
  for (const Config &c : configs) {
    const SequenceConfig sc = SequenceConfigFor(c, 2);
    ASSERT_TRUE(gpu_.compute
                    ->SupportsSequence(c.dtype, c.kv_dtype, c.num_heads, c.num_kv_heads,
                                       c.head_dim)
                    .ok());
    std::string ids[2];
    for (int i = 0; i < 2; ++i) {
      Side &s = i == 0 ? cpu_ : gpu_;
      auto created = s.store->Create("test", sc);
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      ids[i] = created->seq->id;
    }
    // Prefill longer than a page and than one 64-row chunk, then decode across page
    // boundaries, then a chunk that is not a multiple of anything.
    int64_t len[2] = {0, 0};
    for (int32_t layer = 0; layer < 2; ++layer) {
      for (int64_t T : {100, 1, 1, 1, 37, 1, 12, 1}) {
        Step(cpu_, gpu_, ids[0], ids[1], c, layer, len[layer], T, rng,
             "layer " + std::to_string(layer) + " step");
        len[layer] += T;
      }
    }
    // A long prefill over the cached history (fused paged kernel for 16-bit pages; 16 decode
    // chunks for FP8), then a decode step after it.
    Step(cpu_, gpu_, ids[0], ids[1], c, 0, len[0], 1000, rng, "prefill T=1000 over history");
    len[0] += 1000;
    Step(cpu_, gpu_, ids[0], ids[1], c, 0, len[0], 1, rng, "decode after long prefill");
    len[0] += 1;
    // Fork at a partial page (length 150 is inside page 9), then both sides diverge: the
    // child's first append copies the shared partial page (copy-on-write).
    std::string child[2];
    for (int i = 0; i < 2; ++i) {
      Side &s = i == 0 ? cpu_ : gpu_;
      auto forked = s.store->Fork(ids[i], "test", 150);
      ASSERT_TRUE(forked.ok()) << forked.status().ToString();
      child[i] = forked->seq->id;
    }
    Step(cpu_, gpu_, child[0], child[1], c, 0, 150, 1, rng, "child after fork");
    Step(cpu_, gpu_, child[0], child[1], c, 0, 151, 20, rng, "child diverges");
    Step(cpu_, gpu_, ids[0], ids[1], c, 0, len[0], 1, rng, "parent after child diverged");
    len[0] += 1;
    // Truncate the parent to 70 tokens (inside a page) and regrow.
    for (int i = 0; i < 2; ++i) {
      Side &s = i == 0 ? cpu_ : gpu_;
      auto locked = s.store->Acquire(ids[i], "test");
      ASSERT_TRUE(locked.ok());
      s.store->Truncate(locked->seq.get(), 70);
    }
    Step(cpu_, gpu_, ids[0], ids[1], c, 0, 70, 5, rng, "parent after truncate to 70");
    for (int i = 0; i < 2; ++i) {
      Side &s = i == 0 ? cpu_ : gpu_;
      ASSERT_TRUE(s.store->Release(child[i], "test", nullptr).ok());
      ASSERT_TRUE(s.store->Release(ids[i], "test", nullptr).ok());
    }
  }
  for (const KvClassStats &st : gpu_.pages->Stats()) {
    EXPECT_EQ(st.pages_used, 0) << st.layout.ToString() << ": pages still in use after release";
  }
}

// One batch (RunExtendSteps: one append launch, one attention call) mixing decode (T=1),
// speculative (T=5), a prefill over a cached prefix (T=1000 over 60) and a fresh prefill
// (T=130): on 16-bit pages the GPU runs the decode launch and the fused paged launch side by
// side in one AttendMany; on FP8 pages everything goes through decode chunks.
TEST_F(GpuPagedAttentionTest, BatchMixesDecodeAndPrefill) {
  const std::vector<Config> configs = {
      {DType::kBFloat16, DType::kBFloat16, 32, 8, 128},
      {DType::kFloat16, DType::kFloat16, 8, 2, 64},
      {DType::kBFloat16, DType::kFloat8E4M3, 16, 4, 128},
  };
  std::mt19937 rng(99);
  for (const Config &c : configs) {
    const SequenceConfig sc = SequenceConfigFor(c, 1);
    // Histories: 200, 60, 0 (fresh) and 300 tokens, written by single steps on both sides.
    const int64_t history[4] = {200, 60, 0, 300};
    const int64_t batch_t[4] = {1, 1000, 130, 5};
    std::string ids[2][4];
    for (int side = 0; side < 2; ++side) {
      Side &s = side == 0 ? cpu_ : gpu_;
      for (int j = 0; j < 4; ++j) {
        auto created = s.store->Create("test", sc);
        ASSERT_TRUE(created.ok()) << created.status().ToString();
        ids[side][j] = created->seq->id;
      }
    }
    for (int j = 0; j < 4; ++j) {
      if (history[j] > 0) {
        Step(cpu_, gpu_, ids[0][j], ids[1][j], c, 0, 0, history[j], rng,
             "history of sequence " + std::to_string(j));
      }
    }
    std::vector<OwnedStep> inputs(4);
    for (int j = 0; j < 4; ++j) FillStep(&inputs[j], c, 0, history[j], batch_t[j], rng);
    std::string outs[2][4];
    ExtendOutcome outcomes[2][4];
    const std::string owner = "test";
    for (int side = 0; side < 2; ++side) {
      Side &s = side == 0 ? cpu_ : gpu_;
      std::vector<ExtendArgs> args(4);
      std::vector<BatchedExtend> steps(4);
      for (int j = 0; j < 4; ++j) {
        args[j] = inputs[j].args;
        args[j].sequence_id = ids[side][j];
        steps[j].args = &args[j];
        steps[j].owner = &owner;
        steps[j].o = &outs[side][j];
        steps[j].outcome = &outcomes[side][j];
      }
      RunExtendSteps(s.store.get(), s.compute.get(), steps.data(), steps.size());
      for (int j = 0; j < 4; ++j) {
        ASSERT_TRUE(steps[j].status.ok()) << (side ? "gpu" : "cpu") << " step " << j << ": "
                                          << steps[j].status.ToString();
      }
      if (side == 1) {
        EXPECT_EQ(steps[0].launch_size, 4) << "the four steps share one attention call";
      }
    }
    for (int j = 0; j < 4; ++j) {
      const int64_t n = batch_t[j] * c.num_heads * c.head_dim;
      ASSERT_EQ(outs[0][j].size(), outs[1][j].size());
      double diff = 0, ref = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double g = kernels::LoadAsFloat(outs[1][j].data(), c.dtype, i);
        const double r = kernels::LoadAsFloat(outs[0][j].data(), c.dtype, i);
        ASSERT_TRUE(std::isfinite(g)) << "batched step " << j << ": gpu output " << i << " is "
                                      << g;
        diff += (g - r) * (g - r);
        ref += r * r;
      }
      const double rel = std::sqrt(diff / std::max(ref, 1e-30));
      EXPECT_LE(rel, Tolerance(c)) << "batched step " << j << " (" << Name(c) << ")";
      std::printf("  %-28s batched T=%-4lld over %-4lld rel %.2e\n", Name(c).c_str(),
                  static_cast<long long>(batch_t[j]), static_cast<long long>(history[j]), rel);
    }
    for (int side = 0; side < 2; ++side) {
      Side &s = side == 0 ? cpu_ : gpu_;
      for (int j = 0; j < 4; ++j) ASSERT_TRUE(s.store->Release(ids[side][j], "test", nullptr).ok());
    }
  }
  for (const KvClassStats &st : gpu_.pages->Stats()) {
    EXPECT_EQ(st.pages_used, 0) << st.layout.ToString() << ": pages still in use after release";
  }
}

// Batches from four threads at once (as the server's batch threads run them): each thread's
// calls take a lane of their own (a stream and staging buffer each), so launches of different
// threads overlap on the device. Every step must still match the CPU path run one at a time.
TEST_F(GpuPagedAttentionTest, ConcurrentBatchesOnLanesMatchCpu) {
  const Config c{DType::kBFloat16, DType::kBFloat16, 8, 2, 128};
  const SequenceConfig sc = SequenceConfigFor(c, 1);
  constexpr int kThreads = 4, kSeqs = 6, kRounds = 12;
  constexpr int64_t kHistory = 130;  // one fused paged prefill per sequence first
  std::mt19937 rng(4242);
  std::string ids[2][kThreads][kSeqs];
  for (int side = 0; side < 2; ++side) {
    Side &s = side == 0 ? cpu_ : gpu_;
    for (int t = 0; t < kThreads; ++t) {
      for (int q = 0; q < kSeqs; ++q) {
        auto created = s.store->Create("test", sc);
        ASSERT_TRUE(created.ok()) << created.status().ToString();
        ids[side][t][q] = created->seq->id;
      }
    }
  }
  for (int t = 0; t < kThreads; ++t) {
    for (int q = 0; q < kSeqs; ++q) {
      Step(cpu_, gpu_, ids[0][t][q], ids[1][t][q], c, 0, 0, kHistory, rng, "lane history");
    }
  }
  // Round r of thread t: a batch of its kSeqs sequences, decode steps and one 3-token step.
  std::vector<OwnedStep> inputs(static_cast<size_t>(kThreads * kRounds * kSeqs));
  std::vector<int64_t> length(static_cast<size_t>(kThreads * kSeqs), kHistory);
  auto at = [](int t, int r, int q) { return static_cast<size_t>((t * kRounds + r) * kSeqs + q); };
  for (int r = 0; r < kRounds; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      for (int q = 0; q < kSeqs; ++q) {
        const int64_t T = q == 0 ? 3 : 1;
        int64_t &len = length[static_cast<size_t>(t * kSeqs + q)];
        FillStep(&inputs[at(t, r, q)], c, 0, len, T, rng);
        len += T;
      }
    }
  }
  std::vector<std::string> outs[2];
  std::vector<Status> statuses[2];
  for (int side = 0; side < 2; ++side) {
    outs[side].resize(inputs.size());
    statuses[side].resize(inputs.size());
  }
  const std::string owner = "test";
  auto run_thread = [&](int side, int t) {
    Side &s = side == 0 ? cpu_ : gpu_;
    for (int r = 0; r < kRounds; ++r) {
      std::vector<ExtendArgs> args(kSeqs);
      std::vector<BatchedExtend> steps(kSeqs);
      std::vector<ExtendOutcome> outcomes(kSeqs);
      for (int q = 0; q < kSeqs; ++q) {
        args[q] = inputs[at(t, r, q)].args;
        args[q].sequence_id = ids[side][t][q];
        steps[q].args = &args[q];
        steps[q].owner = &owner;
        steps[q].o = &outs[side][at(t, r, q)];
        steps[q].outcome = &outcomes[q];
      }
      RunExtendSteps(s.store.get(), s.compute.get(), steps.data(), steps.size());
      for (int q = 0; q < kSeqs; ++q) statuses[side][at(t, r, q)] = steps[q].status;
    }
  };
  for (int t = 0; t < kThreads; ++t) run_thread(0, t);  // CPU: one thread after the other
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(run_thread, 1, t);
  for (std::thread &th : threads) th.join();
  double worst = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(statuses[0][i].ok()) << "cpu step " << i << ": " << statuses[0][i].ToString();
    ASSERT_TRUE(statuses[1][i].ok()) << "gpu step " << i << ": " << statuses[1][i].ToString();
    ASSERT_EQ(outs[0][i].size(), outs[1][i].size()) << "step " << i;
    const int64_t n = inputs[i].args.q_shape[0] * c.num_heads * c.head_dim;
    double diff = 0, ref = 0;
    for (int64_t e = 0; e < n; ++e) {
      const double g = kernels::LoadAsFloat(outs[1][i].data(), c.dtype, e);
      const double r = kernels::LoadAsFloat(outs[0][i].data(), c.dtype, e);
      ASSERT_TRUE(std::isfinite(g)) << "step " << i << ": gpu output " << e << " is " << g;
      diff += (g - r) * (g - r);
      ref += r * r;
    }
    const double rel = std::sqrt(diff / std::max(ref, 1e-30));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, Tolerance(c)) << "step " << i << " (" << Name(c) << ")";
  }
  std::printf("  %-28s %d threads x %d batches of %d steps on lanes: worst rel %.2e\n",
              Name(c).c_str(), kThreads, kRounds, kSeqs, worst);
  for (int side = 0; side < 2; ++side) {
    Side &s = side == 0 ? cpu_ : gpu_;
    for (int t = 0; t < kThreads; ++t) {
      for (int q = 0; q < kSeqs; ++q) {
        ASSERT_TRUE(s.store->Release(ids[side][t][q], "test", nullptr).ok());
      }
    }
  }
  for (const KvClassStats &st : gpu_.pages->Stats()) {
    EXPECT_EQ(st.pages_used, 0) << st.layout.ToString() << ": pages still in use after release";
  }
}

TEST_F(GpuPagedAttentionTest, RefusesWhatTheKernelsCannotServe) {
  EXPECT_EQ(gpu_.compute->SupportsSequence(DType::kFloat32, DType::kFloat32, 8, 8, 64).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_.compute->SupportsSequence(DType::kBFloat16, DType::kBFloat16, 8, 8, 96).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(gpu_.compute->SupportsSequence(DType::kBFloat16, DType::kBFloat16, 8, 8, 128).ok());
}

// When a batch's appends fold into its decode launch (host logic; the folded launches
// themselves are checked against the CPU path by the tests above and bit for bit against
// append + decode in paged_decode_test).
TEST(FoldableAppend, OnlyDecodeStepsOnDistinctLayersOf16BitPages) {
  const int32_t table_a[4] = {0, 1, 2, 3}, table_b[4] = {4, 5, 6, 7};
  auto step = [](const int32_t *table, int64_t start, int64_t tokens, DType kv) {
    std::pair<PagedAppendItem, PagedAttendItem> s;
    s.first.layer.pool.kv_dtype = kv;
    s.first.layer.block_table = table;
    s.first.layer.kv_len = start + tokens;
    s.first.start = start;
    s.first.tokens = tokens;
    s.first.src_dtype = DType::kBFloat16;
    s.second.layer = s.first.layer;
    s.second.query.tokens = tokens;
    s.second.query.dtype = DType::kBFloat16;
    return s;
  };
  auto foldable = [](std::vector<std::pair<PagedAppendItem, PagedAttendItem>> steps) {
    std::vector<PagedAppendItem> a;
    std::vector<PagedAttendItem> t;
    for (auto &s : steps) {
      a.push_back(s.first);
      t.push_back(s.second);
    }
    return FoldableAppend(a.data(), t.data(), a.size());
  };
  EXPECT_TRUE(foldable({step(table_a, 40, 1, DType::kBFloat16)}));
  EXPECT_TRUE(foldable({step(table_a, 40, 1, DType::kBFloat16), step(table_b, 9, 64, DType::kBFloat16)}));
  EXPECT_FALSE(foldable({}));
  EXPECT_FALSE(foldable({step(table_a, 40, 1, DType::kFloat8E4M3)}));          // FP8: own append
  EXPECT_FALSE(foldable({step(table_a, 40, 65, DType::kBFloat16)}));           // prefill-sized
  EXPECT_FALSE(foldable({step(table_a, 40, 1, DType::kBFloat16),
                         step(table_a, 41, 1, DType::kBFloat16)}));            // one layer twice
  auto gap = step(table_a, 40, 2, DType::kBFloat16);
  gap.second.layer.kv_len += 1;  // attends a key past the appended ones
  EXPECT_FALSE(foldable({gap}));
  auto fewer = step(table_a, 40, 2, DType::kBFloat16);
  fewer.second.query.tokens = 1;  // attends fewer rows than it appends
  EXPECT_FALSE(foldable({fewer}));
}

}  // namespace
}  // namespace attn
