// Unit tests of the sequence store (kv_cache/sequence_store.h) with in-process Extend steps:
// create/extend/release without leaks, the replay-output and metadata budgets, ownership that
// hides existence, copy-on-write forks, truncation keeping the reservation, exhaustion that
// harms nothing, LRU eviction and idle TTL with an injected clock, FP8 scales, and ids that
// carry the store's replica tag (another replica's ids are NOT_FOUND naming both tags). The
// per-identity accounting is in sequence_store_quota_test.cc. No network, no device.
#include "kv_cache/sequence_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_step.h"
#include "kv_cache/host_pool.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_id.h"
#include "kv_test_fixtures.h"

namespace attn {
namespace {

using kernels::DType;

using testing::PoolFixture;

class StoreTest : public ::testing::Test {
 protected:
  void Make(SequenceStoreOptions o, int64_t bytes = 1 << 20) {
    f_ = std::make_unique<PoolFixture>(bytes);
    store_ = std::make_unique<SequenceStore>(&f_->pool, o, [this] { return now_us_; });
  }
  SequenceConfig Config(int layers = 2, DType kv = DType::kFloat32, int64_t reserve = 0) {
    SequenceConfig c;
    c.num_layers = layers;
    c.num_kv_heads = 1;
    c.head_dim = 8;
    c.num_heads = 2;
    c.dtype = DType::kFloat32;
    c.kv_dtype = kv;
    c.scale = 0.35f;
    c.reserve_tokens = reserve;
    return c;
  }
  std::string Create(const std::string &owner = "", SequenceConfig c = {}) {
    if (c.num_layers == 0) c = Config();
    auto s = store_->Create(owner, c);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->seq->id : "";
  }
  // Appends T random tokens at the layer's end; returns the status; stores
  // history.
  Status Step(const std::string &id, int layer, int64_t position, int64_t T, uint32_t seed,
              std::string *o, const std::string &owner = "") {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n;
    q_.resize(T * 2 * 8);
    k_.resize(T * 8);
    v_.resize(T * 8);
    for (auto &x : q_) x = n(rng);
    for (auto &x : k_) x = n(rng);
    for (auto &x : v_) x = n(rng);
    ExtendArgs a;
    a.sequence_id = id;
    a.layer = layer;
    a.position = position;
    a.q_shape = {T, 2, 8};
    a.k_shape = a.v_shape = {T, 1, 8};
    a.q = q_.data();
    a.k = k_.data();
    a.v = v_.data();
    a.q_bytes = q_.size() * 4;
    a.k_bytes = a.v_bytes = k_.size() * 4;
    ExtendOutcome out;
    return ExtendStep(store_.get(), &compute_, owner, a, o, &out);
  }
  int64_t Length(const std::string &id, int layer) {
    auto s = store_->Acquire(id, "");
    return s.ok() ? s->seq->layers[layer].table.length() : -1;
  }

