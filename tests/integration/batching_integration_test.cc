// Integration: dynamic batching (DESIGN.md §8) on the real attention-server binary.
// - Attend under concurrency gives bitwise the same outputs with batching on (a batch runs
//   exactly when it holds --max-batch-requests calls: the delay is 60 s; one executor thread)
//   and off (--max-batch-requests=1), and every call reports the batch of 8 it ran in.
// - Sequence steps from Extend, ExtendBatch and ExtendStream batch across RPCs (each launch
//   holds one step of each of the six sequences) and give the same outputs as unbatched.
// Chaos (full queue, cancellation, tiny deadlines): batching_chaos_integration_test.cc.
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

// Query tokens of one Attend request: Σ_b q_lengths[b] when given, else B·T (padded q is
// (B, T, N, H)) or total_q (varlen q is (total_q, N, H)).
int64_t QueryTokens(const pb::AttendRequest& r) {
  if (r.q_lengths_size() > 0) {
    int64_t sum = 0;
    for (int32_t t : r.q_lengths()) sum += t;
    return sum;
  }
  return r.layout() == pb::LAYOUT_VARLEN ? r.q().shape(0) : r.q().shape(0) * r.q().shape(1);
}

TEST(Batching, AttendSameResultsWithBatchingOnAndOffUnderConcurrency) {
  // Batching on, deterministically: 16 callers, 8 per signature (request i's signature is i's
  // parity, and caller t sends t, t + 16, t + 32), each with one call in flight; a batch runs
  // only when it holds 8 calls (the 60 s delay never ends in time), so every call runs in a
  // batch of exactly 8, whatever the timing.
  ServerProcess on({"--default-backend", "cpu", "--max-queue-delay-us", "60000000",
                    "--max-batch-requests", "8", "--batch-threads", "1", "--cpu-threads", "1",
                    "--metrics-address", ""});
  ServerProcess off({"--default-backend", "cpu", "--max-batch-requests", "1", "--cpu-threads", "1",
                     "--metrics-address", ""});
  ASSERT_TRUE(on.started()) << on.ReadLog();
  ASSERT_TRUE(off.started()) << off.ReadLog();
  constexpr int kRequests = 48, kThreads = 16;
  std::vector<pb::AttendResponse> got_on(kRequests), got_off(kRequests);
  std::vector<grpc::Status> st_on(kRequests), st_off(kRequests);
  for (auto [server, got, st] :
       {std::make_tuple(&on, &got_on, &st_on), std::make_tuple(&off, &got_off, &st_off)}) {
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
    // Unbatched, the launch's query tokens are the call's own; batched, at least those.
    const int64_t own_tokens = QueryTokens(MixedRequest(i));
    EXPECT_EQ(got_off[i].report().batch_tokens(), own_tokens) << "request " << i;
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
            grpc::Status st = stub_->Extend(
                &c, BatchingStep(ids[s], l, len(s, w), tokens(s, w), seed(s, w, l)), &resp);
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
          for (int s : {2, 3})
            *req.add_steps() = BatchingStep(ids[s], l, len(s, w), tokens(s, w), seed(s, w, l));
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
            EXPECT_TRUE(
                stream->Write(BatchingStep(ids[s], l, len(s, w), tokens(s, w), seed(s, w, l))));
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
  const std::vector<std::string> common = {
      "--kv-page-tokens", "4", "--kv-debug-poison", "--cpu-threads", "1", "--metrics-address", ""};
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

}  // namespace
}  // namespace attn::testing
