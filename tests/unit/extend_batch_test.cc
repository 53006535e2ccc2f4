// RunExtendSteps (server/backends/paged/extend_batch.h): many sequence steps in one batch give each
// step bitwise the output, status and stored state that ExtendStep gives it alone; compatible
// steps share one AttendBatch launch; a failed launch rolls every step of it back; a step that
// stops being wanted while it waits for its sequence's lock is not applied (issue 16 item 12), and
// one that stops being wanted while paged-cpu computes it is stopped part-way and rolled back
// alone (issue 16, hostile clients); an append-only step shares a launch, attends nothing and
// rolls back like any step (issue 18).
#include "backends/paged/extend_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/paged/cpu_paged_attention.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/host_pool.h"

namespace attn {
namespace {

using kernels::DType;

// The cpu paged backend, counting the batched launches it is asked for.
class CountingPaged final : public PagedAttentionBackend {
 public:
  const std::string &name() const override { return cpu_.name(); }
  const std::string &device() const override { return cpu_.device(); }
  Status Append(const PagedLayerView &l, int64_t start, int64_t tokens, const void *k,
                const void *v, DType dt, int64_t *sat) override {
    return cpu_.Append(l, start, tokens, k, v, dt, sat);
  }
  Status CopyPage(const kernels::PagedKvPool &p, int32_t s, int32_t d, int64_t t) override {
    return cpu_.CopyPage(p, s, d, t);
  }
  Status Attend(const PagedLayerView &l, const PagedQuery &q, void *o) override {
    return cpu_.Attend(l, q, o);
  }
  Status AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) override {
    launches.push_back(n);
    if (fail_attend) return Status(StatusCode::kInternal, "injected device fault");
    return PagedAttentionBackend::AttendBatch(items, n, times);
  }
  std::vector<size_t> launches;
  bool fail_attend = false;

