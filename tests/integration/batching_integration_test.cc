// Integration: dynamic batching (DESIGN.md §8) on the real attention-server binary.
// - Attend under concurrency gives bitwise the same outputs with batching on (a batch runs
//   exactly when it holds --max-batch-requests calls: the delay is 60 s; one executor thread)
//   and off (--max-batch-requests=1), and every call reports the batch of 8 it ran in.
// - Sequence steps from Extend, ExtendBatch and ExtendStream batch across RPCs (each launch
//   holds one step of each of the six sequences) and give the same outputs as unbatched.
// - Chaos: a full queue (RESOURCE_EXHAUSTED with the numbers), calls cancelled while queued,
//   1 µs deadlines, a stream whose client vanishes while its step is queued; every RPC ends
//   with exactly one status; afterwards the queue is empty (GetLoad), KV pages are back to
//   their count and good requests still succeed.
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
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;

constexpr int64_t kN = 4, kK = 2, kH = 16;

void Deadline(grpc::ClientContext* c, int seconds = 60) {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

// Request i of a fixed random mix: padded with/without lengths and varlen, two signatures.
pb::AttendRequest MixedRequest(int i) {
  std::mt19937_64 rng(1000 + i);
  const int64_t B = 1 + i % 3, T = 1 + (i * 7) % 9, S = 2 + (i * 5) % 11;
  pb::AttendRequest r;
  if (i % 3 == 2) {
    r.set_layout(pb::LAYOUT_VARLEN);
    int64_t tq = 0, tk = 0;
    for (int64_t b = 0; b < B; ++b) {
      r.add_q_lengths(static_cast<int32_t>(1 + (b + i) % 4));
      r.add_kv_lengths(static_cast<int32_t>(2 + (b * 3 + i) % 6));
      tq += r.q_lengths(b);
      tk += r.kv_lengths(b);
    }
    FillTensor(r.mutable_q(), pb::FLOAT32, {tq, kN, kH}, &rng);
    FillTensor(r.mutable_k(), pb::FLOAT32, {tk, kK, kH}, &rng);
    FillTensor(r.mutable_v(), pb::FLOAT32, {tk, kK, kH}, &rng);
  } else {
    r = PaddedRequest(B, T, S, kN, kK, kH, pb::FLOAT32, 1000 + i);
    if (i % 3 == 1) {
      for (int64_t b = 0; b < B; ++b) {
        r.add_q_lengths(static_cast<int32_t>((b + i) % (T + 1)));
        r.add_kv_lengths(static_cast<int32_t>((b * 2 + i) % (S + 1)));
      }
    }
  }
  if (i % 2 == 1) {  // second signature: bottom-right causal with lse
    r.mutable_mask()->set_causal(pb::CAUSAL_BOTTOM_RIGHT);
    r.set_return_lse(true);
  }
  r.set_backend("cpu");
  return r;
}

int64_t Queued(ServerProcess* server) {
  auto stub = server->Stub();
  grpc::ClientContext c;
  Deadline(&c, 10);
  pb::GetLoadResponse load;
  grpc::Status st = stub->GetLoad(&c, pb::GetLoadRequest(), &load);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return st.ok() ? load.requests_queued() : -1;
}

// Polls GetLoad until `want` calls are queued (or 20 s pass).
bool WaitQueued(ServerProcess* server, int64_t want) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until) {
    if (Queued(server) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(Batching, AttendSameResultsWithBatchingOnAndOffUnderConcurrency) {
  // Batching on, deterministically: 16 callers, 8 per signature (request i's signature is i's
  // parity, and caller t sends t, t + 16, t + 32), each with one call in flight; a batch runs
  // only when it holds 8 calls (the 60 s delay never ends in time), so every call runs in a
  // batch of exactly 8, whatever the timing.
  ServerProcess on({"--default-backend", "cpu", "--max-queue-delay-us", "60000000",
                    "--max-batch-requests", "8", "--batch-threads", "1", "--cpu-threads", "1",
                    "--metrics-address", ""});
  ServerProcess off({"--default-backend", "cpu", "--max-batch-requests", "1",
                     "--cpu-threads", "1", "--metrics-address", ""});
  ASSERT_TRUE(on.started()) << on.ReadLog();
  ASSERT_TRUE(off.started()) << off.ReadLog();
  constexpr int kRequests = 48, kThreads = 16;
  std::vector<pb::AttendResponse> got_on(kRequests), got_off(kRequests);
  std::vector<grpc::Status> st_on(kRequests), st_off(kRequests);
  for (auto [server, got, st] : {std::make_tuple(&on, &got_on, &st_on),
                                 std::make_tuple(&off, &got_off, &st_off)}) {
    std::vector<std::thread> threads;
    auto channel = server->Channel();
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t, server, got, st] {
        auto stub = pb::AttentionService::NewStub(channel);
        for (int i = t; i < kRequests; i += kThreads) {
          grpc::ClientContext c;
          Deadline(&c);
          (*st)[i] = stub->Attend(&c, MixedRequest(i), &(*got)[i]);
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(st_on[i].ok()) << i << ": " << st_on[i].error_message();
    ASSERT_TRUE(st_off[i].ok()) << i << ": " << st_off[i].error_message();
    EXPECT_EQ(got_on[i].o().data(), got_off[i].o().data()) << "request " << i;
    EXPECT_EQ(got_on[i].lse().data(), got_off[i].lse().data()) << "request " << i;
    EXPECT_EQ(got_on[i].o().shape_size(), got_off[i].o().shape_size());
    EXPECT_EQ(got_off[i].report().batch_size(), 1);
    const auto& r = got_on[i].report();
    EXPECT_EQ(r.batch_size(), 8) << "request " << i;
    // The launch's tokens: this call's and the other 7 calls'.
    EXPECT_GT(r.batch_tokens(), got_off[i].report().batch_tokens()) << "request " << i;
  }
  // Every batch but the last of each signature waited for its 8th call: those calls report
  // the time they waited.
  int waited = 0;
  for (int i = 0; i < kRequests; ++i) waited += got_on[i].report().times().queue_us() > 0;
  EXPECT_GT(waited, 0);
  EXPECT_EQ(Queued(&on), 0);
}

// Sequence steps: six sequences, decoded concurrently through two Extend callers, one
// ExtendBatch caller (two sequences per call) and two ExtendStreams.
class SequenceRun {
 public:
  explicit SequenceRun(ServerProcess* server)
      : stub_(pb::SequenceService::NewStub(server->Channel())) {}

  static pb::ExtendRequest Step(const std::string& id, int layer, int64_t pos, int64_t T,
                                uint64_t seed) {
    std::mt19937_64 rng(seed);
    pb::ExtendRequest r;
    r.set_sequence_id(id);
    r.set_layer(layer);
    r.set_position(pos);
    FillTensor(r.mutable_q(), pb::FLOAT32, {T, kN, kH}, &rng);
    FillTensor(r.mutable_k(), pb::FLOAT32, {T, kK, kH}, &rng);
    FillTensor(r.mutable_v(), pb::FLOAT32, {T, kK, kH}, &rng);
    return r;
  }

  // Returns outputs keyed "seq/wave/layer"; counts steps that ran in batches > 1.
  std::map<std::string, std::string> Run(int* batched) {
    constexpr int kSeqs = 6, kWaves = 4, kLayers = 2;
    std::vector<std::string> ids;
    for (int s = 0; s < kSeqs; ++s) {
      pb::CreateSequenceRequest r;
      r.set_num_layers(kLayers);
      r.set_num_kv_heads(kK);
      r.set_head_dim(kH);
      r.set_num_heads(kN);
      r.set_dtype(pb::FLOAT32);
      pb::CreateSequenceResponse resp;
      grpc::ClientContext c;
      Deadline(&c);
      EXPECT_TRUE(stub_->CreateSequence(&c, r, &resp).ok());
      ids.push_back(resp.sequence().sequence_id());
    }
    std::mutex mu;
    std::map<std::string, std::string> out;
    std::atomic<int> batched_steps{0};
    std::atomic<int> timed_batches{0};
    auto record = [&](int s, int wave, int layer, const pb::ExtendResponse& r) {
      if (r.report().batch_size() > 1) batched_steps.fetch_add(1);
      // The batch's wall time contains its kernels' time, which contains this step's group's.
      const pb::PhaseTimes& t = r.report().times();
      EXPECT_GE(t.batch_us(), t.batch_kernel_us());
      EXPECT_GE(t.batch_kernel_us(), t.kernel_us());
      if (t.batch_us() > 0) timed_batches.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      out[std::to_string(s) + "/" + std::to_string(wave) + "/" + std::to_string(layer)] =
          r.o().data();
    };
    // Wave 0 is a prefill of 3 + s tokens, then decodes of 1 token.
    auto len = [](int s, int wave) { return wave == 0 ? 0 : 3 + s + (wave - 1); };
    auto tokens = [](int s, int wave) { return wave == 0 ? 3 + s : 1; };
    auto seed = [](int s, int wave, int layer) { return uint64_t(s * 100 + wave * 10 + layer); };
    std::vector<std::thread> threads;
    for (int s : {0, 1}) {  // unary Extend
      threads.emplace_back([&, s] {
        for (int w = 0; w < kWaves; ++w) {
          for (int l = 0; l < kLayers; ++l) {
            pb::ExtendResponse resp;
            grpc::ClientContext c;
            Deadline(&c);
            grpc::Status st = stub_->Extend(&c, Step(ids[s], l, len(s, w), tokens(s, w),
                                                    seed(s, w, l)),
                                            &resp);
            EXPECT_TRUE(st.ok()) << st.error_message();
            record(s, w, l, resp);
          }
        }
      });
    }
    threads.emplace_back([&] {  // ExtendBatch over sequences 2 and 3
      for (int w = 0; w < kWaves; ++w) {
        for (int l = 0; l < kLayers; ++l) {
          pb::ExtendBatchRequest req;
          for (int s : {2, 3}) *req.add_steps() = Step(ids[s], l, len(s, w), tokens(s, w),
                                                       seed(s, w, l));
          pb::ExtendBatchResponse resp;
          grpc::ClientContext c;
          Deadline(&c);
          grpc::Status st = stub_->ExtendBatch(&c, req, &resp);
          EXPECT_TRUE(st.ok()) << st.error_message();
          for (int k = 0; k < resp.results_size(); ++k) {
            EXPECT_EQ(resp.results(k).code(), 0) << resp.results(k).message();
            record(2 + k, w, l, resp.results(k).response());
          }
        }
      }
    });
    for (int s : {4, 5}) {  // one ExtendStream each
      threads.emplace_back([&, s] {
        grpc::ClientContext c;
        Deadline(&c);
        auto stream = stub_->ExtendStream(&c);
        for (int w = 0; w < kWaves; ++w) {
          for (int l = 0; l < kLayers; ++l) {
            EXPECT_TRUE(stream->Write(Step(ids[s], l, len(s, w), tokens(s, w), seed(s, w, l))));
            pb::ExtendResult result;
            EXPECT_TRUE(stream->Read(&result));
            EXPECT_EQ(result.code(), 0) << result.message();
            record(s, w, l, result.response());
          }
        }
        stream->WritesDone();
        EXPECT_TRUE(stream->Finish().ok());
      });
    }
    for (auto& t : threads) t.join();
    for (const std::string& id : ids) {
      pb::ReleaseSequenceRequest r;
      r.set_sequence_id(id);
      pb::ReleaseSequenceResponse resp;
      grpc::ClientContext c;
      Deadline(&c);
      EXPECT_TRUE(stub_->ReleaseSequence(&c, r, &resp).ok());
    }
    *batched = batched_steps.load();
    EXPECT_GT(timed_batches.load(), 0) << "no step reported its batch's wall time";
    return out;
  }

 private:
  std::unique_ptr<pb::SequenceService::Stub> stub_;
};

TEST(Batching, SequenceStepsBatchAcrossRpcsWithTheSameOutputs) {
  const std::vector<std::string> common = {"--kv-page-tokens", "4", "--kv-debug-poison",
                                           "--cpu-threads", "1", "--metrics-address", ""};
  std::vector<std::string> on_args = common, off_args = common;
  // Batching on, deterministically: six sequences, each with one step in flight; a batch runs
  // only when it holds a step of each (the 60 s delay never ends in time), so every step runs
  // in a launch of exactly 6, whatever the timing.
  on_args.insert(on_args.end(), {"--max-queue-delay-us", "60000000", "--max-batch-requests", "6",
                                 "--batch-threads", "1"});
  off_args.insert(off_args.end(), {"--max-batch-requests", "1"});
  ServerProcess on(on_args), off(off_args);
  ASSERT_TRUE(on.started()) << on.ReadLog();
  ASSERT_TRUE(off.started()) << off.ReadLog();
  int batched_on = 0, batched_off = 0;
  const auto a = SequenceRun(&on).Run(&batched_on);
  const auto b = SequenceRun(&off).Run(&batched_off);
  ASSERT_EQ(a.size(), 6u * 4 * 2);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, o] : a) {
    ASSERT_TRUE(b.count(key)) << key;
    EXPECT_FALSE(o.empty()) << key;
    EXPECT_EQ(o, b.at(key)) << key;
  }
  EXPECT_EQ(batched_on, 6 * 4 * 2) << "every step runs in a launch of 6";
  EXPECT_EQ(batched_off, 0);
  EXPECT_EQ(Queued(&on), 0);
}

class BatchingChaos : public ::testing::Test {
 protected:
  void SetUp() override {
    // Small work (< 8 tokens) waits up to 60 s for a batch; work of >= 8 tokens fills the
    // token budget and runs at once. At most 6 calls may wait.
    server_ = std::make_unique<ServerProcess>(std::vector<std::string>{
        "--default-backend", "cpu", "--max-queue-delay-us", "60000000", "--max-batch-tokens",
        "8", "--batch-threads", "1", "--max-queue-requests", "6", "--kv-page-tokens", "4",
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
      status[i] = stub_->Attend(contexts[i].get(), PaddedRequest(1, 1, 4, kN, kK, kH,
                                                                 pb::FLOAT32, i),
                                &resp);
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
    grpc::Status st = seq_->Extend(&c2, SequenceRun::Step(ids[s], 0, 0, 8, s), &er);
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
    unary_status = seq_->Extend(&unary_ctx, SequenceRun::Step(ids[0], 0, 8, 1, 50), &er);
    ++unary_statuses;
  });
  // A stream writes a decode step and vanishes while it waits.
  grpc::ClientContext stream_ctx;
  Deadline(&stream_ctx, 120);
  auto stream = seq_->ExtendStream(&stream_ctx);
  ASSERT_TRUE(stream->Write(SequenceRun::Step(ids[1], 0, 8, 1, 51)));
  // An ExtendBatch of decode steps on two other sequences waits too; its client cancels.
  grpc::ClientContext batch_ctx;
  Deadline(&batch_ctx, 120);
  grpc::Status batch_status;
  int batch_statuses = 0;
  std::thread batch([&] {
    pb::ExtendBatchRequest req;
    *req.add_steps() = SequenceRun::Step(ids[2], 0, 8, 1, 52);
    *req.add_steps() = SequenceRun::Step(ids[3], 0, 8, 1, 53);
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
    grpc::Status st = seq_->Extend(&c, SequenceRun::Step(ids[i % 4], 0, 8, 1, 60 + i), &er);
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
  grpc::Status st = seq_->Extend(&c, SequenceRun::Step(ids[0], 0, 8, 8, 70), &er);
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
