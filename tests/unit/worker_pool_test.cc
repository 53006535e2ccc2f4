#include "common/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace attn {
namespace {

TEST(WorkerPool, RunsEverythingAndRejectsWhenFull) {
  std::atomic<int> ran{0};
  std::atomic<bool> release{false};
  WorkerPool pool(1, 2);
  ASSERT_TRUE(pool.TrySubmit([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ran++;
  }));
  // Wait until the worker holds the blocking task, then fill the queue.
  while (pool.queued() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(pool.TrySubmit([&] { ran++; }));
  EXPECT_TRUE(pool.TrySubmit([&] { ran++; }));
  EXPECT_FALSE(pool.TrySubmit([&] { ran++; }));  // bounded: third waiting task refused
  release = true;
  pool.Stop();
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(pool.TrySubmit([] {}));  // stopped
}

}  // namespace
}  // namespace attn
