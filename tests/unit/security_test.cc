// Unit tests of server/security/: the token file parser and its constant-time lookup, bearer
// header parsing, per-identity accounting (IdentityQuota) on its own and inside the
// SequenceStore (forks count shared pages once; release, truncation, copy-on-write and
// eviction keep it exact and bring it back to 0), the identities a token reload revokes, and the
// tensor element count.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "attention/v1/sequence.pb.h"
#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_step.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "device/host_pool.h"
#include "security/authenticator.h"
#include "kv_cache/identity_quota.h"
#include "security/tensor_limit.h"
#include "security/token_table.h"

namespace attn::security {
namespace {

using kernels::DType;

constexpr char kTokA[] = "aaaaaaaaaaaaaaaa-token-A";
constexpr char kTokB[] = "bbbbbbbbbbbbbbbb-token-B";

TEST(TokenTable, ParsesIdentitiesTokensCommentsAndBlankLines) {
  const std::string text = std::string("# comment\n\n  alice ") + kTokA + "\n\tbob\t" + kTokB +
                           "\r\nalice second-token-for-alice\n   # indented comment";
  auto t = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 3u);
  EXPECT_EQ(t->Find(kTokA), std::optional<std::string>("alice"));
  EXPECT_EQ(t->Find(kTokB), std::optional<std::string>("bob"));
  EXPECT_EQ(t->Find("second-token-for-alice"), std::optional<std::string>("alice"));
  EXPECT_EQ(t->Identities(), (std::vector<std::string>{"alice", "bob"}));
  EXPECT_FALSE(t->Find("").has_value());
  EXPECT_FALSE(t->Find(std::string(kTokA).substr(0, 20)).has_value());  // a prefix
  EXPECT_FALSE(t->Find(std::string(kTokA) + "x").has_value());          // longer
  EXPECT_FALSE(t->Find("alice").has_value());                            // an identity
}

TEST(TokenTable, RejectsMalformedFilesNamingTheLineNeverTheToken) {
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"alice\n", "f:1: expected \"identity token\", got 1 fields"},
      {"# c\nalice tok-0123456789abcdef extra\n", "f:2: expected \"identity token\", got 3"},
      {"alice secret-short\n", "f:1: token must be 16..4096"},
      {"al ice-has-space tok-0123456789abcdef\n", "f:1: expected"},
      {"al*ce tok-0123456789abcdef\n", "f:1: identity must be"},
      {"a tok-0123456789abcdef\nb tok-0123456789abcdef\n", "f:2: this token already appears"},
      {"# only comments\n\n", "f: holds no token"},
      {"", "f: holds no token"},
  };
  for (const Case& c : cases) {
    auto t = TokenTable::Parse(c.text, "f");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find("secret-short"), std::string::npos);
    EXPECT_EQ(t.status().message().find("tok-0123"), std::string::npos);
  }
  EXPECT_FALSE(TokenTable::Load("/nonexistent/tokens").ok());
}

TEST(Authenticator, BearerHeaderParsing) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer   abc"), "abc");
  EXPECT_EQ(BearerToken("BEARER abc"), "abc");
  EXPECT_EQ(BearerToken("Bearerabc"), "");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
  EXPECT_EQ(BearerToken("abc"), "");
}

// A reload reports the identities left without any token (issue 16 item 10): bob rotated his
// token (not revoked), alice lost hers; a failed reload revokes nothing.
TEST(Authenticator, ReloadListsTheIdentitiesThatLostTheirLastToken) {
  const std::string path = ::testing::TempDir() + "/attn_reload_tokens";
  std::ofstream(path) << "alice " << kTokA << "\nbob " << kTokB << "\n";
  auto auth = Authenticator::Create(path, false);
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  std::ofstream(path) << "bob cccccccccccccccc-token-C\n";
  std::vector<std::string> revoked;
  ASSERT_TRUE((*auth)->Reload(&revoked).ok());
  EXPECT_EQ(revoked, std::vector<std::string>{"alice"});
  std::ofstream(path) << "not a token file\n";
  revoked = {"x"};
  EXPECT_FALSE((*auth)->Reload(&revoked).ok());
  EXPECT_EQ(revoked, std::vector<std::string>{"x"});  // untouched on error
  std::remove(path.c_str());
}

