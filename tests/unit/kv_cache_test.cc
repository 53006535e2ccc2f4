// Unit tests of the paged KV cache: page format (append/gather/FP8), sub-pools
// (O(1) free list, exhaustion numbers, no leaks, reference counts), block
// tables, and the sequence store (copy-on-write forks, truncation,
// reservations, ownership, LRU eviction and TTL with an injected clock). No
// network, no device.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/paged_kv_cpu.h"
#include "kv_cache/block_table.h"
#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_step.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "device/host_pool.h"

namespace attn {
namespace {

using kernels::DType;

TEST(Fp8E4M3, EveryCodeRoundTripsAndSaturates) {
  for (int b = 0; b < 256; ++b) {
    const float x = kernels::Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(x)) {
      EXPECT_TRUE((b & 0x7f) == 0x7f);
      continue;
    }
    bool sat = true;
    const uint8_t back = kernels::FloatToFp8E4M3(x, &sat);
    EXPECT_FALSE(sat);
    if (x == 0.f) {
      EXPECT_EQ(back & 0x7f, 0);
    } else {
      EXPECT_EQ(back, b) << "code " << b << " value " << x;
    }
  }
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(0x7e), 448.f);
  bool sat = false;
  EXPECT_EQ(kernels::FloatToFp8E4M3(1000.f, &sat), 0x7e);
  EXPECT_TRUE(sat);
  EXPECT_EQ(kernels::FloatToFp8E4M3(-1e9f, &sat), 0xfe);
  EXPECT_TRUE(sat);
  // Round to nearest even: 1.0625 lies halfway between 1 (mantissa 0) and 1.125
  // (mantissa 1).
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(kernels::FloatToFp8E4M3(1.0625f)), 1.f);
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(kernels::FloatToFp8E4M3(1.1875f)), 1.25f);
  // Subnormals: 2^-9 is the smallest.
  EXPECT_EQ(kernels::Fp8E4M3ToFloat(kernels::FloatToFp8E4M3(std::ldexp(1.f, -9))),
            std::ldexp(1.f, -9));
  EXPECT_EQ(kernels::FloatToFp8E4M3(std::nanf("")), 0x7f);
}

struct PoolFixture {
  explicit PoolFixture(int64_t bytes = 1 << 20, PagePoolOptions o = {4, 8, true})
      : memory(std::move(*HostPool::Create(bytes))), pool(memory.get(), o) {}
  std::unique_ptr<HostPool> memory;
  PagePool pool;
};

TEST(PagedKvCpu, AppendGatherThroughShuffledBlockTable) {
  PoolFixture f;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat8E4M3}) {
    SubPool *sub = *f.pool.GetClass({2, 8, dt});
    const int64_t T = 11, K = 2, H = 8;
    std::vector<int32_t> pages(3);
    ASSERT_TRUE(f.pool.Allocate(sub, 3, pages.data()).ok());
    std::swap(pages[0], pages[2]);
    std::vector<float> k(T * K * H), v(T * K * H);
    std::mt19937 rng(1);
    std::normal_distribution<float> n;
    for (auto &x : k) x = n(rng);
    for (auto &x : v) x = n(rng);
    const float ks[2] = {0.02f, 0.03f}, vs[2] = {0.02f, 0.025f};
    int64_t sat = 0;
    // Two appends: 5 tokens, then 6 (crossing page boundaries).
    ASSERT_TRUE(kernels::PagedAppendCpu(sub->view(), pages.data(), 3, 0, 5, k.data(), v.data(),
                                        DType::kFloat32, ks, vs, &sat)
                    .ok());
    ASSERT_TRUE(kernels::PagedAppendCpu(sub->view(), pages.data(), 3, 5, 6, k.data() + 5 * K * H,
                                        v.data() + 5 * K * H, DType::kFloat32, ks, vs, &sat)
                    .ok());
    std::vector<float> ko(T * K * H), vo(T * K * H);
    ASSERT_TRUE(kernels::PagedGatherCpu(sub->view(), pages.data(), 3, T, ks, vs, DType::kFloat32,
                                        ko.data(), vo.data())
                    .ok());
    const double tol = dt == DType::kFloat32 ? 0 : dt == DType::kBFloat16 ? 1e-2 : 7e-2;
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_LE(std::fabs(ko[i] - k[i]), tol * std::max(1.f, std::fabs(k[i]))) << i;
      ASSERT_LE(std::fabs(vo[i] - v[i]), tol * std::max(1.f, std::fabs(v[i]))) << i;
    }
    // The page format: element (page, head, slot, dim) at ((p*K +
    // h)*page_tokens + t)*H + d.
    if (dt == DType::kFloat32) {
      const float *kp = static_cast<const float *>(sub->view().k_pages);
      const int64_t tok = 6, h = 1, d = 3;
      EXPECT_EQ(kp[sub->view().Offset(pages[tok / 4], h, tok % 4) + d], k[(tok * K + h) * H + d]);
      EXPECT_EQ(sat, 0);
    }
    f.pool.Release(sub, pages.data(), 3);
    // Too few blocks is refused.
    EXPECT_FALSE(kernels::PagedGatherCpu(sub->view(), pages.data(), 1, T, ks, vs, DType::kFloat32,
                                         ko.data(), vo.data())
                     .ok());
  }
  EXPECT_EQ(f.memory->used(), 0u);
}

