// Host work per sequence step, without a GPU (issue 18 item 4): B decode steps (T = 1) on B
// sequences, run again and again through
//   --mode run:      RunExtendSteps (backends/paged/extend_batch.h) on the calling thread, or
//   --mode batcher:  the StepBatcher (batching/step_batcher.h): one Enqueue of B StepRequests,
//                    then wait for every `done` (queue hand-off, batch thread, responders),
// on a paged backend that computes nothing (`--backend null`: what is left is host work only)
// or the cpu one (`--backend cpu`). Sequences are cut back to the context every 256 rounds, so
// the history stays short and pages are reused. Prints the median (and p90) over rounds of the
// per-step wall time and of the per-step prepare / launch call / commit phases (StepPhases).
// Not a GPU measurement: the GPU backend's staging, lanes and copies are not in it.
//
//   build-cpu/bench/attn_step_host_bench --mode run --steps 64 --rounds 4000
//   build-cpu/bench/attn_step_host_bench --mode batcher --steps 1 --rounds 20000
// Under perf: perf record -g build-cpu/bench/attn_step_host_bench ... (RelWithDebInfo symbols).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "attn/kernels/host_dtype.h"
#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_batch.h"
#include "batching/step_batcher.h"
#include "kv_cache/host_pool.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::DType;

/// A paged backend that computes nothing: every call succeeds at once.
class NullPaged final : public PagedAttentionBackend {
 public:
  const std::string &name() const override { return name_; }
  const std::string &device() const override { return device_; }
  Status Append(const PagedLayerView &, int64_t, int64_t, const void *, const void *, DType,
                int64_t *) override {
    return Status::Ok();
  }
  Status CopyPage(const kernels::PagedKvPool &, int32_t, int32_t, int64_t) override {
    return Status::Ok();
  }
  Status Attend(const PagedLayerView &, const PagedQuery &, void *) override {
    return Status::Ok();
  }
  Status AppendAttendBatch(PagedAppendItem *, const PagedAttendItem *, size_t,
                           LaunchTimes *) override {
    return Status::Ok();
  }

 private:
  std::string name_ = "paged-null", device_ = "cpu";
};

struct Options {
  std::string mode = "run", backend = "null";
  int steps = 64, rounds = 4000, heads = 8, kv_heads = 2, head_dim = 64, context = 16;
};

bool Parse(int argc, char **argv, Options *o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") o->mode = v;
    else if (k == "--backend") o->backend = v;
    else if (k == "--steps") o->steps = std::atoi(v.c_str());
    else if (k == "--rounds") o->rounds = std::atoi(v.c_str());
    else if (k == "--heads") o->heads = std::atoi(v.c_str());
    else if (k == "--kv-heads") o->kv_heads = std::atoi(v.c_str());
    else if (k == "--head-dim") o->head_dim = std::atoi(v.c_str());
    else if (k == "--context") o->context = std::atoi(v.c_str());
    else return false;
  }
  return (argc % 2) == 1 && o->steps > 0 && o->rounds > 0 && o->context > 0 &&
         (o->mode == "run" || o->mode == "batcher") &&
         (o->backend == "null" || o->backend == "cpu");
}

/// One decode step's inputs (bf16 bits, random) and its arguments at `position`.
struct StepInput {
  std::vector<uint16_t> q, k, v;
  ExtendArgs args;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

class Bench {
 public:
  explicit Bench(const Options &o) : o_(o) {
    memory_ = std::move(*HostPool::Create(int64_t{256} << 20));
    pool_ = std::make_unique<PagePool>(memory_.get(), PagePoolOptions{16, 64, false});
    store_ = std::make_unique<SequenceStore>(pool_.get(), SequenceStoreOptions{});
    if (o.backend == "cpu") {
      backend_ = std::make_unique<CpuPagedAttention>(1);
    } else {
      backend_ = std::make_unique<NullPaged>();
    }
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> bits(0x3c00, 0x3fff);  // bf16 in [~0.0078, ~2)
    inputs_.resize(static_cast<size_t>(o.steps));
    for (StepInput &in : inputs_) {
      SequenceConfig c;
      c.num_layers = 1;
      c.num_heads = o.heads;
      c.num_kv_heads = o.kv_heads;
      c.head_dim = o.head_dim;
      c.dtype = c.kv_dtype = DType::kBFloat16;
      c.scale = 0.125f;
      auto s = store_->Create("", c);
      if (!s.ok()) std::abort();
      in.args.sequence_id = s->seq->id;
      for (auto [vec, n] : {std::make_pair(&in.q, o.heads), std::make_pair(&in.k, o.kv_heads),
                            std::make_pair(&in.v, o.kv_heads)}) {
        vec->resize(static_cast<size_t>(n * o.head_dim));
        for (uint16_t &x : *vec) x = static_cast<uint16_t>(bits(rng));
      }
      ExtendArgs &a = in.args;
      a.q_dtype = a.k_dtype = a.v_dtype = DType::kBFloat16;
      a.q_shape = {1, o.heads, o.head_dim};
      a.k_shape = a.v_shape = {1, o.kv_heads, o.head_dim};
      a.q = in.q.data();
      a.k = in.k.data();
      a.v = in.v.data();
      a.q_bytes = in.q.size() * 2;
      a.k_bytes = a.v_bytes = in.k.size() * 2;
    }
    Rewind();
  }

