// Integration: SequenceService on the real attention-server binary. Every
// Extend output is compared with the stateless Attend (cpu backend,
// CAUSAL_BOTTOM_RIGHT) on the concatenated history: page boundaries, T larger
// than a page, prefill then many decode steps, forks that diverge, truncation,
// replays, FP8 storage, ExtendBatch and ExtendStream. The server runs with
// --kv-debug-poison so unused and freed page slots hold NaN: a result that read
// one would fail.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attention/v1/sequence.grpc.pb.h"
#include "attn/kernels/host_dtype.h"
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;

constexpr int kLayers = 2, kK = 2, kN = 4, kH = 16, kPage = 4;

kernels::DType Kd(pb::DType d) {
  return d == pb::FLOAT32   ? kernels::DType::kFloat32
         : d == pb::FLOAT16 ? kernels::DType::kFloat16
                            : kernels::DType::kBFloat16;
}

double RelErr(const pb::Tensor &a, const pb::Tensor &ref) {
  const int64_t n = static_cast<int64_t>(ref.data().size()) / kernels::DTypeSize(Kd(ref.dtype()));
  EXPECT_EQ(a.data().size(), ref.data().size());
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = kernels::LoadAsFloat(a.data().data(), Kd(a.dtype()), i);
    const double r = kernels::LoadAsFloat(ref.data().data(), Kd(ref.dtype()), i);
    if (std::isnan(x)) return INFINITY;
    num += (x - r) * (x - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

// History of one (sequence, layer): the k and v bytes sent so far.
struct History {
  std::string k, v;
  int64_t len = 0;
};

class SequenceTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--kv-page-tokens", std::to_string(kPage), "--kv-debug-poison",
                                     "--kv-chunk-pages", "8"};
    args.insert(args.end(), extra.begin(), extra.end());
    server_ = std::make_unique<ServerProcess>(args);
    ASSERT_TRUE(server_->started()) << server_->ReadLog();
    stub_ = server_->Stub();
    seq_ = pb::SequenceService::NewStub(server_->Channel());
  }
  void Ctx(grpc::ClientContext *c, const std::string &identity) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!identity.empty()) c->AddMetadata("x-attn-identity", identity);
  }
  std::string Create(pb::DType dtype = pb::FLOAT32, pb::DType kv = pb::DTYPE_UNSPECIFIED,
                     const std::string &identity = "", int64_t reserve = 0,
                     grpc::Status *status = nullptr) {
    pb::CreateSequenceRequest r;
    r.set_num_layers(kLayers);
    r.set_num_kv_heads(kK);
    r.set_head_dim(kH);
    r.set_num_heads(kN);
    r.set_dtype(dtype);
    r.set_kv_cache_dtype(kv);
    r.set_reserve_tokens(reserve);
    pb::CreateSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c, identity);
    grpc::Status st = seq_->CreateSequence(&c, r, &resp);
    if (status != nullptr)
      *status = st;
    else
      EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.sequence().sequence_id();
  }
  pb::ExtendRequest MakeStep(const std::string &id, int layer, int64_t pos, int64_t T,
                             pb::DType dtype, uint64_t seed) {
    std::mt19937_64 rng(seed);
    pb::ExtendRequest r;
    r.set_sequence_id(id);
    r.set_layer(layer);
    r.set_position(pos);
    FillTensor(r.mutable_q(), dtype, {T, kN, kH}, &rng);
    FillTensor(r.mutable_k(), dtype, {T, kK, kH}, &rng);
    FillTensor(r.mutable_v(), dtype, {T, kK, kH}, &rng);
    return r;
  }
  grpc::Status Extend(const pb::ExtendRequest &r, pb::ExtendResponse *resp,
                      const std::string &identity = "") {
    grpc::ClientContext c;
    Ctx(&c, identity);
    return seq_->Extend(&c, r, resp);
  }
  // Attend (cpu, bottom-right) on history + this step's k/v; returns o.
  pb::Tensor Reference(const History &h, const pb::ExtendRequest &r) {
    pb::AttendRequest a;
    const int64_t T = r.q().shape(0);
    const int64_t S = h.len + T;
    a.set_backend("cpu");
    a.mutable_mask()->set_causal(pb::CAUSAL_BOTTOM_RIGHT);
    *a.mutable_q() = r.q();
    a.mutable_q()->clear_shape();
    for (int64_t d : {int64_t{1}, T, int64_t{kN}, int64_t{kH}}) a.mutable_q()->add_shape(d);
    for (auto [t, src, add] : {std::make_tuple(a.mutable_k(), &h.k, &r.k()),
                               std::make_tuple(a.mutable_v(), &h.v, &r.v())}) {
      t->set_dtype(r.q().dtype());
      for (int64_t d : {int64_t{1}, S, int64_t{kK}, int64_t{kH}}) t->add_shape(d);
      *t->mutable_data() = *src + add->data();
    }
    pb::AttendResponse resp;
    grpc::ClientContext c;
    Ctx(&c, "");
    grpc::Status st = stub_->Attend(&c, a, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.o();
  }
  // Runs a step, checks it against Attend, and appends it to the history.
  void CheckedStep(const std::string &id, int layer, int64_t T, pb::DType dtype, uint64_t seed,
                   History *h, double tol) {
    pb::ExtendRequest r = MakeStep(id, layer, h->len, T, dtype, seed);
    pb::ExtendResponse resp;
    grpc::Status st = Extend(r, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.length(), h->len + T);
    EXPECT_FALSE(resp.replayed());
    // The report names the paged backend that ran ("paged-cpu"/"paged-gpu") and where.
    const std::string &device = resp.report().device();
    EXPECT_TRUE(device == "cpu" || device == "gpu") << device;
    EXPECT_EQ(resp.report().backend(), "paged-" + device);
    const double err = RelErr(resp.o(), Reference(*h, r));
    EXPECT_LE(err, tol) << "layer " << layer << " pos " << h->len << " T " << T;
    h->k += r.k().data();
    h->v += r.v().data();
    h->len += T;
  }
  pb::SequenceInfo Get(const std::string &id, grpc::Status *st = nullptr,
                       const std::string &identity = "") {
    pb::GetSequenceRequest r;
    r.set_sequence_id(id);
    pb::GetSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c, identity);
    grpc::Status s = seq_->GetSequence(&c, r, &resp);
    if (st != nullptr) *st = s;
    return resp.sequence();
  }
  pb::KvCacheInfo Kv() {
    pb::GetServerInfoResponse resp;
    grpc::ClientContext c;
    Ctx(&c, "");
    EXPECT_TRUE(stub_->GetServerInfo(&c, pb::GetServerInfoRequest(), &resp).ok());
    return resp.kv_cache();
  }
  int64_t PagesUsed() {
    int64_t n = 0;
    const pb::KvCacheInfo kv = Kv();
    for (const auto &c : kv.classes()) n += c.pages_used();
    return n;
  }
  grpc::Status Release(const std::string &id, const std::string &identity = "") {
    pb::ReleaseSequenceRequest r;
    r.set_sequence_id(id);
    pb::ReleaseSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c, identity);
    return seq_->ReleaseSequence(&c, r, &resp);
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<pb::AttentionService::Stub> stub_;
  std::unique_ptr<pb::SequenceService::Stub> seq_;
};