  int64_t now_us_ = 0;
  std::unique_ptr<PoolFixture> f_;
  std::unique_ptr<SequenceStore> store_;
  CpuPagedAttention compute_{1};
  std::vector<float> q_, k_, v_;
};

TEST_F(StoreTest, CreateExtendReleaseNoLeak) {
  Make({});
  const std::string id = Create();
  EXPECT_EQ(id.size(), 32u);
  std::string o;
  ASSERT_TRUE(Step(id, 0, 0, 6, 1, &o).ok());
  EXPECT_EQ(o.size(), 6u * 2 * 8 * 4);
  ASSERT_TRUE(Step(id, 0, 6, 1, 2, &o).ok());
  EXPECT_EQ(Length(id, 0), 7);
  EXPECT_EQ(Length(id, 1), 0);
  Status s = Step(id, 0, 5, 1, 3, &o);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("length 7"), std::string::npos) << s.message();
  EXPECT_EQ(Step(id, 2, 0, 1, 3, &o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Length(id, 0), 7);
  EXPECT_EQ(f_->pool.Stats()[0].pages_used, 2);  // 7 tokens in pages of 4
  int64_t freed = 0;
  ASSERT_TRUE(store_->Release(id, "", &freed).ok());
  EXPECT_EQ(freed, 2);
  EXPECT_EQ(store_->Acquire(id, "").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f_->pool.Stats()[0].pages_used, 0);
  EXPECT_EQ(f_->memory->used(), 0u);
}

// Stored replay outputs are charged to --replay-cache-bytes: a step whose output fits is
// answered again on an exact retry; one that does not fit is not stored, and its retry gets
// FAILED_PRECONDITION with the actual length (nothing appended twice); every byte is given back
// when steps are superseded, truncated or released.
TEST_F(StoreTest, ReplayOutputsAreBoundedByTheReplayBudget) {
  SequenceStoreOptions o;
  o.replay_cache_bytes = 1000;  // a 1-token output is 2*8*4 = 64 bytes, 20 tokens 1280
  Make(o);
  const std::string id = Create();
  std::string first, again;
  ASSERT_TRUE(Step(id, 0, 0, 1, 1, &first).ok());
  EXPECT_EQ(store_->replay_budget()->used(), 64);
  ASSERT_TRUE(Step(id, 0, 0, 1, 1, &again).ok());  // exact replay: stored result, no append
  EXPECT_EQ(again, first);
  EXPECT_EQ(Length(id, 0), 1);
  // 20 tokens: 1280 bytes of output do not fit 1000: applied, but not replayable.
  ASSERT_TRUE(Step(id, 0, 1, 20, 2, &first).ok());
  EXPECT_EQ(store_->replay_budget()->used(), 0);  // the superseded 64 bytes went back too
  Status s = Step(id, 0, 1, 20, 2, &again);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("length 21"), std::string::npos) << s.message();
  EXPECT_EQ(Length(id, 0), 21);
  // Both layers hold a stored step; release gives every byte back.
  ASSERT_TRUE(Step(id, 0, 21, 1, 3, &first).ok());
  ASSERT_TRUE(Step(id, 1, 0, 1, 4, &first).ok());
  EXPECT_EQ(store_->replay_budget()->used(), 128);
  store_->Truncate(store_->Acquire(id, "")->seq.get(), 10);
  EXPECT_EQ(store_->replay_budget()->used(), 64);  // layer 0's step is gone with truncation
  int64_t freed = 0;
  ASSERT_TRUE(store_->Release(id, "", &freed).ok());
  EXPECT_EQ(store_->replay_budget()->used(), 0);
}

// Sequences' own host metadata (~170 bytes per layer before any KV page) is charged to
// --sequence-metadata-bytes: a CreateSequence or ForkSequence past it gets RESOURCE_EXHAUSTED
// naming the numbers and changes nothing; releasing a sequence gives its bytes back.
TEST_F(StoreTest, SequenceMetadataIsBoundedByItsBudget) {
  const SequenceConfig many = Config(4096);
  const int64_t each = SequenceMetadataBytes(many);
  EXPECT_GT(each, 4096 * 100);  // what made 20,000 empty 4096-layer sequences take 13.9 GiB
  SequenceStoreOptions o;
  o.sequence_metadata_bytes = 2 * each + each / 2;  // room for two such sequences
  Make(o);
  const std::string a = Create("", many);
  const std::string b = Create("", many);
  EXPECT_EQ(store_->metadata_budget()->used(), 2 * each);
  auto third = store_->Create("", many);
  ASSERT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--sequence-metadata-bytes"), std::string::npos)
      << third.status().message();
  auto fork = store_->Fork(a, "", std::nullopt);
  ASSERT_EQ(fork.status().code(), StatusCode::kResourceExhausted) << fork.status().ToString();
  EXPECT_EQ(store_->live_sequences(), 2);
  EXPECT_EQ(store_->metadata_budget()->used(), 2 * each);
  // A small sequence still fits; releasing a big one makes room for a fork again.
  const std::string small = Create("", Config(2));
  ASSERT_TRUE(store_->Release(b, "", nullptr).ok());
  std::string child_id;
  {
    auto child = store_->Fork(a, "", std::nullopt);  // its lock and reference end here
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    child_id = child->seq->id;
  }
  for (const std::string &id : {a, small, child_id}) {
    ASSERT_TRUE(store_->Release(id, "", nullptr).ok());
  }
  EXPECT_EQ(store_->live_sequences(), 0);
  EXPECT_EQ(store_->metadata_budget()->used(), 0);
}

TEST_F(StoreTest, OwnershipHidesExistence) {
  Make({});
  const std::string id = Create("alice");
  auto mine = store_->Acquire(id, "alice");
  ASSERT_TRUE(mine.ok());
  mine->lock.unlock();
  auto theirs = store_->Acquire(id, "bob");
  EXPECT_EQ(theirs.status().code(), StatusCode::kNotFound);
  std::string unknown =
      store_->Acquire("00000000000000000000000000000000", "bob").status().message();
  EXPECT_EQ(theirs.status().message(), unknown.replace(9, 32, id));
  EXPECT_EQ(store_->Release(id, "bob", nullptr).code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->Acquire(id, "alice").ok());
}

TEST_F(StoreTest, ForkSharesPagesCopyOnWrite) {
  Make({});
  const std::string a = Create();
  std::string o;
  ASSERT_TRUE(Step(a, 0, 0, 6, 1, &o).ok());  // pages: [full 4][2 of 4]
  auto child = store_->Fork(a, "", std::nullopt);
  ASSERT_TRUE(child.ok());
  const std::string b = child->seq->id;
  const std::vector<int32_t> shared = child->seq->layers[0].table.pages();
  child->lock.unlock();
  SubPool *sub = *f_->pool.GetClass({1, 8, DType::kFloat32});
  EXPECT_EQ(f_->pool.RefCount(sub, shared[0]), 2);
  EXPECT_EQ(f_->pool.RefCount(sub, shared[1]), 2);
  EXPECT_EQ(sub->pages_used(), 2);
  // The child appends into the shared partial page: it gets a private copy.
  ASSERT_TRUE(Step(b, 0, 6, 1, 7, &o).ok());
  {
    auto cb = store_->Acquire(b, "");
    EXPECT_EQ(cb->seq->layers[0].table.pages()[0], shared[0]);
    EXPECT_NE(cb->seq->layers[0].table.pages()[1], shared[1]);
  }
  EXPECT_EQ(f_->pool.RefCount(sub, shared[1]), 1);
  EXPECT_EQ(sub->pages_used(), 3);
  // The parent appends too: its partial page is now exclusive, written in
  // place.
  ASSERT_TRUE(Step(a, 0, 6, 2, 8, &o).ok());
  {
    auto ca = store_->Acquire(a, "");
    EXPECT_EQ(ca->seq->layers[0].table.pages()[1], shared[1]);
  }
  ASSERT_TRUE(store_->Release(a, "", nullptr).ok());
  EXPECT_EQ(f_->pool.RefCount(sub, shared[0]), 1);
  ASSERT_TRUE(store_->Release(b, "", nullptr).ok());
  EXPECT_EQ(sub->pages_used(), 0);
}

TEST_F(StoreTest, TruncateKeepsReservation) {
  Make({});
  const std::string id = Create("", Config(1, DType::kFloat32, /*reserve=*/8));
  {
    auto s = store_->Acquire(id, "");
    EXPECT_EQ(s->seq->layers[0].spare.size(), 2u);
  }
  std::string o;
  ASSERT_TRUE(Step(id, 0, 0, 10, 1, &o).ok());  // 3 pages: 2 reserved + 1 new
  SubPool *sub = *f_->pool.GetClass({1, 8, DType::kFloat32});
  EXPECT_EQ(sub->pages_used(), 3);
  {
    auto s = store_->Acquire(id, "");
    store_->Truncate(s->seq.get(), 3);
    EXPECT_EQ(s->seq->layers[0].table.length(), 3);
    EXPECT_EQ(s->seq->layers[0].table.num_blocks(), 1);
    EXPECT_EQ(s->seq->layers[0].spare.size(),
              1u);  // back to the 2-page reservation
  }
  EXPECT_EQ(sub->pages_used(), 2);
  ASSERT_TRUE(Step(id, 0, 3, 1, 2, &o).ok());
  EXPECT_EQ(Length(id, 0), 4);
}

TEST_F(StoreTest, ExhaustionHarmsNothing) {
  Make({},
       16 << 10);  // page 128 B, chunk 17*128 B: 7 chunks of 8 pages = 56 pages
  const std::string a = Create();
  std::string o;
  ASSERT_TRUE(Step(a, 0, 0, 40, 1, &o).ok());  // 10 pages
  const std::string b = Create();
  Status s = Step(b, 0, 0, 4 * 50, 2, &o);  // 50 pages: too many
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("need 50 pages"), std::string::npos) << s.message();
  EXPECT_EQ(Length(b, 0), 0);
  EXPECT_EQ(Length(a, 0), 40);
  ASSERT_TRUE(Step(a, 0, 40, 1, 3, &o).ok());
  auto big = Config(1, DType::kFloat32, 4 * 100);
  EXPECT_EQ(store_->Create("", big).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->live_sequences(), 2);
}