  /// Cuts every sequence back to the context (positions [0, context) written once).
  void Rewind() {
    for (StepInput &in : inputs_) {
      auto locked = store_->Acquire(in.args.sequence_id, "");
      if (!locked.ok()) std::abort();
      store_->Truncate(locked->seq.get(), 0);
    }
    for (int t = 0; t < o_.context; ++t) {
      for (StepInput &in : inputs_) {
        in.args.position = t;
        std::string out;
        ExtendOutcome outcome;
        if (!ExtendStep(store_.get(), backend_.get(), "", in.args, &out, &outcome).ok()) {
          std::abort();
        }
      }
    }
    position_ = o_.context;
  }

  void Run() {
    std::vector<double> wall, prep, launch, commit;
    std::unique_ptr<StepBatcher> batcher;
    if (o_.mode == "batcher") {
      BatchSchedulerOptions bo;
      bo.policy = {1 << 20, o_.steps, 0};
      bo.threads = 1;
      bo.max_queued = 1 << 16;
      bo.name = "bench";
      bo.inline_max_tokens = 16;  // as server/main.cc: small work finding it idle runs inline
      batcher = std::make_unique<StepBatcher>(store_.get(), backend_.get(), bo);
    }
    std::vector<std::string> outs(inputs_.size());
    std::vector<ExtendOutcome> outcomes(inputs_.size());
    std::vector<BatchedExtend> steps(inputs_.size());
    const double n = static_cast<double>(o_.steps);
    for (int r = 0; r < o_.rounds; ++r) {
      if (position_ >= o_.context + 256) Rewind();
      for (StepInput &in : inputs_) in.args.position = position_;
      StepPhases phases;
      const auto t0 = Clock::now();
      if (batcher == nullptr) {
        for (size_t i = 0; i < steps.size(); ++i) {
          steps[i] = BatchedExtend{};
          steps[i].args = &inputs_[i].args;
          steps[i].owner = &owner_;
          steps[i].o = &outs[i];
          steps[i].outcome = &outcomes[i];
        }
        RunExtendSteps(store_.get(), backend_.get(), steps.data(), steps.size(), nullptr, &phases);
        for (const BatchedExtend &s : steps) {
          if (!s.status.ok()) std::abort();
        }
      } else {
        RunBatcher(batcher.get());
      }
      const auto ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
      ++position_;
      wall.push_back(ns / n);
      prep.push_back(static_cast<double>(phases.prepare_ns) / n);
      launch.push_back(static_cast<double>(phases.launch_ns) / n);
      commit.push_back(static_cast<double>(phases.commit_ns) / n);
    }
    if (batcher != nullptr) batcher->Stop();  // logs the batcher's phases (spdlog info)
    std::printf("mode %s backend %s: B=%d N%d K%d H%d bf16, context %d..%d, %d rounds\n",
                o_.mode.c_str(), o_.backend.c_str(), o_.steps, o_.heads, o_.kv_heads, o_.head_dim,
                o_.context, o_.context + 256, o_.rounds);
    std::printf("ns per step, p50 (p90): wall %.0f (%.0f)", Percentile(wall, 0.5),
                Percentile(wall, 0.9));
    if (batcher == nullptr) {
      std::printf("; prepare %.0f (%.0f), launch call %.0f (%.0f), commit %.0f (%.0f)",
                  Percentile(prep, 0.5), Percentile(prep, 0.9), Percentile(launch, 0.5),
                  Percentile(launch, 0.9), Percentile(commit, 0.5), Percentile(commit, 0.9));
    }
    std::printf("\n");
  }

 private:
  /// One Enqueue of every step, then waits until each step's `done` ran.
  void RunBatcher(StepBatcher *batcher) {
    std::mutex mu;
    std::condition_variable cv;
    int left = o_.steps;
    std::vector<StepRequest> reqs(inputs_.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].owner = owner_;
      reqs[i].args = inputs_[i].args;
      reqs[i].done = [&](StepResult &&r) {
        if (!r.status.ok()) std::abort();
        std::lock_guard<std::mutex> lock(mu);
        if (--left == 0) cv.notify_one();
      };
    }
    if (!batcher->Enqueue(&reqs).ok()) std::abort();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  }

  Options o_;
  std::unique_ptr<HostPool> memory_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<SequenceStore> store_;
  std::unique_ptr<PagedAttentionBackend> backend_;
  std::vector<StepInput> inputs_;
  std::string owner_;
  int64_t position_ = 0;
};

}  // namespace
}  // namespace attn

int main(int argc, char **argv) {
  attn::Options o;
  if (!attn::Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--mode run|batcher] [--backend null|cpu] [--steps B] [--rounds R] "
                 "[--heads N] [--kv-heads K] [--head-dim H] [--context C]\n",
                 argv[0]);
    return 2;
  }
  attn::Bench bench(o);
  bench.Run();
  return 0;
}
