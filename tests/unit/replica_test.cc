// Unit tests for scale-out support (DESIGN.md §12): sequence ids that name their replica, the
// SequenceStore's refusal of another replica's ids, the GetLoad report, the NVIDIA driver check
// and flags from environment variables.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/driver_check.h"
#include "config/server_flags.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_id.h"
#include "kv_cache/sequence_store.h"
#include "device/host_pool.h"
#include "service/load_report.h"

namespace attn {
namespace {

using kernels::DType;

TEST(SequenceId, StartsWithTheReplicaTagAndIsOtherwiseRandom) {
  std::random_device rd;
  const uint32_t tag = 0x0a1b2c3du;
  EXPECT_EQ(ReplicaTagHex(tag), "0a1b2c3d");
  std::set<std::string> tails;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewSequenceId(tag, rd);
    ASSERT_TRUE(IsSequenceId(id)) << id;
    EXPECT_EQ(id.substr(0, 8), "0a1b2c3d");
    EXPECT_EQ(ReplicaTagOfId(id), "0a1b2c3d");
    tails.insert(id.substr(8));
  }
  EXPECT_EQ(tails.size(), 1000u) << "96 random bits should never repeat in 1000 draws";
}

TEST(SequenceId, MalformedIdsHaveNoTag) {
  for (const std::string &bad : std::vector<std::string>{
           "", "0a1b2c3d", std::string(32, 'g'), std::string(33, 'a'), std::string(32, 'A')}) {
    EXPECT_FALSE(IsSequenceId(bad)) << bad;
    EXPECT_EQ(ReplicaTagOfId(bad), "") << bad;
  }
}

TEST(SequenceId, ReplicaTagsDifferBetweenDraws) {
  std::set<uint32_t> tags;
  for (int i = 0; i < 64; ++i) tags.insert(NewReplicaTag());
  EXPECT_GT(tags.size(), 60u);
}

class StoreTest : public ::testing::Test {
 protected:
  StoreTest()
      : memory_(std::move(*HostPool::Create(1 << 20))), pages_(memory_.get(), PagePoolOptions{}) {}
  std::unique_ptr<SequenceStore> MakeStore(uint32_t tag, const std::string &address) {
    SequenceStoreOptions o;
    o.replica_tag = tag;
    o.replica_address = address;
    return std::make_unique<SequenceStore>(&pages_, o);
  }
  static SequenceConfig Config() {
    SequenceConfig c;
    c.num_layers = 1;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.num_heads = 4;
    c.dtype = c.kv_dtype = DType::kFloat32;
    c.scale = 0.25f;
    c.reserve_tokens = 32;
    return c;
  }
  std::unique_ptr<HostPool> memory_;
  PagePool pages_;
};

TEST_F(StoreTest, IdsCarryTheStoreTagAndForeignIdsAreNotFoundNamingBothTags) {
  auto a = MakeStore(0x11111111u, "10.0.0.1:50051");
  auto b = MakeStore(0x22222222u, "10.0.0.2:50051");
  auto created = a->Create("alice", Config());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const std::string id = created->seq->id;
  created->lock.unlock();
  EXPECT_EQ(ReplicaTagOfId(id), "11111111");
  EXPECT_TRUE(a->Acquire(id, "alice").ok());
  // The same id on another replica: NOT_FOUND that names the tags (misrouted call).
  auto other = b->Acquire(id, "alice");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kNotFound);
  EXPECT_NE(other.status().message().find("11111111"), std::string::npos);
  EXPECT_NE(other.status().message().find("22222222"), std::string::npos);
  // An unknown id with this replica's own tag gets the ordinary message.
  auto unknown = a->Acquire("11111111" + std::string(24, '0'), "alice");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message().find("replica tag"), std::string::npos);
  EXPECT_TRUE(a->Release(id, "alice", nullptr).ok());
}

