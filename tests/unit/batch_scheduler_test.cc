// BatchScheduler (server/batching/batch_scheduler.h): coalescing of waiting work, FIFO per
// signature, exclusive keys, cancellation and deadlines before launch, the bounded queue and
// Stop. A gate holds the only executor thread busy so that work piles up deterministically;
// the tests wait on futures, never on sleeps.
#include "batching/batch_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <vector>

namespace attn {
namespace {

struct Log {
  std::mutex mu;
  std::vector<std::vector<int>> batches;     // ids per executed batch
  std::vector<std::pair<int, int>> dropped;  // (id, status code)
};

class TestItem final : public BatchItem {
 public:
  TestItem(int id, Log* log, std::string sig, int64_t tokens = 1, std::string key = "")
      : id(id), log(log) {
    signature = std::move(sig);
    this->tokens = tokens;
    exclusive_key = std::move(key);
  }
  bool Cancelled() const override { return cancelled.load(); }
  std::chrono::system_clock::time_point deadline() const override { return deadline_at; }
  void Drop(const Status& status) override {
    std::lock_guard<std::mutex> lock(log->mu);
    log->dropped.emplace_back(id, static_cast<int>(status.code()));
    if (on_drop) on_drop->set_value();
  }

  int id;
  Log* log;
  std::atomic<bool> cancelled{false};
  std::chrono::system_clock::time_point deadline_at = std::chrono::system_clock::time_point::max();
  std::promise<void>* on_drop = nullptr;
};

// One executor thread; the first batch blocks until `Release()`; `Wait(n)` waits until n
// batches ran.
class SchedulerTest : public ::testing::Test {
 protected:
  void Make(BatchPolicy policy, int64_t max_queued = 1024) {
    BatchSchedulerOptions o;
    o.policy = policy;
    o.threads = 1;
    o.max_queued = max_queued;
    o.name = "test";
    scheduler_ = std::make_unique<BatchScheduler>(
        o, [this](std::vector<std::unique_ptr<BatchItem>>& batch) {
          std::vector<int> ids;
          for (auto& b : batch) ids.push_back(static_cast<TestItem*>(b.get())->id);
          bool first;
          {
            std::lock_guard<std::mutex> lock(log_.mu);
            first = log_.batches.empty();
            log_.batches.push_back(ids);
          }
          if (first) {
            started_.set_value();
            gate_.wait();
          }
          std::lock_guard<std::mutex> lock(ran_mu_);
          ++ran_;
          ran_cv_.notify_all();
        });
  }
  TestItem* Add(int id, const std::string& sig, int64_t tokens = 1, const std::string& key = "",
                Status* status = nullptr) {
    auto item = std::make_unique<TestItem>(id, &log_, sig, tokens, key);
    TestItem* raw = item.get();
    std::unique_ptr<BatchItem> b = std::move(item);
    Status s = scheduler_->Enqueue(&b);
    if (status != nullptr) *status = s;
    else EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? raw : nullptr;
  }
  // Enqueues id 0 and waits until the executor is blocked on it.
  void Block() {
    Add(0, "blocker");
    started_.get_future().wait();
  }
  void Release() { release_.set_value(); }
  void WaitRan(int n) {
    std::unique_lock<std::mutex> lock(ran_mu_);
    ran_cv_.wait(lock, [&] { return ran_ >= n; });
  }

  Log log_;
  std::promise<void> started_, release_;
  std::shared_future<void> gate_ = release_.get_future().share();
  std::mutex ran_mu_;
  std::condition_variable ran_cv_;
  int ran_ = 0;
  std::unique_ptr<BatchScheduler> scheduler_;
};

TEST_F(SchedulerTest, WaitingCompatibleWorkRunsAsOneBatchInFifoOrder) {
  Make({1000, 64, 0});
  Block();
  for (int i = 1; i <= 5; ++i) Add(i, "a");
  EXPECT_EQ(scheduler_->queued_requests(), 5);
  EXPECT_EQ(scheduler_->queued_tokens(), 5);
  Release();
  WaitRan(2);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(scheduler_->queued_requests(), 0);
  EXPECT_EQ(scheduler_->queued_tokens(), 0);
}

TEST_F(SchedulerTest, SignaturesNeverMixAndOldestHeadGoesFirst) {
  Make({1000, 64, 0});
  Block();
  Add(1, "a");
  Add(2, "b");
  Add(3, "a");
  Add(4, "b");
  Release();
  WaitRan(3);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(log_.batches[2], (std::vector<int>{2, 4}));
}

TEST_F(SchedulerTest, RequestAndTokenLimitsSplitBatches) {
  Make({10, 2, 0});
  Block();
  Add(1, "a", 3);
  Add(2, "a", 3);
  Add(3, "a", 3);  // request limit 2: {1,2}, then {3,4}
  Add(4, "a", 3);
  Add(5, "a", 8);  // 8 alone fits; with 6 (3) it would exceed 10
  Add(6, "a", 3);
  Add(7, "a", 50);  // oversize: alone
  Release();
  WaitRan(6);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{1, 2}));
  EXPECT_EQ(log_.batches[2], (std::vector<int>{3, 4}));
  EXPECT_EQ(log_.batches[3], (std::vector<int>{5}));
  EXPECT_EQ(log_.batches[4], (std::vector<int>{6}));
  EXPECT_EQ(log_.batches[5], (std::vector<int>{7}));
}

