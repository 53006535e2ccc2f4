// Integration: ExtendBatchStream on the real attention-server binary (cpu paged backend,
// --max-batches-in-flight 3). Many requests written at once, packed and per-step forms mixed,
// are each answered exactly once with their tag and the same results (o bit for bit, lengths)
// as unary ExtendBatch calls of the same inputs on twin sequences; a request-level error is
// answered in-stream (code and message, no results) and the requests after it are served; the
// stream ends OK when the client closes its side. (Out-of-order completion and the in-flight
// bound are shown deterministically in tests/unit/batch_stream_test.cc.)
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "packed_testlib.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;

class BatchStreamIntegrationTest : public PackedFixture {};

TEST_F(BatchStreamIntegrationTest, EveryRequestAnsweredOnceWithItsTag) {
  Start({"--max-batches-in-flight", "3"});
  constexpr int kSeqs = 4, kRounds = 3;
  // One sequence per request: steps of one (sequence, layer) pipelined in one stream may run
  // on different batch threads and reach the sequence's lock in either order (sequence.proto:
  // "in arrival order at the server's lock").
  std::vector<std::string> streamed, twins;
  for (int i = 0; i < kSeqs * kRounds; ++i) {
    streamed.push_back(Create(pb::FLOAT32));
    twins.push_back(Create(pb::FLOAT32));
  }
  // Round r, sequence j = r * kSeqs + i: one request (packed for even i), one step of T = 2.
  std::map<uint64_t, pb::ExtendBatchResponse> want;
  std::vector<pb::ExtendBatchRequest> requests;
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kSeqs; ++i) {
      const uint64_t tag = 1000 + r * 10 + i;
      const int j = r * kSeqs + i;
      pb::ExtendBatchRequest twin = PerStep({{twins[j], 0, 2}}, 0, pb::FLOAT32, tag);
      pb::ExtendBatchRequest mine = PerStep({{streamed[j], 0, 2}}, 0, pb::FLOAT32, tag);
      if (i % 2 == 0) {
        twin = Pack(twin);
        mine = Pack(mine);
      }
      mine.set_tag(tag);
      ASSERT_TRUE(Batch(twin, &want[tag]).ok());
      requests.push_back(mine);
    }
    pb::ExtendBatchRequest bad;  // no steps at all: a request-level error
    bad.set_tag(2000 + r);
    requests.push_back(bad);
  }
  grpc::ClientContext c;
  Ctx(&c);
  auto stream = seq_->ExtendBatchStream(&c);
  for (const pb::ExtendBatchRequest &r : requests) ASSERT_TRUE(stream->Write(r));
  ASSERT_TRUE(stream->WritesDone());
  std::map<uint64_t, pb::ExtendBatchResponse> got;
  pb::ExtendBatchResponse resp;
  while (stream->Read(&resp)) {
    EXPECT_TRUE(got.emplace(resp.tag(), resp).second) << "tag " << resp.tag() << " twice";
  }
  grpc::Status st = stream->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(got.size(), requests.size());
  for (int r = 0; r < kRounds; ++r) {
    const pb::ExtendBatchResponse &e = got[2000 + r];
    EXPECT_EQ(e.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_NE(e.message().find("at least one step"), std::string::npos) << e.message();
    EXPECT_EQ(e.results_size() + e.steps_size(), 0);
  }
  for (const auto &[tag, w] : want) {
    const pb::ExtendBatchResponse &g = got[tag];
    EXPECT_EQ(g.code(), 0) << g.message();
    ASSERT_EQ(g.results_size(), w.results_size()) << tag;
    ASSERT_EQ(g.steps_size(), w.steps_size()) << tag;
    for (int i = 0; i < w.results_size(); ++i) {
      EXPECT_EQ(g.results(i).code(), 0) << g.results(i).message();
      EXPECT_EQ(g.results(i).response().o().data(), w.results(i).response().o().data());
      EXPECT_EQ(g.results(i).response().length(), w.results(i).response().length());
    }
    for (int i = 0; i < w.steps_size(); ++i) {
      EXPECT_EQ(g.steps(i).code(), 0) << g.steps(i).message();
      EXPECT_EQ(g.steps(i).length(), w.steps(i).length());
    }
    EXPECT_EQ(g.o().data(), w.o().data());
  }
  for (const std::string &id : streamed) EXPECT_EQ(Length(id, 0), 2);
}

}  // namespace
}  // namespace attn::testing