TEST_F(StoreTest, LoadReportCountsSequencesPagesInFlightQueueAndDraining) {
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

TEST(DriverCheck, Cuda13NeedsAnR580Driver) {
  EXPECT_EQ(CudaVersionString(13000), "13.0");
  EXPECT_EQ(CudaVersionString(12090), "12.9");
  EXPECT_EQ(CudaVersionString(0), "none");
  EXPECT_TRUE(CheckCudaDriver(13000, 13000).ok());
  EXPECT_TRUE(CheckCudaDriver(13010, 13000).ok());  // newer driver
  EXPECT_TRUE(CheckCudaDriver(13000, 13020).ok());  // minor-version compatibility
  const Status old = CheckCudaDriver(12090, 13000);  // an R575 driver
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("12.9"), std::string::npos) << old.message();
  EXPECT_NE(old.message().find("R580"), std::string::npos) << old.message();
  const Status none = CheckCudaDriver(0, 13000);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("no NVIDIA driver"), std::string::npos) << none.message();
  EXPECT_TRUE(CheckCudaDriver(12040, 12000).ok());
  EXPECT_NE(CheckCudaDriver(11080, 12000).message().find("R525"), std::string::npos);
}

// Runs ParseServerFlags on argv (argv[0] added).
int Parse(std::vector<std::string> args, ServerConfig *c) {
  args.insert(args.begin(), "attention-server");
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(a.data());
  return ParseServerFlags(static_cast<int>(argv.size()), argv.data(), c);
}

// NaN passes CLI::Range (every comparison with it is false); every numeric flag refuses it.
TEST(ServerFlags, NonFiniteNumbersAreRefused) {
  for (const char *flag : {"--drain-timeout-s", "--sequence-ttl-s", "--gpu-memory-fraction",
                           "--shadow-check-fraction"}) {
    for (const char *value : {"nan", "inf", "-inf"}) {
      ServerConfig c;
      EXPECT_NE(Parse({flag, value}, &c), -1) << flag << " " << value;
    }
  }
  ServerConfig ok;
  EXPECT_EQ(Parse({"--drain-timeout-s", "2.5", "--advertise-address", "inf-host:50051"}, &ok),
            -1);
  EXPECT_DOUBLE_EQ(ok.drain_timeout_s, 2.5);
}

TEST(ServerFlags, EveryFlagHasAnAttnEnvironmentVariableAndTheCommandLineWins) {
  setenv("ATTN_ADVERTISE_ADDRESS", "10.1.2.3:50051", 1);
  setenv("ATTN_DRAIN_TIMEOUT_S", "45", 1);
  setenv("ATTN_DRAIN_WAIT_SEQUENCES", "true", 1);
  setenv("ATTN_KV_CACHE_BYTES", "1048576", 1);
  setenv("ATTN_LISTEN", "0.0.0.0:7000", 1);
  ServerConfig c;
  EXPECT_EQ(Parse({"--listen", "127.0.0.1:0"}, &c), -1);
  EXPECT_EQ(c.advertise_address, "10.1.2.3:50051");
  EXPECT_DOUBLE_EQ(c.drain_timeout_s, 45.0);
  EXPECT_TRUE(c.drain_wait_sequences);
  EXPECT_EQ(c.kv_cache_bytes, 1048576);
  EXPECT_EQ(c.listen_address, "127.0.0.1:0");  // flag beats ATTN_LISTEN
  for (const char *v : {"ATTN_ADVERTISE_ADDRESS", "ATTN_DRAIN_TIMEOUT_S",
                        "ATTN_DRAIN_WAIT_SEQUENCES", "ATTN_KV_CACHE_BYTES", "ATTN_LISTEN"}) {
    unsetenv(v);
  }
  ServerConfig d;
  EXPECT_EQ(Parse({}, &d), -1);
  EXPECT_EQ(d.advertise_address, "");
  EXPECT_FALSE(d.drain_wait_sequences);
}

TEST(ServerFlags, BadAdvertiseAddressIsRefused) {
  for (const std::string &bad :
       std::vector<std::string>{"nohostport", "host:", "host:0", "host:70000", ":50051"}) {
    ServerConfig c;
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    EXPECT_NE(Parse({"--advertise-address", bad}, &c), -1) << bad;
    testing::internal::GetCapturedStdout();
    testing::internal::GetCapturedStderr();
  }
  ServerConfig ok;
  EXPECT_EQ(Parse({"--advertise-address", "[fd00::1]:50051"}, &ok), -1);
  EXPECT_EQ(ok.advertise_address, "[fd00::1]:50051");
}

}  // namespace
}  // namespace attn