TEST_F(SchedulerTest, ExclusiveKeyNeverTwiceInOneBatch) {
  Make({1000, 64, 0});
  Block();
  Add(1, "a", 1, "seq1");
  Add(2, "a", 1, "seq2");
  Add(3, "a", 1, "seq1");
  Add(4, "a", 1, "seq3");
  Release();
  WaitRan(3);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{1, 2}));
  EXPECT_EQ(log_.batches[2], (std::vector<int>{3, 4}));
}

TEST_F(SchedulerTest, CancelledWhileQueuedIsDroppedAtOnceAndNeverRuns) {
  Make({1000, 64, 0});
  Block();
  TestItem* victim = Add(1, "a");
  Add(2, "a");
  std::promise<void> dropped;
  victim->on_drop = &dropped;
  victim->cancelled.store(true);
  // The executor thread is blocked, so nobody sweeps until Notify: then the one thread... is
  // busy. Release it; the next batch formation drops the cancelled item before launch.
  scheduler_->Notify();
  Release();
  dropped.get_future().wait();
  WaitRan(2);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{2}));
  ASSERT_EQ(log_.dropped.size(), 1u);
  EXPECT_EQ(log_.dropped[0], std::make_pair(1, static_cast<int>(StatusCode::kCancelled)));
  EXPECT_EQ(scheduler_->queued_requests(), 0);
}

TEST_F(SchedulerTest, NotifySweepsCancelledItemsWhileTheirBatchWaits) {
  // A long delay holds the batch back; Notify must still release the cancelled call now.
  Make({1000, 64, 60'000'000});
  TestItem* victim = Add(1, "a");
  std::promise<void> dropped;
  victim->on_drop = &dropped;
  victim->cancelled.store(true);
  scheduler_->Notify();
  dropped.get_future().wait();
  EXPECT_EQ(scheduler_->queued_requests(), 0);
  std::lock_guard<std::mutex> lock(log_.mu);
  EXPECT_TRUE(log_.batches.empty());
}

TEST_F(SchedulerTest, ExpiredDeadlineIsDroppedBeforeLaunch) {
  Make({1000, 64, 0});
  Block();
  TestItem* late = Add(1, "a");
  late->deadline_at = std::chrono::system_clock::now() - std::chrono::seconds(1);
  Add(2, "a");
  Release();
  WaitRan(2);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{2}));
  ASSERT_EQ(log_.dropped.size(), 1u);
  EXPECT_EQ(log_.dropped[0], std::make_pair(1, static_cast<int>(StatusCode::kDeadlineExceeded)));
}

// When a deadline passes gRPC also cancels the call: such an item is reported as
// DEADLINE_EXCEEDED (why it died), not CANCELLED.
TEST_F(SchedulerTest, ExpiredAndCancelledIsReportedAsDeadlineExceeded) {
  Make({1000, 64, 0});
  Block();
  TestItem* late = Add(1, "a");
  late->deadline_at = std::chrono::system_clock::now() - std::chrono::seconds(1);
  late->cancelled.store(true);
  Add(2, "a");
  Release();
  WaitRan(2);
  ASSERT_EQ(log_.dropped.size(), 1u);
  EXPECT_EQ(log_.dropped[0], std::make_pair(1, static_cast<int>(StatusCode::kDeadlineExceeded)));
}

TEST_F(SchedulerTest, FullQueueIsRefusedWithTheNumbers) {
  Make({1000, 64, 0}, 2);
  Block();
  Add(1, "a");
  Add(2, "a");
  Status s;
  EXPECT_EQ(Add(3, "a", 1, "", &s), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("2 waiting"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("limit 2"), std::string::npos) << s.message();
  EXPECT_EQ(scheduler_->queued_requests(), 2);
  Release();
  WaitRan(2);
  EXPECT_EQ(log_.batches[1], (std::vector<int>{1, 2}));
  // Room again.
  Add(4, "a");
  WaitRan(3);
}

TEST_F(SchedulerTest, StopRunsQueuedWorkDespiteALongDelayAndRefusesNewWork) {
  Make({1000, 64, 60'000'000});
  Add(1, "a");
  Add(2, "a");
  release_.set_value();  // the first batch must not block
  scheduler_->Stop();
  ASSERT_EQ(log_.batches.size(), 1u);
  EXPECT_EQ(log_.batches[0], (std::vector<int>{1, 2}));
  Status s;
  EXPECT_EQ(Add(3, "a", 1, "", &s), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace attn
