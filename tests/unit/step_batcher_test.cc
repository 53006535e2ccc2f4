// StepBatcher (server/batching/step_batcher.h) on the real cpu paged backend: steps of
// distinct sequences share one launch and get bitwise the output ExtendStep gives them alone;
// two steps of one sequence never share a batch and run in order; deadlines and cancellation
// drop a step before it is applied (ran = false); a step that fails on its own reports ran =
// true; a refused Enqueue hands the requests back without calling `done`; `done` is called
// exactly once per accepted step. The scheduler's clock is injected and frozen and
// --max-queue-delay-us is 60 s, so a batch runs exactly when it is full (or at Stop).
#include "batching/step_batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/paged/cpu_paged_attention.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/host_pool.h"

namespace attn {
namespace {

using kernels::DType;
constexpr int32_t kN = 4, kK = 2, kH = 8;

// A store over host memory with sequences of 1 layer, N = 4, K = 2, H = 8, float32.
struct World {
  World() : memory(std::move(*HostPool::Create(4 << 20))), pool(memory.get(), {4, 8, true}) {
    store = std::make_unique<SequenceStore>(&pool, SequenceStoreOptions{});
  }
  std::string Create() {
    SequenceConfig c;
    c.num_layers = 1;
    c.num_kv_heads = kK;
    c.head_dim = kH;
    c.num_heads = kN;
    c.dtype = DType::kFloat32;
    c.kv_dtype = DType::kFloat32;
    c.scale = 0.25f;
    auto s = store->Create("", c);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->seq->id : std::string();
  }
  int64_t Length(const std::string& id) {
    auto s = store->Acquire(id, "");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->seq->layers[0].table.length() : -1;
  }
  std::unique_ptr<HostPool> memory;
  PagePool pool;
  std::unique_ptr<SequenceStore> store;
  CpuPagedAttention compute{1};
};

// One step's inputs (owned) and what its completion callback saw.
struct Step {
  Step(int64_t position, int64_t T, uint64_t seed) : position(position), T(T) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> n;
    q.resize(T * kN * kH);
    k.resize(T * kK * kH);
    v.resize(T * kK * kH);
    for (auto* x : {&q, &k, &v}) {
      for (float& f : *x) f = n(rng);
    }
  }
  ExtendArgs Args(const std::string& id) const {
    ExtendArgs a;
    a.sequence_id = id;
    a.position = position;
    a.q_shape = {T, kN, kH};
    a.k_shape = a.v_shape = {T, kK, kH};
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_bytes = q.size() * 4;
    a.k_bytes = a.v_bytes = k.size() * 4;
    return a;
  }
  int64_t position, T;
  std::vector<float> q, k, v;
  std::atomic<int> done_calls{0};
  StepResult result;
  std::promise<void> finished;
};

// The real cpu paged backend whose batched launches fail with INTERNAL (a device fault, as a
// GPU lane reports it) once `ok_launches` have run.
class FaultingPaged final : public PagedAttentionBackend {
 public:
  explicit FaultingPaged(int ok_launches) : ok_launches_(ok_launches) {}
  const std::string& name() const override { return cpu_.name(); }
  const std::string& device() const override { return cpu_.device(); }
  Status Append(const PagedLayerView& layer, int64_t start, int64_t tokens, const void* k,
                const void* v, DType src_dtype, int64_t* saturations) override {
    return cpu_.Append(layer, start, tokens, k, v, src_dtype, saturations);
  }
  Status CopyPage(const kernels::PagedKvPool& pool, int32_t src, int32_t dst,
                  int64_t tokens) override {
    return cpu_.CopyPage(pool, src, dst, tokens);
  }
  Status Attend(const PagedLayerView& layer, const PagedQuery& q, void* o) override {
    return cpu_.Attend(layer, q, o);
  }
  Status AppendAttendBatch(PagedAppendItem* appends, const PagedAttendItem* attends, size_t n,
                           LaunchTimes* times) override {
    if (launches_++ >= ok_launches_) return Internal("injected: CUDA error an illegal address");
    return cpu_.AppendAttendBatch(appends, attends, n, times);
  }