 private:
  CpuPagedAttention cpu_{1};
};

struct World {
  World() : memory(std::move(*HostPool::Create(4 << 20))), pool(memory.get(), {4, 8, true}) {
    store = std::make_unique<SequenceStore>(&pool, SequenceStoreOptions{});
  }
  std::string Create(int32_t N, float scale) {
    SequenceConfig c;
    c.num_layers = 2;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.num_heads = N;
    c.dtype = DType::kFloat32;
    c.kv_dtype = DType::kFloat32;
    c.scale = scale;
    auto s = store->Create("", c);
    EXPECT_TRUE(s.ok());
    return s->seq->id;
  }
  int64_t UsedPages() const {
    int64_t used = 0;
    for (const auto &c : pool.Stats()) used += c.pages_used;
    return used;
  }
  std::unique_ptr<HostPool> memory;
  PagePool pool;
  std::unique_ptr<SequenceStore> store;
};

// One step's inputs (owned).
struct Step {
  int seq = 0;  // index into the world's ids
  int32_t layer = 0;
  int64_t position = 0;
  int64_t T = 1;
  int32_t N = 4;
  std::vector<float> q, k, v;
  ExtendArgs Args(const std::string &id) const {
    ExtendArgs a;
    a.sequence_id = id;
    a.layer = layer;
    a.position = position;
    a.q_shape = {T, N, 8};
    a.k_shape = a.v_shape = {T, 2, 8};
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_bytes = q.size() * 4;
    a.k_bytes = a.v_bytes = k.size() * 4;
    return a;
  }
};

Step MakeStep(int seq, int32_t layer, int64_t pos, int64_t T, int32_t N, std::mt19937 *rng) {
  std::normal_distribution<float> n;
  Step s{seq, layer, pos, T, N, {}, {}, {}};
  s.q.resize(T * N * 8);
  s.k.resize(T * 2 * 8);
  s.v.resize(T * 2 * 8);
  for (auto *x : {&s.q, &s.k, &s.v}) {
    for (float &f : *x) f = n(*rng);
  }
  return s;
}

TEST(ExtendBatch, BatchedStepsEqualStepsAloneBitwise) {
  std::mt19937 rng(11);
  for (int round = 0; round < 5; ++round) {
    World alone, batched;
    CountingPaged alone_compute, batched_compute;
    // Sequences 0..4: N = 4, scale 0.3; sequence 5: N = 2 (another launch group).
    std::vector<std::string> ids_a, ids_b;
    for (int i = 0; i < 6; ++i) {
      ids_a.push_back(alone.Create(i == 5 ? 2 : 4, 0.3f));
      ids_b.push_back(batched.Create(i == 5 ? 2 : 4, 0.3f));
    }
    std::vector<int64_t> len(6, 0);
    std::vector<Step> history_last(6);
    for (int wave = 0; wave < 4; ++wave) {
      std::vector<Step> steps;
      for (int i = 0; i < 6; ++i) {
        const int64_t T = wave == 0 ? std::uniform_int_distribution<int64_t>(1, 9)(rng) : 1;
        steps.push_back(MakeStep(i, 0, len[i], T, i == 5 ? 2 : 4, &rng));
      }
      // Extras: a wrong position, a second step of sequence 0 (runs after the batch), and an
      // exact replay of sequence 1's previous step.
      steps.push_back(MakeStep(2, 0, len[2] + 7, 1, 4, &rng));
      steps.push_back(MakeStep(0, 0, len[0] + steps[0].T, 1, 4, &rng));
      if (wave > 0) steps.push_back(history_last[1]);
      std::shuffle(steps.begin(), steps.end(), rng);
      // Alone, in an order consistent with the batch: the replay and the first step of each
      // sequence before its second.
      std::vector<std::string> o_b(steps.size());
      std::vector<ExtendOutcome> out_b(steps.size());
      std::vector<ExtendArgs> args_b;
      for (const Step &s : steps) args_b.push_back(s.Args(ids_b[s.seq]));
      std::vector<BatchedExtend> be(steps.size());
      const std::string owner;
      for (size_t i = 0; i < steps.size(); ++i) {
        be[i].args = &args_b[i];
        be[i].owner = &owner;
        be[i].o = &o_b[i];
        be[i].outcome = &out_b[i];
      }
      RunExtendSteps(batched.store.get(), &batched_compute, be.data(), be.size());
      // Alone: the same steps one by one in the batch's effective order (per sequence the
      // order of the batch; sequences are independent).
      std::vector<size_t> order(steps.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return steps[a].seq < steps[b].seq;
      });
      for (size_t i : order) {
        std::string o;
        ExtendOutcome out;
        Status s = ExtendStep(alone.store.get(), &alone_compute, owner,
                              steps[i].Args(ids_a[steps[i].seq]), &o, &out);
        ASSERT_EQ(s.code(), be[i].status.code()) << s.ToString() << " vs " << be[i].status.ToString();
        if (!s.ok()) continue;
        EXPECT_EQ(o, o_b[i]) << "step " << i;
        EXPECT_EQ(out.length, out_b[i].length);
        EXPECT_EQ(out.replayed, out_b[i].replayed);
      }
      for (size_t i = 0; i < steps.size(); ++i) {
        if (be[i].status.ok() && !out_b[i].replayed) {
          len[steps[i].seq] = out_b[i].length;
          // The launch it reports is one that ran, and it counted the step's tokens.
          EXPECT_NE(std::find(batched_compute.launches.begin(), batched_compute.launches.end(),
                              static_cast<size_t>(be[i].launch_size)),
                    batched_compute.launches.end());
          EXPECT_GE(be[i].launch_tokens, steps[i].T);
        } else {
          EXPECT_EQ(be[i].launch_size, 0);
        }
      }
      for (size_t i = 0; i < steps.size(); ++i) {
        if (be[i].status.ok() && !out_b[i].replayed) history_last[steps[i].seq] = steps[i];
      }
      EXPECT_EQ(alone.UsedPages(), batched.UsedPages());
    }
    // Sequences 1, 3 and 4 (N=4) always share the first launch of a wave (0 and 2 too, unless
    // their extra step sorts first and they run after the batch); the N=2 step has its own.
    ASSERT_GE(batched_compute.launches.size(), 8u);
    EXPECT_GE(*std::max_element(batched_compute.launches.begin(),
                                batched_compute.launches.end()),
              3u);
  }
}

TEST(ExtendBatch, FailedLaunchRollsBackEveryStepOfIt) {
  std::mt19937 rng(5);
  World w;
  CountingPaged compute;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(w.Create(4, 0.25f));
  const int64_t pages_before = w.UsedPages();
  compute.fail_attend = true;
  std::vector<Step> steps;
  for (int i = 0; i < 3; ++i) steps.push_back(MakeStep(i, 1, 0, 5, 4, &rng));
  std::vector<ExtendArgs> args;
  for (const Step &s : steps) args.push_back(s.Args(ids[s.seq]));
  std::vector<std::string> o(3);
  std::vector<ExtendOutcome> out(3);
  std::vector<BatchedExtend> be(3);
  const std::string owner;
  for (int i = 0; i < 3; ++i) be[i] = {&args[i], &owner, &o[i], &out[i], Status::Ok(), 0, 0};
  RunExtendSteps(w.store.get(), &compute, be.data(), be.size());
  ASSERT_EQ(compute.launches, (std::vector<size_t>{3}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(be[i].status.code(), StatusCode::kInternal);
    EXPECT_TRUE(o[i].empty());
  }
  EXPECT_EQ(w.UsedPages(), pages_before);
  // The same steps succeed afterwards at position 0 (nothing was appended).
  compute.fail_attend = false;
  for (int i = 0; i < 3; ++i) be[i].status = Status::Ok();
  RunExtendSteps(w.store.get(), &compute, be.data(), be.size());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(be[i].status.ok()) << be[i].status.ToString();
    EXPECT_EQ(out[i].length, 5);
    EXPECT_EQ(be[i].launch_size, 3);
    EXPECT_EQ(be[i].launch_tokens, 15);
  }
}

