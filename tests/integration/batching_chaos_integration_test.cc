// Integration: dynamic batching chaos (DESIGN.md §8) on the real attention-server binary: a
// full queue (RESOURCE_EXHAUSTED with the numbers), calls cancelled while queued, 1 µs
// deadlines, a stream whose client vanishes while its step is queued; every RPC ends with
// exactly one status; afterwards the queue is empty (GetLoad), KV pages are back to their count
// and good requests still succeed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attention/v1/sequence.grpc.pb.h"
#include "batching_testlib.h"
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;

class BatchingChaos : public ::testing::Test {
 protected:
  void SetUp() override {
    // Small work (< 8 tokens) waits up to 60 s for a batch; work of >= 8 tokens fills the
    // token budget and runs at once. At most 6 calls may wait.
    server_ = std::make_unique<ServerProcess>(std::vector<std::string>{
        "--default-backend", "cpu", "--max-queue-delay-us", "60000000", "--max-batch-tokens", "8",
        "--batch-threads", "1", "--max-queue-requests", "6", "--kv-page-tokens", "4",
        "--metrics-address", ""});
    ASSERT_TRUE(server_->started()) << server_->ReadLog();
    stub_ = server_->Stub();
    seq_ = pb::SequenceService::NewStub(server_->Channel());
  }
  int64_t PagesUsed() {
    pb::GetServerInfoResponse info;
    grpc::ClientContext c;
    Deadline(&c);
    EXPECT_TRUE(stub_->GetServerInfo(&c, pb::GetServerInfoRequest(), &info).ok());
    int64_t n = 0;
    for (const auto& k : info.kv_cache().classes()) n += k.pages_used();
    return n;
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<pb::AttentionService::Stub> stub_;
  std::unique_ptr<pb::SequenceService::Stub> seq_;
};

TEST_F(BatchingChaos, FullQueueCancelledCallsAndTinyDeadlinesLeaveNothingBehind) {
  // Six small calls wait (delay 60 s).
  constexpr int kWaiting = 6;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<grpc::Status> status(kWaiting);
  std::vector<int> statuses_seen(kWaiting, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiting; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    Deadline(contexts.back().get(), 120);
  }
  for (int i = 0; i < kWaiting; ++i) {
    threads.emplace_back([&, i] {
      pb::AttendResponse resp;
      status[i] = stub_->Attend(contexts[i].get(),
                                PaddedRequest(1, 1, 4, kN, kK, kH, pb::FLOAT32, i), &resp);
      ++statuses_seen[i];
    });
  }
  ASSERT_TRUE(WaitQueued(server_.get(), kWaiting));
  // The seventh is refused at once with the numbers.
  {
    pb::AttendResponse resp;
    grpc::ClientContext c;
    Deadline(&c);
    grpc::Status st = stub_->Attend(&c, PaddedRequest(1, 1, 4, kN, kK, kH, pb::FLOAT32, 7), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_NE(st.error_message().find("limit 6"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find("6 waiting"), std::string::npos) << st.error_message();
  }
  // Every waiting client cancels.
  const auto cancelled_at = Clock::now();
  for (auto& c : contexts) c->TryCancel();
  for (auto& t : threads) t.join();
  for (int i = 0; i < kWaiting; ++i) {
    EXPECT_EQ(statuses_seen[i], 1);
    EXPECT_EQ(status[i].error_code(), grpc::StatusCode::CANCELLED) << status[i].error_message();
  }
  // Cancelled calls leave the queue at once, not when their 60 s delay ends.
  ASSERT_TRUE(WaitQueued(server_.get(), 0));
  EXPECT_LT(Clock::now() - cancelled_at, std::chrono::seconds(30));

  // 1 µs deadlines: each call ends once, with DEADLINE_EXCEEDED.
  for (int i = 0; i < 10; ++i) {
    pb::AttendResponse resp;
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(1));
    grpc::Status st = stub_->Attend(&c, PaddedRequest(1, 1, 4, kN, kK, kH, pb::FLOAT32, i), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  }
  ASSERT_TRUE(WaitQueued(server_.get(), 0));

  // A good request (8 query tokens: a full batch by itself) still succeeds at once.
  pb::AttendResponse resp;
  grpc::ClientContext c;
  Deadline(&c, 30);
  grpc::Status st = stub_->Attend(&c, PaddedRequest(1, 8, 8, kN, kK, kH, pb::FLOAT32, 99), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.report().batch_size(), 1);
  EXPECT_EQ(resp.report().batch_tokens(), 8);
}

TEST_F(BatchingChaos, SequenceStepsCancelledOrExpiredWhileQueuedReleaseEverything) {
  const int64_t pages_start = PagesUsed();
  std::vector<std::string> ids;
  for (int s = 0; s < 4; ++s) {
    pb::CreateSequenceRequest r;
    r.set_num_layers(1);
    r.set_num_kv_heads(kK);
    r.set_head_dim(kH);
    r.set_num_heads(kN);
    r.set_dtype(pb::FLOAT32);
    pb::CreateSequenceResponse resp;
    grpc::ClientContext c;
    Deadline(&c);
    ASSERT_TRUE(seq_->CreateSequence(&c, r, &resp).ok());
    ids.push_back(resp.sequence().sequence_id());
    // Prefill of 8 tokens (two full pages): a full batch, runs at once.
    pb::ExtendResponse er;
    grpc::ClientContext c2;
    Deadline(&c2);
    grpc::Status st = seq_->Extend(&c2, BatchingStep(ids[s], 0, 0, 8, s), &er);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  const int64_t pages_prefilled = PagesUsed();
  EXPECT_GT(pages_prefilled, pages_start);

  // A unary Extend decode (1 token) waits; its client cancels.
  grpc::ClientContext unary_ctx;
  Deadline(&unary_ctx, 120);
  grpc::Status unary_status;
  int unary_statuses = 0;
  std::thread unary([&] {
    pb::ExtendResponse er;
    unary_status = seq_->Extend(&unary_ctx, BatchingStep(ids[0], 0, 8, 1, 50), &er);
    ++unary_statuses;
  });
  // A stream writes a decode step and vanishes while it waits.
  grpc::ClientContext stream_ctx;
  Deadline(&stream_ctx, 120);
  auto stream = seq_->ExtendStream(&stream_ctx);
  ASSERT_TRUE(stream->Write(BatchingStep(ids[1], 0, 8, 1, 51)));
  // An ExtendBatch of decode steps on two other sequences waits too; its client cancels.
  grpc::ClientContext batch_ctx;
  Deadline(&batch_ctx, 120);
  grpc::Status batch_status;
  int batch_statuses = 0;
  std::thread batch([&] {
    pb::ExtendBatchRequest req;
    *req.add_steps() = BatchingStep(ids[2], 0, 8, 1, 52);
    *req.add_steps() = BatchingStep(ids[3], 0, 8, 1, 53);
    pb::ExtendBatchResponse resp;
    batch_status = seq_->ExtendBatch(&batch_ctx, req, &resp);
    ++batch_statuses;
  });
  ASSERT_TRUE(WaitQueued(server_.get(), 4));
  unary_ctx.TryCancel();
  batch_ctx.TryCancel();
  stream_ctx.TryCancel();
  unary.join();
  batch.join();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(unary_statuses, 1);
  EXPECT_EQ(batch_statuses, 1);
  EXPECT_EQ(unary_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(batch_status.error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(WaitQueued(server_.get(), 0));

  // 1 µs deadlines on decode steps.
  for (int i = 0; i < 5; ++i) {
    pb::ExtendResponse er;
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(1));
    grpc::Status st = seq_->Extend(&c, BatchingStep(ids[i % 4], 0, 8, 1, 60 + i), &er);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  }
  ASSERT_TRUE(WaitQueued(server_.get(), 0));

  // Nothing was computed or kept: no page was taken, every layer is still 8 long, and a
  // good step at position 8 succeeds.
  EXPECT_EQ(PagesUsed(), pages_prefilled);
  for (const std::string& id : ids) {
    pb::GetSequenceRequest r;
    r.set_sequence_id(id);
    pb::GetSequenceResponse resp;
    grpc::ClientContext c;
    Deadline(&c);
    ASSERT_TRUE(seq_->GetSequence(&c, r, &resp).ok());
    EXPECT_EQ(resp.sequence().layer_lengths(0), 8);
  }
  pb::ExtendResponse er;
  grpc::ClientContext c;
  Deadline(&c, 30);
  grpc::Status st = seq_->Extend(&c, BatchingStep(ids[0], 0, 8, 8, 70), &er);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(er.length(), 16);
  for (const std::string& id : ids) {
    pb::ReleaseSequenceRequest r;
    r.set_sequence_id(id);
    pb::ReleaseSequenceResponse resp;
    grpc::ClientContext rc;
    Deadline(&rc);
    EXPECT_TRUE(seq_->ReleaseSequence(&rc, r, &resp).ok());
  }
  EXPECT_EQ(PagesUsed(), pages_start);
}

}  // namespace
}  // namespace attn::testing