 private:
  CpuPagedAttention cpu_{1};
  int ok_launches_;
  int launches_ = 0;
};

class StepBatcherTest : public ::testing::Test {
 protected:
  void Make(int64_t max_requests, int64_t max_queued = 64,
            PagedAttentionBackend* backend = nullptr) {
    BatchSchedulerOptions o;
    o.policy = {1 << 20, max_requests, 60'000'000};
    o.threads = 1;
    o.max_queued = max_queued;
    o.name = "sequence steps";
    batcher_ = std::make_unique<StepBatcher>(world_.store.get(),
                                             backend ? backend : &world_.compute, o,
                                             [] { return int64_t{0}; });
  }
  StepRequest Request(Step* step, const std::string& id, std::function<bool()> cancelled = nullptr,
                      std::chrono::system_clock::time_point deadline =
                          std::chrono::system_clock::time_point::max()) {
    StepRequest r;
    r.cancelled = std::move(cancelled);
    r.deadline = deadline;
    r.args = step->Args(id);
    r.done = [step](StepResult&& result) {
      step->result = std::move(result);
      if (step->done_calls.fetch_add(1) == 0) step->finished.set_value();
    };
    return r;
  }
  static void Wait(Step* step) {
    ASSERT_EQ(step->finished.get_future().wait_for(std::chrono::seconds(30)),
              std::future_status::ready);
  }