// A step that waits for its sequence's lock (held here, as another batch thread's step would
// hold it) and is cancelled meanwhile is dropped once it gets the lock: nothing applied, no page
// taken, `dropped` set. Before the fix it was applied after the wait (issue 16 item 12).
TEST(ExtendBatch, StepCancelledWhileWaitingForItsSequenceIsNotApplied) {
  std::mt19937 rng(9);
  World w;
  CountingPaged compute;
  const std::string id = w.Create(4, 0.25f);
  const int64_t pages_before = w.UsedPages();
  Step step = MakeStep(0, 0, 0, 3, 4, &rng);
  ExtendArgs args = step.Args(id);
  std::string o;
  ExtendOutcome out;
  const std::string owner;
  std::atomic<bool> cancelled{false};
  BatchedExtend be;
  be.args = &args;
  be.owner = &owner;
  be.o = &o;
  be.outcome = &out;
  be.still_wanted = [&cancelled]() {
    return cancelled.load() ? Status(StatusCode::kCancelled, "cancelled") : Status::Ok();
  };
  auto held = w.store->Acquire(id, owner);  // the earlier step of another batch
  ASSERT_TRUE(held.ok());
  std::thread batch([&] { RunExtendSteps(w.store.get(), &compute, &be, 1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it block on the lock
  cancelled.store(true);
  held->lock.unlock();
  batch.join();
  EXPECT_EQ(be.status.code(), StatusCode::kCancelled) << be.status.ToString();
  EXPECT_TRUE(be.dropped);
  EXPECT_TRUE(compute.launches.empty());
  EXPECT_EQ(held->seq->layers[0].table.length(), 0);
  EXPECT_EQ(w.UsedPages(), pages_before);
  // Still wanted: the same step runs.
  cancelled.store(false);
  RunExtendSteps(w.store.get(), &compute, &be, 1);
  EXPECT_TRUE(be.status.ok()) << be.status.ToString();
  EXPECT_FALSE(be.dropped);
  EXPECT_EQ(out.length, 3);
}

// A long prefill whose still_running says stop part-way through its paged-cpu attention (a
// deadline passing) ends DEADLINE_EXCEEDED and is rolled back, alone: the short step of the same
// launch is committed with bitwise its output alone; asked and always OK, the stop check
// changes nothing.
TEST(ExtendBatch, StepStoppedWhileItsAttentionRunsIsRolledBackAlone) {
  std::mt19937 rng(5);
  World w, alone;
  CpuPagedAttention compute(2), alone_compute(2);
  const std::string long_id = w.Create(4, 0.3f), short_id = w.Create(4, 0.3f);
  const std::string long_alone = alone.Create(4, 0.3f), short_alone = alone.Create(4, 0.3f);
  // 4 heads x 512 rows x ~256 keys x 8 dims x 2: ~8 polls of the stop check (2^20 each).
  const Step prefill = MakeStep(0, 0, 0, 512, 4, &rng);
  const Step little = MakeStep(1, 0, 0, 3, 4, &rng);
  const std::string owner;
  ExtendArgs args[2] = {prefill.Args(long_id), little.Args(short_id)};
  std::string o[2];
  ExtendOutcome out[2];
  std::atomic<int> polls{0};
  std::atomic<bool> stop_on_second{true};
  BatchedExtend be[2];
  for (int i = 0; i < 2; ++i) {
    be[i].args = &args[i];
    be[i].owner = &owner;
    be[i].o = &o[i];
    be[i].outcome = &out[i];
  }
  be[0].still_running = [&]() {
    const int n = ++polls;
    return stop_on_second.load() && n >= 2 ? Status(StatusCode::kDeadlineExceeded, "late")
                                           : Status::Ok();
  };
  RunExtendSteps(w.store.get(), &compute, be, 2);
  EXPECT_EQ(be[0].status.code(), StatusCode::kDeadlineExceeded) << be[0].status.ToString();
  EXPECT_TRUE(be[0].dropped);
  EXPECT_GE(polls.load(), 2);  // stopped part-way, after it had begun
  EXPECT_TRUE(o[0].empty());
  ASSERT_TRUE(be[1].status.ok()) << be[1].status.ToString();
  EXPECT_FALSE(be[1].dropped);
  std::string o_alone;
  ExtendOutcome out_alone;
  const ExtendArgs little_alone = little.Args(short_alone);
  ASSERT_TRUE(ExtendStep(alone.store.get(), &alone_compute, owner, little_alone, &o_alone,
                         &out_alone).ok());
  EXPECT_EQ(o[1], o_alone);
  EXPECT_EQ(w.UsedPages(), alone.UsedPages());  // the prefill's pages went back
  {
    auto held = w.store->Acquire(long_id, owner);
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(held->seq->layers[0].table.length(), 0);
  }
  // Asked and always OK: the prefill runs, bitwise as it does alone without a stop check.
  stop_on_second.store(false);
  polls.store(0);
  RunExtendSteps(w.store.get(), &compute, &be[0], 1);
  ASSERT_TRUE(be[0].status.ok()) << be[0].status.ToString();
  EXPECT_FALSE(be[0].dropped);
  EXPECT_GE(polls.load(), 2);
  const ExtendArgs prefill_alone = prefill.Args(long_alone);
  ASSERT_TRUE(ExtendStep(alone.store.get(), &alone_compute, owner, prefill_alone, &o_alone,
                         &out_alone).ok());
  EXPECT_EQ(o[0], o_alone);
  EXPECT_EQ(out[0].length, 512);
}

// An append-only step (ExtendArgs.append_only) shares a launch with an attending one: it appends
// its k/v, attends nothing (no o, kv_len 0), and a later step over it gives bitwise what it gives
// after a full Extend of the same k/v; a failed launch rolls it back like any step.
TEST(ExtendBatch, AppendOnlyStepAppendsAndAttendsNothing) {
  std::mt19937 rng(5);
  const Step up = MakeStep(0, 1, 0, 3, 4, &rng), other = MakeStep(1, 1, 0, 2, 4, &rng);
  const Step next = MakeStep(0, 1, 3, 1, 4, &rng);
  World w, ref;
  CountingPaged compute, ref_compute;
  const std::string a = w.Create(4, 0.3f), b = w.Create(4, 0.3f), ra = ref.Create(4, 0.3f);
  const std::string owner;
  auto run = [&](bool fail) {
    std::vector<ExtendArgs> args = {up.Args(a), other.Args(b)};
    SetAppendOnly(&args[0]);
    std::vector<std::string> o(2);
    std::vector<ExtendOutcome> out(2);
    std::vector<BatchedExtend> be(2);
    for (size_t i = 0; i < 2; ++i) be[i] = {&args[i], &owner, &o[i], &out[i]};
    compute.fail_attend = fail;
    RunExtendSteps(w.store.get(), &compute, be.data(), be.size());
    if (fail) {
      EXPECT_EQ(be[0].status.code(), StatusCode::kInternal);
      EXPECT_EQ(be[1].status.code(), StatusCode::kInternal);
      return;
    }
    ASSERT_TRUE(be[0].status.ok()) << be[0].status.ToString();
    ASSERT_TRUE(be[1].status.ok()) << be[1].status.ToString();
    EXPECT_TRUE(o[0].empty());
    EXPECT_TRUE(out[0].append_only);
    EXPECT_EQ(out[0].length, 3);
    EXPECT_EQ(out[0].kv_len, 0);
    EXPECT_EQ(out[1].kv_len, 2);
    EXPECT_EQ(be[0].launch_size, 2);  // one launch for both
  };
  run(/*fail=*/true);  // rolled back: nothing appended, no page kept
  EXPECT_EQ(w.UsedPages(), 0);
  run(/*fail=*/false);
  // A replay of the append-only step: answered, nothing appended.
  ExtendArgs again = up.Args(a);
  SetAppendOnly(&again);
  std::string o;
  ExtendOutcome out;
  ASSERT_TRUE(ExtendStep(w.store.get(), &compute, owner, again, &o, &out).ok());
  EXPECT_TRUE(out.replayed);
  EXPECT_EQ(out.length, 3);
  EXPECT_TRUE(o.empty());
  // The next step over it equals the same step after a full Extend of the same k/v.
  std::string o_ref, o_next;
  ASSERT_TRUE(ExtendStep(ref.store.get(), &ref_compute, owner, up.Args(ra), &o_ref, &out).ok());
  ASSERT_TRUE(ExtendStep(ref.store.get(), &ref_compute, owner, next.Args(ra), &o_ref, &out).ok());
  ASSERT_TRUE(ExtendStep(w.store.get(), &compute, owner, next.Args(a), &o_next, &out).ok());
  EXPECT_EQ(out.length, 4);
  EXPECT_EQ(out.kv_len, 4);
  EXPECT_EQ(o_next, o_ref);
}

}  // namespace
}  // namespace attn