TEST_F(SequenceTest, PrefillThenDecodeMatchesAttend) {
  Start();
  for (pb::DType dt : {pb::FLOAT32, pb::BFLOAT16}) {
    const double tol = dt == pb::FLOAT32 ? 1e-5 : 1e-2;
    const std::string id = Create(dt);
    ASSERT_EQ(id.size(), 32u);
    History h[kLayers];
    uint64_t seed = 100;
    for (int l = 0; l < kLayers; ++l) CheckedStep(id, l, 10, dt, ++seed, &h[l], tol);  // T > page
    for (int step = 0; step < 9; ++step) {
      for (int l = 0; l < kLayers; ++l) CheckedStep(id, l, 1, dt, ++seed, &h[l], tol);
    }
    CheckedStep(id, 0, 7, dt, ++seed, &h[0],
                tol);  // a chunk straddling two page boundaries
    const pb::SequenceInfo info = Get(id);
    EXPECT_EQ(info.layer_lengths(0), 26);
    EXPECT_EQ(info.layer_lengths(1), 19);
    // Waste at most one partial page per (sequence, layer).
    EXPECT_EQ(info.pages(), (26 + kPage - 1) / kPage + (19 + kPage - 1) / kPage);
    EXPECT_EQ(PagesUsed(), info.pages());
    ASSERT_TRUE(Release(id).ok());
    EXPECT_EQ(PagesUsed(), 0);
  }
  const pb::KvCacheInfo kv = Kv();
  EXPECT_EQ(kv.page_tokens(), kPage);
  EXPECT_GT(kv.pool_bytes(), 0);
  EXPECT_EQ(kv.sequences(), 0);
  EXPECT_EQ(kv.classes_size(), 2);  // fp32 and bf16 layout classes
}

