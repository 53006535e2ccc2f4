// BatchScheduler's inline runs (server/batching/batch_scheduler.h, inline_max_tokens): small work
// that finds the scheduler idle runs on the caller's thread; anything else, and work that arrives
// while an inline run holds the only executor slot, is queued and batched by the executor thread
// as before; Stop waits for an inline run still on its caller's thread. The executor records the
// thread each batch ran on; a gate holds an inline run so that work piles up deterministically.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batching/batch_scheduler.h"

namespace attn {
namespace {

class Item final : public BatchItem {
 public:
  Item(int id, int64_t tokens, std::string key = "") : id(id) {
    signature = "s";
    this->tokens = tokens;
    exclusive_key = std::move(key);
  }
  bool Cancelled() const override { return false; }
  std::chrono::system_clock::time_point deadline() const override {
    return std::chrono::system_clock::time_point::max();
  }
  void Drop(const Status&) override {}
  int id;
};

struct Ran {
  std::vector<int> ids;
  std::thread::id thread;
};

class InlineTest : public ::testing::Test {
 protected:
  /// One executor thread, inline runs up to 16 tokens; when `gate_first` the first batch waits
  /// for Release().
  void Make(bool gate_first, int64_t delay_us = 0) {
    BatchSchedulerOptions o;
    o.policy = {1000, 64, delay_us};
    o.threads = 1;
    o.name = "test";
    o.inline_max_tokens = 16;
    gate_first_ = gate_first;
    scheduler_ = std::make_unique<BatchScheduler>(
        o, [this](std::vector<std::unique_ptr<BatchItem>>& batch) {
          Ran r;
          r.thread = std::this_thread::get_id();
          for (auto& b : batch) r.ids.push_back(static_cast<Item*>(b.get())->id);
          bool first;
          {
            std::lock_guard<std::mutex> lock(mu_);
            first = ran_.empty();
          }
          if (first && gate_first_) {
            started_.set_value();
            gate_.wait();
          }
          std::lock_guard<std::mutex> lock(mu_);
          ran_.push_back(r);
          cv_.notify_all();
        });
  }
  Status Add(int id, int64_t tokens, const std::string& key = "") {
    std::unique_ptr<BatchItem> b = std::make_unique<Item>(id, tokens, key);
    return scheduler_->Enqueue(&b);
  }
  void WaitRan(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ran_.size() >= n; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Ran> ran_;
  bool gate_first_ = false;
  std::promise<void> started_, release_;
  std::shared_future<void> gate_ = release_.get_future().share();
  std::unique_ptr<BatchScheduler> scheduler_;
};

TEST_F(InlineTest, IdleSmallWorkRunsOnTheCallersThreadBigWorkOnTheExecutor) {
  Make(false);
  ASSERT_TRUE(Add(1, 1).ok());
  // An inline run has finished when Enqueue returns.
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(ran_.size(), 1u);
    EXPECT_EQ(ran_[0].ids, std::vector<int>{1});
    EXPECT_EQ(ran_[0].thread, std::this_thread::get_id());
  }
  EXPECT_EQ(scheduler_->inline_runs(), 1);
  ASSERT_TRUE(Add(2, 17).ok());  // over inline_max_tokens: handed to the executor thread
  WaitRan(2);
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(ran_[1].ids, std::vector<int>{2});
    EXPECT_NE(ran_[1].thread, std::this_thread::get_id());
  }
  // Two steps of one sequence never share a batch: queued, so the executor splits them.
  std::vector<std::unique_ptr<BatchItem>> pair;
  pair.push_back(std::make_unique<Item>(3, 1, "seq"));
  pair.push_back(std::make_unique<Item>(4, 1, "seq"));
  ASSERT_TRUE(scheduler_->Enqueue(&pair).ok());
  WaitRan(4);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(ran_[2].ids, std::vector<int>{3});
  EXPECT_EQ(ran_[3].ids, std::vector<int>{4});
  EXPECT_NE(ran_[2].thread, std::this_thread::get_id());
  EXPECT_EQ(scheduler_->inline_runs(), 1);
  EXPECT_EQ(scheduler_->batches_run(), 4);
}

TEST_F(InlineTest, WorkArrivingDuringAnInlineRunQueuesAndRunsAsOneBatchAfterIt) {
  Make(true);
  std::thread::id caller;
  std::thread first([&] {
    caller = std::this_thread::get_id();
    EXPECT_TRUE(Add(1, 1).ok());  // inline: blocks in the executor until Release
  });
  started_.get_future().wait();
  // The inline run holds the only slot: these queue (not inline, not on the executor thread).
  ASSERT_TRUE(Add(2, 1).ok());
  ASSERT_TRUE(Add(3, 1).ok());
  EXPECT_EQ(scheduler_->queued_requests(), 2);
  EXPECT_EQ(scheduler_->inline_runs(), 1);
  release_.set_value();
  first.join();
  WaitRan(2);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(ran_.size(), 2u);
  EXPECT_EQ(ran_[0].ids, std::vector<int>{1});
  EXPECT_EQ(ran_[0].thread, caller);
  EXPECT_EQ(ran_[1].ids, (std::vector<int>{2, 3})) << "queued behind the inline run: one batch";
  EXPECT_NE(ran_[1].thread, caller);
  EXPECT_NE(ran_[1].thread, std::this_thread::get_id());
}

TEST_F(InlineTest, StopWaitsForAnInlineRunStillOnItsCallersThread) {
  Make(true);
  std::thread first([&] { EXPECT_TRUE(Add(1, 1).ok()); });
  started_.get_future().wait();
  std::promise<void> stopped;
  std::thread stopper([&] {
    scheduler_->Stop();
    stopped.set_value();
  });
  auto done = stopped.get_future();
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "Stop returned while an inline run was still executing";
  release_.set_value();
  done.wait();
  first.join();
  stopper.join();
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(ran_.size(), 1u);
  EXPECT_FALSE(Add(2, 1).ok()) << "after Stop new work is refused";
}

TEST_F(InlineTest, AQueueDelayKeepsSmallWorkQueuedForOthersToJoin) {
  Make(false, /*delay_us=*/60'000'000);  // --max-queue-delay-us: the policy says wait
  ASSERT_TRUE(Add(1, 1).ok());
  EXPECT_EQ(scheduler_->inline_runs(), 0);
  EXPECT_EQ(scheduler_->queued_requests(), 1) << "waits for the delay, not run inline";
  ASSERT_TRUE(Add(2, 1).ok());
  EXPECT_EQ(scheduler_->queued_requests(), 2);
  scheduler_->Stop();  // runs what is queued: one batch of both, on the executor thread
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(ran_.size(), 1u);
  EXPECT_EQ(ran_[0].ids, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_[0].thread, std::this_thread::get_id());
}

}  // namespace
}  // namespace attn
