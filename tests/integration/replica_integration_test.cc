// Integration: scale-out on the real attention-server binary (DESIGN.md §12). Two servers on
// loopback stand for two replicas: sequence ids name the replica that holds them (tag prefix,
// SequenceInfo.replica_address, GetServerInfo.replica) and a misrouted call gets NOT_FOUND
// naming both tags; GetLoad reports sequences, KV pages and draining; on SIGTERM with
// --drain-wait-sequences a replica refuses new sequences and stateless calls (UNAVAILABLE),
// turns readiness NOT_SERVING while liveness stays SERVING, keeps serving the sequences it holds
// and exits 0 once they are released, expired, or the drain timeout passes.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attention/v1/sequence.grpc.pb.h"
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;
using std::chrono::steady_clock;

constexpr int kK = 2, kN = 4, kH = 8;

class Replica {
 public:
  explicit Replica(std::vector<std::string> args) : server_(args) {
    if (!server_.started()) return;
    attn_ = pb::AttentionService::NewStub(server_.Channel());
    seq_ = pb::SequenceService::NewStub(server_.Channel());
  }
  ServerProcess &server() { return server_; }
  /// Drops this client's channel (an idle open connection holds gRPC's server Shutdown until
  /// its grace deadline, which would only slow the test down).
  void Disconnect() {
    attn_.reset();
    seq_.reset();
  }