  World world_;
  std::unique_ptr<StepBatcher> batcher_;
};

TEST_F(StepBatcherTest, StepsOfDistinctSequencesShareALaunchWithTheirAloneOutputs) {
  Make(3);
  World alone;
  std::vector<std::unique_ptr<Step>> steps;
  std::vector<StepRequest> requests;
  int64_t tokens = 0;
  for (int i = 0; i < 3; ++i) {
    steps.push_back(std::make_unique<Step>(0, 1 + 2 * i, 100 + i));
    requests.push_back(Request(steps.back().get(), world_.Create()));
    tokens += steps.back()->T;
  }
  ASSERT_TRUE(batcher_->Enqueue(&requests).ok());
  EXPECT_TRUE(requests.empty());
  for (auto& s : steps) Wait(s.get());
  for (auto& s : steps) {
    const StepResult& r = s->result;
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_TRUE(r.ran);
    EXPECT_EQ(r.launch_size, 3);
    EXPECT_EQ(r.launch_tokens, tokens);
    EXPECT_EQ(r.q_tokens, s->T);
    EXPECT_EQ(r.outcome.length, s->T);
    EXPECT_FALSE(r.outcome.replayed);
    EXPECT_GE(r.batch_us, r.batch_kernel_us);
    // The same step alone (ExtendStep) gives the same bytes.
    std::string o;
    ExtendOutcome out;
    ASSERT_TRUE(
        ExtendStep(alone.store.get(), &alone.compute, "", s->Args(alone.Create()), &o, &out).ok());
    EXPECT_EQ(r.o, o);
  }
  batcher_->Stop();
  for (auto& s : steps) EXPECT_EQ(s->done_calls.load(), 1);
}

TEST_F(StepBatcherTest, TwoStepsOfOneSequenceRunInOrderInSeparateBatches) {
  Make(2);
  const std::string id = world_.Create();
  Step first(0, 2, 1), second(2, 1, 2);
  std::vector<StepRequest> requests;
  requests.push_back(Request(&first, id));
  requests.push_back(Request(&second, id));
  ASSERT_TRUE(batcher_->Enqueue(&requests).ok());
  // The second step may not join the first's batch, so that batch is full at one step and runs
  // now; the second then waits alone for a partner (the delay is 60 s) until Stop runs it.
  Wait(&first);
  ASSERT_TRUE(first.result.status.ok()) << first.result.status.ToString();
  EXPECT_EQ(first.result.launch_size, 1);
  EXPECT_EQ(first.result.outcome.length, 2);
  EXPECT_EQ(second.done_calls.load(), 0);
  batcher_->Stop();
  ASSERT_EQ(second.done_calls.load(), 1);
  ASSERT_TRUE(second.result.status.ok()) << second.result.status.ToString();
  EXPECT_EQ(second.result.launch_size, 1);
  EXPECT_EQ(second.result.outcome.length, 3);
  EXPECT_EQ(world_.Length(id), 3);
}

TEST_F(StepBatcherTest, ExpiredOrCancelledStepsAreDroppedUnapplied) {
  Make(1);
  const std::string a = world_.Create(), b = world_.Create(), c = world_.Create();
  Step late(0, 1, 1), gone(0, 1, 2), wrong(5, 1, 3);
  std::vector<StepRequest> requests;
  requests.push_back(
      Request(&late, a, nullptr, std::chrono::system_clock::now() - std::chrono::seconds(1)));
  requests.push_back(Request(&gone, b, [] { return true; }));
  requests.push_back(Request(&wrong, c, [] { return false; }));  // position 5 of an empty layer
  ASSERT_TRUE(batcher_->Enqueue(&requests).ok());
  for (Step* s : {&late, &gone, &wrong}) Wait(s);
  EXPECT_EQ(late.result.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(late.result.ran);
  EXPECT_EQ(gone.result.status.code(), StatusCode::kCancelled);
  EXPECT_FALSE(gone.result.ran);
  // A step that fails on its own ran (the client gets its status, not a dropped call's).
  EXPECT_EQ(wrong.result.status.code(), StatusCode::kFailedPrecondition)
      << wrong.result.status.ToString();
  EXPECT_TRUE(wrong.result.ran);
  EXPECT_TRUE(wrong.result.o.empty());
  batcher_->Stop();
  for (const std::string& id : {a, b, c}) EXPECT_EQ(world_.Length(id), 0) << id;
  for (Step* s : {&late, &gone, &wrong}) EXPECT_EQ(s->done_calls.load(), 1);
}

TEST_F(StepBatcherTest, RefusedEnqueueHandsTheRequestsBackWithoutCallingDone) {
  Make(8, /*max_queued=*/1);
  const std::string a = world_.Create(), b = world_.Create();
  Step first(0, 1, 1), second(0, 1, 2), third(0, 1, 3);
  std::vector<StepRequest> one;
  one.push_back(Request(&first, a));
  ASSERT_TRUE(batcher_->Enqueue(&one).ok());  // waits: its batch is not full
  std::vector<StepRequest> two;
  two.push_back(Request(&second, b));
  two.push_back(Request(&third, world_.Create()));
  Status full = batcher_->Enqueue(&two);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  ASSERT_EQ(two.size(), 2u);  // given back, intact
  EXPECT_EQ(two[0].args.sequence_id, b);
  EXPECT_TRUE(static_cast<bool>(two[0].done));
  batcher_->Stop();  // runs the waiting step
  Status stopping = batcher_->Enqueue(&two);
  EXPECT_EQ(stopping.code(), StatusCode::kUnavailable) << stopping.ToString();
  EXPECT_EQ(first.done_calls.load(), 1);
  EXPECT_TRUE(first.result.status.ok()) << first.result.status.ToString();
  EXPECT_EQ(second.done_calls.load(), 0);
  EXPECT_EQ(third.done_calls.load(), 0);
  EXPECT_EQ(world_.Length(b), 0);
}

TEST_F(StepBatcherTest, InternalFromTheLaunchIsADeviceFault) {
  FaultingPaged faulting(/*ok_launches=*/1);
  Make(1, 64, &faulting);
  std::atomic<int> faults{0};
  batcher_->SetFaultHandler([&faults] { faults.fetch_add(1); });
  const std::string id = world_.Create();
  Step good(0, 1, 1), bad(1, 1, 2);
  std::vector<StepRequest> first;
  first.push_back(Request(&good, id));
  ASSERT_TRUE(batcher_->Enqueue(&first).ok());
  Wait(&good);
  ASSERT_TRUE(good.result.status.ok()) << good.result.status.ToString();
  EXPECT_EQ(faults.load(), 0);  // a good launch is no fault
  std::vector<StepRequest> second;
  second.push_back(Request(&bad, id));
  ASSERT_TRUE(batcher_->Enqueue(&second).ok());
  Wait(&bad);
  EXPECT_EQ(bad.result.status.code(), StatusCode::kInternal) << bad.result.status.ToString();
  EXPECT_TRUE(bad.result.ran);
  EXPECT_EQ(faults.load(), 1);
  EXPECT_EQ(world_.Length(id), 1);  // the failed step was rolled back
  batcher_->Stop();
}

}  // namespace
}  // namespace attn