TEST(SubPool, FreeListExhaustionRefcountsNoLeaks) {
  // 64 KiB pool, pages of K=1 x 4 tokens x H=16 fp32 = 256 B; chunks of 8 pages
  // = 17*256 B.
  PoolFixture f(64 << 10);
  SubPool *sub = *f.pool.GetClass({1, 16, DType::kFloat32});
  EXPECT_EQ(sub->page_bytes(), 256);
  const int64_t avail = f.pool.AvailablePages(sub);
  EXPECT_EQ(avail, (64 << 10) / (17 * 256) * 8);
  std::vector<int32_t> all(static_cast<size_t>(avail));
  ASSERT_TRUE(f.pool.Allocate(sub, avail, all.data()).ok());
  int32_t one = -1;
  Status s = f.pool.Allocate(sub, 3, &one);
  ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("need 3 pages, 0 free"), std::string::npos) << s.message();
  // The message says why free bytes may not help: pages are carved a chunk at a time.
  EXPECT_NE(s.message().find("8 at a time"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--kv-chunk-pages"), std::string::npos) << s.message();
  // Distinct pages.
  std::vector<int32_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  // LIFO reuse and reference counts.
  f.pool.Retain(sub, &all[5], 1);
  EXPECT_EQ(f.pool.RefCount(sub, all[5]), 2);
  EXPECT_EQ(f.pool.Release(sub, &all[5], 1), 0);
  EXPECT_EQ(f.pool.Release(sub, &all[5], 1), 1);
  EXPECT_EQ(f.pool.RefCount(sub, all[5]), 0);
  ASSERT_TRUE(f.pool.Allocate(sub, 1, &one).ok());
  EXPECT_EQ(one, all[5]);
  all[5] = one;
  EXPECT_EQ(f.pool.Release(sub, all.data(), avail), avail);
  EXPECT_EQ(sub->pages_used(), 0);
  EXPECT_EQ(sub->pages_total(), 0);  // empty chunks go back to the pool
  EXPECT_EQ(f.memory->used(), 0u);
  // A failed all-or-nothing allocation takes nothing.
  std::vector<int32_t> big(static_cast<size_t>(avail + 1));
  EXPECT_FALSE(f.pool.Allocate(sub, avail + 1, big.data()).ok());
  EXPECT_EQ(f.memory->used(), 0u);
}

TEST(BlockTable, BlocksAndTruncate) {
  BlockTable t(4);
  EXPECT_EQ(t.BlocksNeeded(0), 0);
  EXPECT_EQ(t.BlocksNeeded(5), 2);
  const int32_t p[3] = {7, 3, 9};
  t.AddPages(p, 3);
  t.SetLength(10);
  EXPECT_TRUE(t.LastPagePartial());
  EXPECT_EQ(t.LastPageTokens(), 2);
  EXPECT_EQ(t.BlocksNeeded(12), 0);
  EXPECT_EQ(t.BlocksNeeded(13), 1);
  EXPECT_TRUE(t.Truncate(11).empty());
  EXPECT_EQ(t.Truncate(4), std::vector<int32_t>({3, 9}));
  EXPECT_EQ(t.length(), 4);
  EXPECT_FALSE(t.LastPagePartial());
  EXPECT_EQ(t.Truncate(0), std::vector<int32_t>({7}));
}

// A store with a manual clock and helpers to run Extend steps in-process.
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

}  // namespace
}  // namespace attn
