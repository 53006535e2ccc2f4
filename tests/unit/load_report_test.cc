// Unit tests of the GetLoad report (service/load_report.h, DESIGN.md §12): replica tag and
// address, sequences, KV pages and bytes, calls queued and in flight, draining; the sources
// are read on every report.
#include "service/load_report.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "kv_cache/host_pool.h"
#include "kv_test_fixtures.h"

namespace attn {
namespace {

using kernels::DType;

class LoadReporterTest : public testing::ReplicaStoreTestBase {};

TEST_F(LoadReporterTest, LoadReportCountsSequencesPagesInFlightQueueAndDraining) {
  auto store = MakeStore(0xabcdef01u, "pod-a:50051");
  LoadReporter load(store.get(), /*max_queue_requests=*/77, /*worker_threads=*/3);
  int64_t queued = 5;
  load.SetQueueDepthSource([&queued] { return queued; });
  load.AddInFlightSource([] { return int64_t{2}; });
  load.AddInFlightSource([] { return int64_t{4}; });

  attention::v1::GetLoadResponse r;
  load.Fill(&r);
  EXPECT_EQ(r.replica().replica_tag(), "abcdef01");
  EXPECT_EQ(r.replica().address(), "pod-a:50051");
  EXPECT_FALSE(r.draining());
  EXPECT_EQ(r.requests_queued(), 5);
  EXPECT_EQ(r.requests_in_flight(), 6);
  EXPECT_EQ(r.max_queue_requests(), 77);
  EXPECT_EQ(r.worker_threads(), 3);
  EXPECT_EQ(r.sequences(), 0);
  EXPECT_EQ(r.kv_pool_bytes(), 1 << 20);

  auto created = store->Create("", Config());  // reserves 32 tokens = 2 pages of 16
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  created->lock.unlock();
  queued = 9;  // the source is read on every report (the batcher's queue feeds it the same way)
  load.SetDraining();
  r.Clear();
  load.Fill(&r);
  EXPECT_TRUE(r.draining());
  EXPECT_EQ(r.requests_queued(), 9);
  EXPECT_EQ(r.sequences(), 1);
  ASSERT_EQ(r.kv_classes_size(), 1);
  EXPECT_EQ(r.kv_classes(0).num_kv_heads(), 2);
  EXPECT_EQ(r.kv_classes(0).head_dim(), 8);
  EXPECT_EQ(r.kv_classes(0).pages_used(), 2);
  EXPECT_GE(r.kv_classes(0).pages_total(), 2);
  EXPECT_GT(r.kv_pool_used_bytes(), 0);
  // A new queue-depth source replaces the old one.
  load.SetQueueDepthSource([] { return int64_t{42}; });
  r.Clear();
  load.Fill(&r);
  EXPECT_EQ(r.requests_queued(), 42);
}

}  // namespace
}  // namespace attn