TEST_F(StoreTest, LruEvictionOfIdleSequences) {
  Make({/*evict_idle=*/true}, 16 << 10);
  const std::string a = Create();
  std::string o;
  ASSERT_TRUE(Step(a, 0, 0, 4 * 20, 1, &o).ok());
  now_us_ += 10;
  const std::string b = Create();
  ASSERT_TRUE(Step(b, 0, 0, 4 * 20, 2, &o).ok());
  now_us_ += 10;
  const std::string c = Create();
  ASSERT_TRUE(Step(c, 0, 0, 4 * 20, 3, &o).ok());  // a (least recently used) is evicted
  Status s = store_->Acquire(a, "").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("evicted"), std::string::npos) << s.message();
  EXPECT_NE(store_->Acquire(a, "x").status().message().find("not found"), std::string::npos);
  EXPECT_TRUE(store_->Acquire(b, "").ok());
  EXPECT_EQ(store_->evictions(), 1);
  // A request no eviction can satisfy evicts nothing.
  const std::string d = Create();
  EXPECT_EQ(Step(d, 0, 0, 4 * 200, 4, &o).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_->Acquire(b, "").ok());
  EXPECT_TRUE(store_->Acquire(c, "").ok());
}

TEST_F(StoreTest, IdleTtlExpires) {
  Make({false, /*ttl_s=*/2.0});
  const std::string a = Create();
  const std::string b = Create();
  now_us_ += 1500000;
  EXPECT_TRUE(store_->Acquire(b, "").ok());  // b used at 1.5 s
  now_us_ += 1000000;                        // 2.5 s: a idle 2.5 s, b 1.0 s
  Status s = store_->Acquire(a, "").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("expired"), std::string::npos) << s.message();
  EXPECT_TRUE(store_->Acquire(b, "").ok());
  EXPECT_EQ(store_->expirations(), 1);
}

TEST_F(StoreTest, Fp8ScalesFromFirstPrefill) {
  Make({});
  const std::string id = Create("", Config(1, DType::kFloat8E4M3));
  std::string o;
  ASSERT_TRUE(Step(id, 0, 0, 9, 1, &o).ok());
  auto s = store_->Acquire(id, "");
  ASSERT_EQ(s->seq->layers[0].k_scales.size(), 1u);
  EXPECT_GT(s->seq->layers[0].k_scales[0], 0.f);
  EXPECT_EQ(s->seq->fp8_saturations, 0);
}

class ReplicaStoreTest : public testing::ReplicaStoreTestBase {};

TEST_F(ReplicaStoreTest, IdsCarryTheStoreTagAndForeignIdsAreNotFoundNamingBothTags) {
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

}  // namespace
}  // namespace attn
