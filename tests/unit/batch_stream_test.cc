// ExtendBatchStream (server/service/batch_stream.cc) in process, over loopback gRPC, on the cpu
// paged backend behind a gate: a launch holding a step of a gated query length waits until the
// test opens that gate, so which request completes first is decided by the test, not by timing.
// Shown: a later request on other sequences is answered before an earlier one still computing
// (out of order, tags echoed); with --max-batches-in-flight 2 the third request is not read
// while two are unanswered (its immediate request-level error comes only after one of them); a
// request-level error is answered in-stream and the stream goes on; the stream ends OK once
// every request read is answered; shutdown (EndStreams) ends a busy stream with UNAVAILABLE
// after its answers, a revoked identity an idle one with UNAUTHENTICATED; many requests written
// back to back, each answered while the next is read, all parse and come back OK (a read started
// by a write's completion while the previous message was still being parsed overwrote it).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/paged/cpu_paged_attention.h"
#include "common/worker_pool.h"
#include "kv_cache/host_pool.h"
#include "kv_cache/page_pool.h"
#include "service/sequence_service.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using kernels::DType;
constexpr int32_t kN = 4, kK = 2, kH = 8;

/// The cpu paged backend; a launch with a step of a gated query length waits for its gate.
class GatedPaged final : public PagedAttentionBackend {
 public:
  const std::string &name() const override { return cpu_.name(); }
  const std::string &device() const override { return cpu_.device(); }
  Status Append(const PagedLayerView &layer, int64_t start, int64_t tokens, const void *k,
                const void *v, DType src_dtype, int64_t *saturations) override {
    return cpu_.Append(layer, start, tokens, k, v, src_dtype, saturations);
  }
  Status CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                  int64_t tokens) override {
    return cpu_.CopyPage(pool, src, dst, tokens);
  }
  Status Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) override {
    return cpu_.Attend(layer, q, o);
  }
  Status AppendAttendBatch(PagedAppendItem *appends, const PagedAttendItem *attends, size_t n,
                           LaunchTimes *times) override {
    std::unique_lock<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      auto g = gates_.find(attends[i].query.tokens);
      if (g == gates_.end()) continue;
      ++g->second.entered;
      cv_.notify_all();
      cv_.wait(lock, [&] { return g->second.open; });
    }
    lock.unlock();
    return cpu_.AppendAttendBatch(appends, attends, n, times);
  }
  void Close(int64_t tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    gates_[tokens] = Gate{};
  }
  void Open(int64_t tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    gates_[tokens].open = true;
    cv_.notify_all();
  }
  /// Waits until a launch is held at the gate of `tokens`.
  void WaitEntered(int64_t tokens) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return gates_[tokens].entered > 0; });
  }

 private:
  struct Gate {
    bool open = false;
    int entered = 0;
  };
  CpuPagedAttention cpu_{1};
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Gate> gates_;
};

class BatchStreamTest : public ::testing::Test {
 protected:
  BatchStreamTest()
      : memory_(std::move(*HostPool::Create(4 << 20))), pool_(memory_.get(), {4, 8, true}) {
    store_ = std::make_unique<SequenceStore>(&pool_, SequenceStoreOptions{});
    BatchSchedulerOptions o;
    o.policy = {1 << 20, 64, 0};
    o.threads = 3;  // two held at gates, one free
    o.name = "sequence step";
    service_ = std::make_unique<SequenceServiceImpl>(store_.get(), &compute_, &workers_, o);
    service_->SetMaxBatchesInFlight(2);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    stub_ = pb::SequenceService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }
  ~BatchStreamTest() override {
    server_->Shutdown();
    service_->step_batcher()->Stop();
  }
  std::string Create() {
    SequenceConfig c;
    c.num_layers = 1;
    c.num_kv_heads = kK;
    c.head_dim = kH;
    c.num_heads = kN;
    c.dtype = c.kv_dtype = DType::kFloat32;
    c.scale = 0.25f;
    auto s = store_->Create("", c);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->seq->id : std::string();
  }
  /// A packed batch of one step of T tokens on `id` at `position`, random float32 q/k/v.
  static pb::ExtendBatchRequest One(const std::string &id, int64_t position, int64_t T,
                                    uint64_t tag) {
    pb::ExtendBatchRequest r;
    r.set_tag(tag);
    pb::PackedExtendBatch *p = r.mutable_packed();
    pb::PackedStep *s = p->add_steps();
    s->set_sequence_id(id);
    s->set_position(position);
    s->set_query_tokens(T);
    std::mt19937 rng(static_cast<uint32_t>(tag));
    std::normal_distribution<float> n;
    for (auto [t, heads] : {std::make_pair(p->mutable_q(), kN), std::make_pair(p->mutable_k(), kK),
                            std::make_pair(p->mutable_v(), kK)}) {
      t->set_dtype(pb::FLOAT32);
      for (int64_t d : {T, int64_t{heads}, int64_t{kH}}) t->add_shape(d);
      std::string *data = t->mutable_data();
      data->resize(static_cast<size_t>(T * heads * kH) * sizeof(float));
      for (size_t i = 0; i < data->size() / sizeof(float); ++i) {
        const float f = n(rng);
        std::memcpy(data->data() + i * sizeof(float), &f, sizeof(float));
      }
    }
    return r;
  }

  std::unique_ptr<HostPool> memory_;
  PagePool pool_;
  std::unique_ptr<SequenceStore> store_;
  GatedPaged compute_;
  WorkerPool workers_{1, 16};
  std::unique_ptr<SequenceServiceImpl> service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::SequenceService::Stub> stub_;
};