TEST(IdentityQuota, LimitsRefuseWithTheNumbersAndChangeNothing) {
  IdentityQuota q({2, 10});
  ASSERT_TRUE(q.AddSequence("a").ok());
  ASSERT_TRUE(q.AddSequence("a").ok());
  const Status s = q.AddSequence("a");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("has 2 live sequences"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("is 2"), std::string::npos) << s.message();
  EXPECT_EQ(q.Usage("a").sequences, 2);
  ASSERT_TRUE(q.ReservePages("a", 7).ok());
  const Status p = q.ReservePages("a", 4);
  EXPECT_EQ(p.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(p.message().find("holds 7 KV pages"), std::string::npos) << p.message();
  EXPECT_NE(p.message().find("is 10; requested 4"), std::string::npos) << p.message();
  EXPECT_EQ(q.Usage("a").pages, 7);
  // Another identity has its own budget.
  EXPECT_TRUE(q.AddSequence("b").ok());
  EXPECT_TRUE(q.ReservePages("b", 10).ok());
  q.ReturnPages("a", 7);
  q.RemoveSequence("a");
  q.RemoveSequence("a");
  EXPECT_EQ(q.Usage("a").sequences, 0);
  EXPECT_EQ(q.Usage("a").pages, 0);
  EXPECT_EQ(q.identities(), 1u);  // only b remains
  IdentityQuota unlimited;
  EXPECT_TRUE(unlimited.ReservePages("x", int64_t{1} << 40).ok());
}

struct StoreFixture {
  explicit StoreFixture(SequenceStoreOptions o, int64_t bytes = 1 << 20)
      : memory(std::move(*HostPool::Create(bytes))),
        pool(memory.get(), PagePoolOptions{4, 8, true}),
        store(&pool, o, [this] { return now_us; }) {}
  static SequenceConfig Config(int64_t reserve = 0) {
    SequenceConfig c;
    c.num_layers = 1;
    c.num_kv_heads = 1;
    c.head_dim = 8;
    c.num_heads = 2;
    c.dtype = DType::kFloat32;
    c.kv_dtype = DType::kFloat32;
    c.scale = 0.35f;
    c.reserve_tokens = reserve;
    return c;
  }
  std::string Create(const std::string& owner, int64_t reserve = 0) {
    auto s = store.Create(owner, Config(reserve));
    return s.ok() ? s->seq->id : "";
  }
  Status Step(const std::string& owner, const std::string& id, int64_t pos, int64_t T) {
    std::mt19937 rng(static_cast<uint32_t>(pos * 31 + T));
    std::normal_distribution<float> n;
    q.resize(T * 16);
    k.resize(T * 8);
    v.resize(T * 8);
    for (auto* vec : {&q, &k, &v}) {
      for (float& x : *vec) x = n(rng);
    }
    ExtendArgs a;
    a.sequence_id = id;
    a.position = pos;
    a.q_shape = {T, 2, 8};
    a.k_shape = a.v_shape = {T, 1, 8};
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_bytes = q.size() * 4;
    a.k_bytes = a.v_bytes = k.size() * 4;
    std::string o;
    ExtendOutcome out;
    return ExtendStep(&store, &compute, owner, a, &o, &out);
  }
  int64_t Pages(const std::string& owner) const { return store.quota().Usage(owner).pages; }
  int64_t Seqs(const std::string& owner) const { return store.quota().Usage(owner).sequences; }

  int64_t now_us = 0;
  std::unique_ptr<HostPool> memory;
  PagePool pool;
  SequenceStore store;
  CpuPagedAttention compute{1};
  std::vector<float> q, k, v;
};

TEST(SequenceStoreQuota, PagesAreCountedOncePerIdentityThroughForksTruncationAndRelease) {
  StoreFixture f({});
  const std::string r = f.Create("alice", 8);  // 2 reserved pages (4 tokens a page)
  EXPECT_EQ(f.Pages("alice"), 2);
  int64_t freed = 0;
  ASSERT_TRUE(f.store.Release(r, "alice", &freed).ok());
  EXPECT_EQ(f.Pages("alice"), 0);
  const std::string a = f.Create("alice");
  ASSERT_TRUE(f.Step("alice", a, 0, 10).ok());  // pages p0 p1 p2 (p2 holds 2 tokens)
  EXPECT_EQ(f.Pages("alice"), 3);
  auto child = f.store.Fork(a, "alice", std::nullopt);
  ASSERT_TRUE(child.ok());
  const std::string c = child->seq->id;
  child->lock.unlock();
  EXPECT_EQ(f.Pages("alice"), 3);  // shared, not charged twice
  EXPECT_EQ(f.Seqs("alice"), 2);
  ASSERT_TRUE(f.Step("alice", c, 10, 1).ok());  // c copies p2 to p3 (copy-on-write)
  EXPECT_EQ(f.Pages("alice"), 4);
  {
    auto locked = f.store.Acquire(a, "alice");
    ASSERT_TRUE(locked.ok());
    f.store.Truncate(locked->seq.get(), 3);  // a drops p1 (still c's) and p2 (only a's)
  }
  EXPECT_EQ(f.Pages("alice"), 3);  // p0, p1 shared with c, p3
  EXPECT_EQ(f.Pages("bob"), 0);
  ASSERT_TRUE(f.store.Release(c, "alice", &freed).ok());
  ASSERT_TRUE(f.store.Release(a, "alice", &freed).ok());
  EXPECT_EQ(f.Pages("alice"), 0);
  EXPECT_EQ(f.Seqs("alice"), 0);
  EXPECT_EQ(f.store.quota().identities(), 0u);
}

TEST(SequenceStoreQuota, LimitsRefuseWithoutHarmingStoredSequences) {
  SequenceStoreOptions o;
  o.owner_limits = {2, 4};
  StoreFixture f(o);
  const std::string a = f.Create("alice", 12);  // 3 pages
  ASSERT_FALSE(a.empty());
  auto over = f.store.Create("alice", StoreFixture::Config(8));  // 2 more: 5 > 4
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("holds 3 KV pages"), std::string::npos);
  EXPECT_EQ(f.Pages("alice"), 3);
  EXPECT_EQ(f.Seqs("alice"), 1);  // the refused sequence is not counted
  ASSERT_TRUE(f.Step("alice", a, 0, 16).ok());  // 4 pages: the 4th fits exactly
  EXPECT_EQ(f.Step("alice", a, 16, 1).code(), StatusCode::kResourceExhausted);
  auto locked = f.store.Acquire(a, "alice");
  ASSERT_TRUE(locked.ok());
  EXPECT_EQ(locked->seq->layers[0].table.length(), 16);  // the failed step appended nothing
  locked->lock.unlock();
  ASSERT_FALSE(f.Create("alice").empty());  // 2nd sequence
  auto third = f.store.Create("alice", StoreFixture::Config());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  auto fork = f.store.Fork(a, "alice", std::nullopt);
  EXPECT_EQ(fork.status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(f.Create("bob", 16).empty());  // bob has his own budget
  EXPECT_EQ(f.Pages("bob"), 4);
}

TEST(SequenceStoreQuota, EvictionAndExpiryCreditTheVictimsIdentity) {
  SequenceStoreOptions o;
  o.evict_idle = true;
  o.ttl_s = 10;
  StoreFixture f(o, 16 << 10);
  SubPool* sub = *f.pool.GetClass({1, 8, DType::kFloat32});
  const int64_t total = f.pool.AvailablePages(sub);  // every page the cache can hold
  // Alice holds more than her fair share (half the cache with two identities), so another
  // identity's allocation may evict her idle sequence (issue 16 item 9).
  const int64_t alice_pages = total / 2 + 1;
  const std::string a = f.Create("alice", alice_pages * 4);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(f.Pages("alice"), alice_pages);
  // Bob asks for every page the cache can hold: only evicting alice makes room.
  f.now_us += 1000;
  const std::string b = f.Create("bob", total * 4);
  ASSERT_FALSE(b.empty()) << total;
  EXPECT_EQ(f.store.evictions(), 1);
  EXPECT_EQ(f.Pages("alice"), 0);
  EXPECT_EQ(f.Seqs("alice"), 0);
  EXPECT_EQ(f.Pages("bob"), total);
  f.now_us += 20'000'000;  // past the TTL
  f.store.SweepExpired();
  EXPECT_EQ(f.Pages("bob"), 0);
  EXPECT_EQ(f.Seqs("bob"), 0);
}

TEST(TensorLimit, CountsEveryTensorOfARequest) {
  attention::v1::AttendRequest r;
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v()}) {
    for (int64_t d : {2, 3, 4}) t->add_shape(d);
  }
  EXPECT_EQ(CountTensorElements(r), 72);
  EXPECT_TRUE(CheckTensorElements(r, 72).ok());
  EXPECT_TRUE(CheckTensorElements(r, 0).ok());  // unlimited
  const Status s = CheckTensorElements(r, 71);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("72"), std::string::npos);
  EXPECT_NE(s.message().find("71"), std::string::npos);
  attention::v1::ExtendBatchRequest b;
  for (int i = 0; i < 3; ++i) {
    auto* step = b.add_steps();
    step->mutable_q()->add_shape(5);
    step->mutable_k()->add_shape(2);
  }
  EXPECT_EQ(CountTensorElements(b), 21);
  r.mutable_q()->set_shape(0, -1);  // invalid: counted as 0, validation rejects it later
  EXPECT_EQ(CountTensorElements(r), 48);
  r.mutable_k()->clear_shape();
  for (int i = 0; i < 4; ++i) r.mutable_k()->add_shape(int64_t{1} << 40);  // overflows
  EXPECT_EQ(CountTensorElements(r), INT64_MAX);
  EXPECT_EQ(CountTensorElements(attention::v1::GetServerInfoRequest()), 0);
}

}  // namespace
}  // namespace attn::security
