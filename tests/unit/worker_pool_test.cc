#include "common/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace attn {
namespace {

// Bound of every wait in this test: a pool that never runs the task fails it instead of hanging.
constexpr auto kWaitLimit = std::chrono::seconds(10);

TEST(WorkerPool, RunsEverythingAndRejectsWhenFull) {
  std::atomic<int> ran{0};
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;  // the worker holds the blocking task (popped from the queue)
  bool release = false;  // the blocking task may finish
  WorkerPool pool(1, 2);
  ASSERT_TRUE(pool.TrySubmit([&] {
    std::unique_lock<std::mutex> lock(mu);
    started = true;
    cv.notify_all();
    // Bounded too: if the test fails before releasing it, the task ends and Stop() returns.
    cv.wait_for(lock, kWaitLimit, [&] { return release; });
    ran++;
  }));
  // Wait until the worker holds the blocking task, then fill the queue.
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWaitLimit, [&] { return started; }))
        << "the worker did not start the task within 10 s";
  }
  EXPECT_EQ(pool.queued(), 0u);
  EXPECT_TRUE(pool.TrySubmit([&] { ran++; }));
  EXPECT_TRUE(pool.TrySubmit([&] { ran++; }));
  EXPECT_EQ(pool.queued(), 2u);
  EXPECT_FALSE(pool.TrySubmit([&] { ran++; }));  // bounded: third waiting task refused
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  pool.Stop();
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(pool.TrySubmit([] {}));  // stopped
}

}  // namespace
}  // namespace attn