TEST_F(BatchStreamTest, OutOfOrderTaggedAndAtMostTwoInFlight) {
  const std::string a = Create(), b = Create(), c = Create();
  compute_.Close(3);
  compute_.Close(5);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub_->ExtendBatchStream(&ctx);
  pb::ExtendBatchResponse r;
  // 1: held at gate 3. 2 (other sequence) completes first: out of order.
  ASSERT_TRUE(stream->Write(One(a, 0, 3, 1)));
  compute_.WaitEntered(3);
  ASSERT_TRUE(stream->Write(One(b, 0, 1, 2)));
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 2u);
  ASSERT_EQ(r.steps_size(), 1);
  EXPECT_EQ(r.steps(0).code(), 0) << r.steps(0).message();
  EXPECT_EQ(r.steps(0).length(), 1);
  // 3: held at gate 5; now 1 and 3 are in flight (the bound). 4 is a request-level error and
  // would be answered at once if read; 5 is a step on b.
  ASSERT_TRUE(stream->Write(One(c, 0, 5, 3)));
  compute_.WaitEntered(5);
  pb::ExtendBatchRequest bad = One(b, 1, 1, 4);
  bad.mutable_packed()->mutable_steps(0)->set_query_tokens(2);  // rows do not add up
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Write(One(b, 1, 1, 5)));
  // Opening gate 3 answers 1; only then is 4 read (answered in-stream), then 5; 3 is last.
  compute_.Open(3);
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 1u);
  EXPECT_EQ(r.code(), 0);
  EXPECT_EQ(r.steps(0).length(), 3);
  EXPECT_EQ(r.o().data().size(), size_t{3} * kN * kH * sizeof(float));
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 4u);
  EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(r.message().find("query_tokens"), std::string::npos) << r.message();
  EXPECT_EQ(r.steps_size(), 0);
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 5u);
  ASSERT_EQ(r.steps_size(), 1);
  EXPECT_EQ(r.steps(0).code(), 0) << r.steps(0).message();
  EXPECT_EQ(r.steps(0).length(), 2);
  compute_.Open(5);
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 3u);
  EXPECT_EQ(r.steps(0).length(), 5);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&r));
  grpc::Status st = stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST_F(BatchStreamTest, HalfCloseWaitsForEveryAnswer) {
  // Requests still computing when the client closes its side are all answered before the
  // stream ends OK.
  const std::string a = Create(), b = Create();
  compute_.Close(3);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub_->ExtendBatchStream(&ctx);
  ASSERT_TRUE(stream->Write(One(a, 0, 3, 10)));
  compute_.WaitEntered(3);
  ASSERT_TRUE(stream->Write(One(b, 0, 1, 11)));
  ASSERT_TRUE(stream->WritesDone());
  pb::ExtendBatchResponse r;
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 11u);
  compute_.Open(3);
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 10u);
  EXPECT_EQ(r.steps(0).code(), 0) << r.steps(0).message();
  EXPECT_FALSE(stream->Read(&r));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(BatchStreamTest, ShutdownEndsAStreamOnceItsRequestsAreAnswered) {
  const std::string a = Create();
  compute_.Close(3);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub_->ExtendBatchStream(&ctx);
  ASSERT_TRUE(stream->Write(One(a, 0, 3, 7)));
  compute_.WaitEntered(3);
  service_->EndStreams();  // busy: ends after request 7 is answered
  compute_.Open(3);
  pb::ExtendBatchResponse r;
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 7u);
  EXPECT_EQ(r.steps(0).code(), 0) << r.steps(0).message();
  EXPECT_FALSE(stream->Read(&r));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(BatchStreamTest, RevokedIdentityEndsAnIdleStream) {
  const std::string a = Create();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub_->ExtendBatchStream(&ctx);
  ASSERT_TRUE(stream->Write(One(a, 0, 1, 8)));
  pb::ExtendBatchResponse r;
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.tag(), 8u);
  EXPECT_EQ(service_->RevokeIdentities({""}), 1);  // the anonymous identity's one sequence
  EXPECT_FALSE(stream->Read(&r));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(BatchStreamTest, BackToBackRequestsAllParseWhileAnswersAreWritten) {
  // Each message has its own sequence (no order between them); answers are written while the
  // next message is read and parsed. Every one must parse and run: none may be read into the
  // buffer of a message still being parsed (a read started from OnWriteDone did, under load:
  // INVALID_ARGUMENT "not a valid ExtendBatchRequest", then heap corruption).
  constexpr int kMessages = 1000;
  constexpr int64_t kT = 16;  // tokens per message: enough bytes that parsing takes a while
  std::vector<std::string> ids;
  for (int i = 0; i < kMessages; ++i) ids.push_back(Create());
  std::vector<pb::ExtendBatchRequest> requests;
  for (int i = 0; i < kMessages; ++i) requests.push_back(One(ids[i], 0, kT, 1000 + i));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto stream = stub_->ExtendBatchStream(&ctx);
  std::thread writer([&] {
    for (const auto &r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
  });
  std::vector<int> seen(kMessages, 0);
  int answers = 0, bad = 0;
  pb::ExtendBatchResponse r;
  while (stream->Read(&r)) {
    ++answers;
    const int64_t i = static_cast<int64_t>(r.tag()) - 1000;
    if (r.code() != 0 || i < 0 || i >= kMessages || r.steps_size() != 1 ||
        r.steps(0).code() != 0 || r.steps(0).length() != kT) {
      if (++bad <= 3) ADD_FAILURE() << "tag " << r.tag() << ": " << r.code() << " " << r.message();
      continue;
    }
    ++seen[static_cast<size_t>(i)];
  }
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answers, kMessages);
  EXPECT_EQ(bad, 0);
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "tag " << 1000 + i;
  }
}

}  // namespace
}  // namespace attn