TEST_F(SequenceTest, ForksDivergeTruncateAndReplay) {
  Start();
  const std::string a = Create();
  History ha;
  CheckedStep(a, 0, 6, pb::FLOAT32, 1, &ha, 1e-5);
  pb::ForkSequenceRequest fr;
  fr.set_sequence_id(a);
  pb::ForkSequenceResponse fresp;
  {
    grpc::ClientContext c;
    Ctx(&c, "");
    ASSERT_TRUE(seq_->ForkSequence(&c, fr, &fresp).ok());
  }
  const std::string b = fresp.sequence().sequence_id();
  EXPECT_EQ(fresp.sequence().layer_lengths(0), 6);
  EXPECT_EQ(PagesUsed(), 2);  // shared
  History hb = ha;
  for (int i = 0; i < 5; ++i) {
    CheckedStep(a, 0, 1, pb::FLOAT32, 10 + i, &ha, 1e-5);
    CheckedStep(b, 0, 1 + i % 2, pb::FLOAT32, 20 + i, &hb, 1e-5);
  }
  // Replay: the same last step again returns the stored result and appends
  // nothing.
  pb::ExtendRequest last = MakeStep(a, 0, ha.len, 1, pb::FLOAT32, 77);
  pb::ExtendResponse r1, r2;
  ASSERT_TRUE(Extend(last, &r1).ok());
  ASSERT_TRUE(Extend(last, &r2).ok());
  EXPECT_TRUE(r2.replayed());
  EXPECT_EQ(r1.o().data(), r2.o().data());
  EXPECT_EQ(r2.length(), ha.len + 1);
  ha.k += last.k().data();
  ha.v += last.v().data();
  ha.len += 1;
  // A stale position: FAILED_PRECONDITION with the actual length.
  pb::ExtendResponse bad;
  grpc::Status st = Extend(MakeStep(a, 0, 3, 1, pb::FLOAT32, 5), &bad);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("length " + std::to_string(ha.len)), std::string::npos)
      << st.error_message();
  // Truncate a back to 5 tokens (into the page still shared with b), then
  // continue.
  pb::TruncateSequenceRequest tr;
  tr.set_sequence_id(a);
  tr.set_length(5);
  pb::TruncateSequenceResponse tresp;
  {
    grpc::ClientContext c;
    Ctx(&c, "");
    ASSERT_TRUE(seq_->TruncateSequence(&c, tr, &tresp).ok());
  }
  EXPECT_EQ(tresp.sequence().layer_lengths(0), 5);
  ha.k.resize(5 * kK * kH * 4);
  ha.v.resize(5 * kK * kH * 4);
  ha.len = 5;
  for (int i = 0; i < 4; ++i) CheckedStep(a, 0, 1, pb::FLOAT32, 40 + i, &ha, 1e-5);
  for (int i = 0; i < 2; ++i) CheckedStep(b, 0, 1, pb::FLOAT32, 50 + i, &hb, 1e-5);
  ASSERT_TRUE(Release(a).ok());
  ASSERT_TRUE(Release(b).ok());
  EXPECT_EQ(PagesUsed(), 0);
}