  static void Ctx(grpc::ClientContext *c) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  grpc::Status Create(pb::SequenceInfo *info) {
    pb::CreateSequenceRequest r;
    r.set_num_layers(1);
    r.set_num_kv_heads(kK);
    r.set_num_heads(kN);
    r.set_head_dim(kH);
    r.set_dtype(pb::FLOAT32);
    r.set_reserve_tokens(8);
    pb::CreateSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    grpc::Status st = seq_->CreateSequence(&c, r, &resp);
    *info = resp.sequence();
    return st;
  }
  grpc::Status Extend(const std::string &id, int64_t position, pb::ExtendResponse *resp) {
    std::mt19937_64 rng(position + 1);
    pb::ExtendRequest r;
    r.set_sequence_id(id);
    r.set_layer(0);
    r.set_position(position);
    FillTensor(r.mutable_q(), pb::FLOAT32, {1, kN, kH}, &rng);
    FillTensor(r.mutable_k(), pb::FLOAT32, {1, kK, kH}, &rng);
    FillTensor(r.mutable_v(), pb::FLOAT32, {1, kK, kH}, &rng);
    grpc::ClientContext c;
    Ctx(&c);
    return seq_->Extend(&c, r, resp);
  }
  grpc::Status Fork(const std::string &id) {
    pb::ForkSequenceRequest r;
    r.set_sequence_id(id);
    pb::ForkSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    return seq_->ForkSequence(&c, r, &resp);
  }
  grpc::Status Release(const std::string &id) {
    pb::ReleaseSequenceRequest r;
    r.set_sequence_id(id);
    pb::ReleaseSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    return seq_->ReleaseSequence(&c, r, &resp);
  }
  pb::GetServerInfoResponse Info() {
    pb::GetServerInfoResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    EXPECT_TRUE(attn_->GetServerInfo(&c, pb::GetServerInfoRequest(), &resp).ok());
    return resp;
  }
  pb::GetLoadResponse Load() {
    pb::GetLoadResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    grpc::Status st = attn_->GetLoad(&c, pb::GetLoadRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }
  grpc::Status Attend() {
    pb::AttendResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    return attn_->Attend(&c, PaddedRequest(1, 2, 2, 1, 1, 4, pb::FLOAT32), &resp);
  }

 private:
  ServerProcess server_;
  std::unique_ptr<pb::AttentionService::Stub> attn_;
  std::unique_ptr<pb::SequenceService::Stub> seq_;
};

TEST(Replicas, SequenceIdsNameTheirReplicaAndMisroutedCallsAreNotFound) {
  Replica a({"--advertise-address", "replica-a.test:50051"});
  Replica b({"--advertise-address", "replica-b.test:50051"});
  ASSERT_TRUE(a.server().started()) << a.server().ReadLog();
  ASSERT_TRUE(b.server().started()) << b.server().ReadLog();
  const pb::GetServerInfoResponse ia = a.Info(), ib = b.Info();
  EXPECT_EQ(ia.replica().address(), "replica-a.test:50051");
  EXPECT_EQ(ib.replica().address(), "replica-b.test:50051");
  ASSERT_EQ(ia.replica().replica_tag().size(), 8u);
  EXPECT_NE(ia.replica().replica_tag(), ib.replica().replica_tag());
  EXPECT_EQ(ia.cuda_driver_version(), "none");  // CPU test machine: no NVIDIA driver

  pb::SequenceInfo s;
  ASSERT_TRUE(a.Create(&s).ok());
  EXPECT_EQ(s.sequence_id().size(), 32u);
  EXPECT_EQ(s.sequence_id().substr(0, 8), ia.replica().replica_tag());
  EXPECT_EQ(s.replica_address(), "replica-a.test:50051");

  pb::ExtendResponse resp;
  grpc::Status wrong = b.Extend(s.sequence_id(), 0, &resp);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(wrong.error_message().find(ia.replica().replica_tag()), std::string::npos)
      << wrong.error_message();
  EXPECT_NE(wrong.error_message().find(ib.replica().replica_tag()), std::string::npos)
      << wrong.error_message();
  grpc::Status right = a.Extend(s.sequence_id(), 0, &resp);
  ASSERT_TRUE(right.ok()) << right.error_message();
  EXPECT_EQ(resp.length(), 1);
  // The misrouted call changed nothing on either replica.
  EXPECT_EQ(b.Load().sequences(), 0);
  EXPECT_EQ(a.Load().sequences(), 1);
  EXPECT_TRUE(a.Release(s.sequence_id()).ok());
}

TEST(Replicas, GetLoadReportsSequencesPagesAndQueue) {
  Replica r({"--kv-page-tokens", "4", "--max-queue-requests", "33", "--threads", "2"});
  ASSERT_TRUE(r.server().started()) << r.server().ReadLog();
  pb::GetLoadResponse idle = r.Load();
  EXPECT_FALSE(idle.draining());
  EXPECT_EQ(idle.sequences(), 0);
  EXPECT_EQ(idle.requests_queued(), 0);
  EXPECT_EQ(idle.max_queue_requests(), 33);
  EXPECT_EQ(idle.worker_threads(), 2);
  EXPECT_GT(idle.kv_pool_bytes(), 0);
  EXPECT_EQ(idle.replica().address(), "");
  EXPECT_EQ(idle.replica().replica_tag(), r.Info().replica().replica_tag());

  pb::SequenceInfo s1, s2;
  ASSERT_TRUE(r.Create(&s1).ok());  // reserve 8 tokens = 2 pages of 4
  ASSERT_TRUE(r.Create(&s2).ok());
  pb::GetLoadResponse busy = r.Load();
  EXPECT_EQ(busy.sequences(), 2);
  ASSERT_EQ(busy.kv_classes_size(), 1);
  EXPECT_EQ(busy.kv_classes(0).num_kv_heads(), kK);
  EXPECT_EQ(busy.kv_classes(0).head_dim(), kH);
  EXPECT_EQ(busy.kv_classes(0).pages_used(), 4);
  EXPECT_GE(busy.kv_classes(0).pages_total(), 4);
  EXPECT_TRUE(r.Release(s1.sequence_id()).ok());
  EXPECT_TRUE(r.Release(s2.sequence_id()).ok());
  EXPECT_EQ(r.Load().kv_classes(0).pages_used(), 0);
}

TEST(Replicas, DrainRefusesNewWorkServesLiveSequencesAndExitsWhenTheyAreReleased) {
  Replica r({"--drain-wait-sequences", "--drain-timeout-s", "30"});
  ASSERT_TRUE(r.server().started()) << r.server().ReadLog();
  auto channel = r.server().Channel();
  EXPECT_EQ(HealthCheck(channel, ""), "SERVING");
  EXPECT_EQ(HealthCheck(channel, "liveness"), "SERVING");
  pb::SequenceInfo s;
  ASSERT_TRUE(r.Create(&s).ok());
  pb::ExtendResponse resp;
  ASSERT_TRUE(r.Extend(s.sequence_id(), 0, &resp).ok());

  r.server().Signal(SIGTERM);
  // Drain starts: readiness NOT_SERVING, liveness still SERVING, GetLoad says draining.
  const auto deadline = steady_clock::now() + std::chrono::seconds(10);
  while (HealthCheck(channel, "") == "SERVING" && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(HealthCheck(channel, ""), "NOT_SERVING");
  EXPECT_EQ(HealthCheck(channel, "liveness"), "SERVING");
  EXPECT_TRUE(r.Load().draining());
  // New sequences and stateless calls are refused.
  pb::SequenceInfo refused;
  grpc::Status create = r.Create(&refused);
  EXPECT_EQ(create.error_code(), grpc::StatusCode::UNAVAILABLE) << create.error_message();
  EXPECT_NE(create.error_message().find("draining"), std::string::npos);
  EXPECT_EQ(r.Fork(s.sequence_id()).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.Attend().error_code(), grpc::StatusCode::UNAVAILABLE);
  // The live sequence keeps being served, and the server keeps running for it.
  for (int64_t pos = 1; pos < 4; ++pos) {
    grpc::Status st = r.Extend(s.sequence_id(), pos, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.length(), pos + 1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(r.server().WaitExit(0), -1) << "exited with a live sequence";
  // Releasing the last sequence ends the drain.
  const auto released = steady_clock::now();
  ASSERT_TRUE(r.Release(s.sequence_id()).ok());
  EXPECT_EQ(r.server().WaitExit(10), 0) << r.server().ReadLog();
  EXPECT_LT(steady_clock::now() - released, std::chrono::seconds(5));
  EXPECT_NE(r.server().ReadLog().find("stopped cleanly"), std::string::npos);
}

TEST(Replicas, DrainEndsAtTheTimeoutOrWhenSequencesExpire) {
  {
    Replica r({"--drain-wait-sequences", "--drain-timeout-s", "1"});
    ASSERT_TRUE(r.server().started()) << r.server().ReadLog();
    pb::SequenceInfo s;
    ASSERT_TRUE(r.Create(&s).ok());
    r.Disconnect();
    const auto t0 = steady_clock::now();
    r.server().Signal(SIGTERM);
    EXPECT_EQ(r.server().WaitExit(15), 0) << r.server().ReadLog();
    EXPECT_GE(steady_clock::now() - t0, std::chrono::milliseconds(900));
    EXPECT_NE(r.server().ReadLog().find("dropping 1 live sequences"), std::string::npos)
        << r.server().ReadLog();
  }
  {
    // An idle sequence expires (--sequence-ttl-s) during the drain: the wait ends then.
    Replica r({"--drain-wait-sequences", "--drain-timeout-s", "30", "--sequence-ttl-s", "1"});
    ASSERT_TRUE(r.server().started()) << r.server().ReadLog();
    pb::SequenceInfo s;
    ASSERT_TRUE(r.Create(&s).ok());
    r.Disconnect();
    const auto t0 = steady_clock::now();
    r.server().Signal(SIGTERM);
    EXPECT_EQ(r.server().WaitExit(15), 0) << r.server().ReadLog();
    EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(10));
    EXPECT_EQ(r.server().ReadLog().find("dropping"), std::string::npos) << r.server().ReadLog();
  }
  {
    // Without --drain-wait-sequences the drain only waits for calls in flight.
    Replica r({"--drain-timeout-s", "30"});
    ASSERT_TRUE(r.server().started()) << r.server().ReadLog();
    pb::SequenceInfo s;
    ASSERT_TRUE(r.Create(&s).ok());
    r.Disconnect();
    const auto t0 = steady_clock::now();
    r.server().Signal(SIGTERM);
    EXPECT_EQ(r.server().WaitExit(15), 0) << r.server().ReadLog();
    EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(8));
  }
}

TEST(Replicas, FlagsComeFromAttnEnvironmentVariables) {
  setenv("ATTN_ADVERTISE_ADDRESS", "from-env.test:50051", 1);
  Replica r({});
  unsetenv("ATTN_ADVERTISE_ADDRESS");
  ASSERT_TRUE(r.server().started()) << r.server().ReadLog();
  EXPECT_EQ(r.Info().replica().address(), "from-env.test:50051");
}

}  // namespace
}  // namespace attn::testing