TEST_F(SequenceTest, BadInputsGetTheirStatusAndChangeNothing) {
  Start();
  const std::string id = Create(pb::FLOAT32, pb::DTYPE_UNSPECIFIED, "alice");
  pb::ExtendRequest ok = MakeStep(id, 0, 0, 3, pb::FLOAT32, 1);
  pb::ExtendResponse resp;
  ASSERT_TRUE(Extend(ok, &resp, "alice").ok());
  auto expect = [&](pb::ExtendRequest r, grpc::StatusCode code, const std::string &who) {
    pb::ExtendResponse x;
    grpc::Status st = Extend(r, &x, who);
    EXPECT_EQ(st.error_code(), code) << st.error_message();
  };
  pb::ExtendRequest r = MakeStep(id, 2, 3, 1, pb::FLOAT32, 2);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "alice");  // layer out of range
  r = MakeStep(id, 0, 3, 1, pb::BFLOAT16, 2);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "alice");  // dtype
  r = MakeStep(id, 0, 3, 2, pb::FLOAT32, 2);
  r.mutable_v()->set_shape(0, 1);
  r.mutable_v()->mutable_data()->resize(kK * kH * 4);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "alice");  // k/v lengths differ
  r = MakeStep(id, 0, 3, 1, pb::FLOAT32, 2);
  r.mutable_q()->set_shape(1, 3);
  r.mutable_q()->mutable_data()->resize(3 * kH * 4);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "alice");  // heads
  r = MakeStep(id, 0, 3, 1, pb::FLOAT32, 2);
  r.mutable_k()->mutable_data()->resize(5);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "alice");  // byte size
  r = MakeStep(id, 0, 3, 1, pb::FLOAT32, 2);
  expect(r, grpc::StatusCode::NOT_FOUND, "bob");  // another identity
  expect(r, grpc::StatusCode::NOT_FOUND,
         "");  // anonymous is another identity too
  r.set_sequence_id("0123456789abcdef0123456789abcdef");
  expect(r, grpc::StatusCode::NOT_FOUND, "alice");  // unknown
  r.set_sequence_id("nope");
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "alice");
  grpc::Status st;
  Get(id, &st, "bob");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Release(id, "bob").error_code(), grpc::StatusCode::NOT_FOUND);
  // Nothing changed: the next step at position 3 works and matches.
  const pb::SequenceInfo info = Get(id, &st, "alice");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(info.layer_lengths(0), 3);
  EXPECT_EQ(info.layer_lengths(1), 0);
  ASSERT_TRUE(Extend(MakeStep(id, 0, 3, 1, pb::FLOAT32, 3), &resp, "alice").ok());
  ASSERT_TRUE(Release(id, "alice").ok());
  EXPECT_EQ(Release(id, "alice").error_code(), grpc::StatusCode::NOT_FOUND);
  // Bad configurations.
  pb::CreateSequenceRequest c;
  c.set_num_layers(1);
  c.set_num_kv_heads(3);
  c.set_head_dim(8);
  c.set_num_heads(4);
  c.set_dtype(pb::FLOAT32);
  pb::CreateSequenceResponse cresp;
  grpc::ClientContext ctx;
  Ctx(&ctx, "");
  EXPECT_EQ(seq_->CreateSequence(&ctx, c, &cresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(SequenceTest, FullCacheIsResourceExhaustedAndHarmless) {
  // 256 KiB pool; fp32 pages of K=2 x 4 x 16 = 512 B; chunks of 8 pages (8.5
  // KiB).
  Start({"--kv-cache-bytes", "262144"});
  const std::string a = Create();
  History h;
  CheckedStep(a, 0, 40, pb::FLOAT32, 1, &h, 1e-5);
  grpc::Status st;
  Create(pb::FLOAT32, pb::DTYPE_UNSPECIFIED, "", 100000, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("need"), std::string::npos) << st.error_message();
  const std::string b = Create();
  pb::ExtendResponse resp;
  st = Extend(MakeStep(b, 0, 0, 4000, pb::FLOAT32, 2), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("need 1000 pages"), std::string::npos) << st.error_message();
  EXPECT_EQ(Get(b).layer_lengths(0), 0);
  CheckedStep(a, 0, 1, pb::FLOAT32, 3, &h,
              1e-5);  // the stored sequence is intact
}

TEST_F(SequenceTest, Fp8KvCacheWithinTolerance) {
  Start();
  const std::string id = Create(pb::FLOAT32, pb::FLOAT8_E4M3);
  History h;
  CheckedStep(id, 0, 12, pb::FLOAT32, 1, &h, 6e-2);
  for (int i = 0; i < 6; ++i) CheckedStep(id, 0, 1, pb::FLOAT32, 10 + i, &h, 6e-2);
  const pb::SequenceInfo info = Get(id);
  EXPECT_EQ(info.kv_cache_dtype(), pb::FLOAT8_E4M3);
  EXPECT_GT(info.k_scales(0), 0.f);
  EXPECT_EQ(info.k_scales(kK), 0.f);  // layer 1 not yet written
}

TEST_F(SequenceTest, ExtendBatchAndStream) {
  Start();
  const std::string a = Create(), b = Create();
  History ha, hb;
  CheckedStep(a, 0, 5, pb::FLOAT32, 1, &ha, 1e-5);
  CheckedStep(b, 0, 9, pb::FLOAT32, 2, &hb, 1e-5);
  pb::ExtendBatchRequest batch;
  *batch.add_steps() = MakeStep(a, 0, ha.len, 1, pb::FLOAT32, 3);
  *batch.add_steps() = MakeStep(b, 0, hb.len, 1, pb::FLOAT32, 4);
  *batch.add_steps() = MakeStep("0123456789abcdef0123456789abcdef", 0, 0, 1, pb::FLOAT32, 5);
  pb::ExtendBatchResponse bresp;
  {
    grpc::ClientContext c;
    Ctx(&c, "");
    ASSERT_TRUE(seq_->ExtendBatch(&c, batch, &bresp).ok());
  }
  ASSERT_EQ(bresp.results_size(), 3);
  EXPECT_EQ(bresp.results(0).code(), 0);
  EXPECT_LE(RelErr(bresp.results(0).response().o(), Reference(ha, batch.steps(0))), 1e-5);
  EXPECT_LE(RelErr(bresp.results(1).response().o(), Reference(hb, batch.steps(1))), 1e-5);
  EXPECT_EQ(bresp.results(2).code(), grpc::StatusCode::NOT_FOUND);
  for (auto [h, i] : {std::make_pair(&ha, 0), std::make_pair(&hb, 1)}) {
    h->k += batch.steps(i).k().data();
    h->v += batch.steps(i).v().data();
    h->len += 1;
  }
  // A stream of decode steps on a, with one bad step in the middle.
  grpc::ClientContext c;
  Ctx(&c, "");
  auto stream = seq_->ExtendStream(&c);
  for (int i = 0; i < 6; ++i) {
    pb::ExtendRequest r = MakeStep(a, 0, i == 3 ? 0 : ha.len, 1, pb::FLOAT32, 60 + i);
    ASSERT_TRUE(stream->Write(r));
    pb::ExtendResult res;
    ASSERT_TRUE(stream->Read(&res));
    if (i == 3) {
      EXPECT_EQ(res.code(), grpc::StatusCode::FAILED_PRECONDITION);
      continue;
    }
    ASSERT_EQ(res.code(), 0) << res.message();
    EXPECT_LE(RelErr(res.response().o(), Reference(ha, r)), 1e-5);
    ha.k += r.k().data();
    ha.v += r.v().data();
    ha.len += 1;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Get(a).layer_lengths(0), ha.len);
}

}  // namespace
}  // namespace attn::testing
