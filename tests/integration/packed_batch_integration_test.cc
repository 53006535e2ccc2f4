// Integration: the packed ExtendBatch (one q, k, v for all steps) and append-only steps on the
// real attention-server binary (cpu paged backend, --kv-debug-poison). The packed form must give
// bit-identical o, lengths, kv_len and replays to the per-step form on the same inputs; an
// append-only upload then a decode step must equal the same history extended with attention;
// every request-level error of the packed form is INVALID_ARGUMENT and changes nothing; a step
// on an unknown sequence or at a wrong position fails on its own (NOT_FOUND,
// FAILED_PRECONDITION) while the others are applied.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "packed_testlib.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;

class PackedBatchTest : public PackedFixture,
                        public ::testing::WithParamInterface<std::tuple<pb::DType, bool>> {};

/// Step i's rows of the packed o, as bytes.
std::string Rows(const pb::Tensor &o, int64_t first_row, int64_t rows) {
  const size_t row = o.data().size() / static_cast<size_t>(o.shape(0));
  return o.data().substr(static_cast<size_t>(first_row) * row, static_cast<size_t>(rows) * row);
}

TEST_P(PackedBatchTest, PackedEqualsPerStepBitForBit) {
  const auto [dtype, mixed] = GetParam();
  Start();
  std::vector<std::string> per_ids, packed_ids;
  for (int i = 0; i < 3; ++i) {
    per_ids.push_back(Create(dtype));
    packed_ids.push_back(Create(dtype));
  }
  std::vector<int64_t> len(3, 0);
  // Round 0: a prefill (mixed T, over a page boundary) or decode; then decode rounds.
  const std::vector<int64_t> first_tokens = mixed ? std::vector<int64_t>{5, 1, 9}
                                                  : std::vector<int64_t>{1, 1, 1};
  for (int round = 0; round < 4; ++round) {
    std::vector<StepSpec> per, packed;
    for (int i = 0; i < 3; ++i) {
      const int64_t T = round == 0 ? first_tokens[i] : (mixed && i == 2 ? 3 : 1);
      per.push_back({per_ids[i], len[i], T});
      packed.push_back({packed_ids[i], len[i], T});
    }
    const pb::ExtendBatchRequest a = PerStep(per, 1, dtype, 100 + round);
    pb::ExtendBatchRequest b = Pack(PerStep(packed, 1, dtype, 100 + round));
    b.set_tag(77 + round);
    pb::ExtendBatchResponse ra, rb;
    ASSERT_TRUE(Batch(a, &ra).ok());
    grpc::Status st = Batch(b, &rb);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    EXPECT_EQ(rb.tag(), static_cast<uint64_t>(77 + round));
    ASSERT_EQ(rb.steps_size(), 3);
    EXPECT_EQ(rb.results_size(), 0);
    EXPECT_EQ(rb.report().batch_size(), 3);
    EXPECT_EQ(rb.report().backend(), "paged-cpu");
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
      const pb::ExtendResult &x = ra.results(i);
      const pb::PackedStepResult &y = rb.steps(i);
      ASSERT_EQ(x.code(), 0) << x.message();
      ASSERT_EQ(y.code(), 0) << y.message();
      EXPECT_EQ(y.length(), x.response().length());
      EXPECT_EQ(y.length(), len[i] + per[i].tokens);
      EXPECT_EQ(y.kv_len(), y.length());
      EXPECT_FALSE(y.replayed());
      EXPECT_EQ(Rows(rb.o(), row, per[i].tokens), x.response().o().data()) << "step " << i;
      row += per[i].tokens;
      len[i] += per[i].tokens;
    }
    EXPECT_EQ(rb.o().shape(0), row);
    EXPECT_EQ(rb.report().batch_tokens(), row);
    // An exact replay of the packed batch: every step replayed, the same o, nothing appended.
    pb::ExtendBatchResponse again;
    ASSERT_TRUE(Batch(b, &again).ok());
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(again.steps(i).replayed());
      EXPECT_EQ(again.steps(i).length(), len[i]);
    }
    EXPECT_EQ(again.o().data(), rb.o().data());
    EXPECT_EQ(Length(packed_ids[0], 1), len[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndShapes, PackedBatchTest,
                         ::testing::Combine(::testing::Values(pb::FLOAT32, pb::BFLOAT16),
                                            ::testing::Bool()));

class AppendOnlyTest : public PackedFixture {};

TEST_F(AppendOnlyTest, AppendOnlyThenAttendEqualsExtendWithAttend) {
  Start();
  const std::string full = Create(pb::BFLOAT16), unary = Create(pb::BFLOAT16),
                    packed = Create(pb::BFLOAT16);
  // The reference: a prefill of 6 tokens with attention, then one decode step.
  const pb::ExtendBatchRequest prefill = PerStep({{full, 0, 6}}, 0, pb::BFLOAT16, 5);
  const pb::ExtendBatchRequest decode = PerStep({{full, 6, 1}}, 0, pb::BFLOAT16, 6);
  pb::ExtendBatchResponse r;
  ASSERT_TRUE(Batch(prefill, &r).ok());
  ASSERT_TRUE(Batch(decode, &r).ok());
  ASSERT_EQ(r.results(0).code(), 0) << r.results(0).message();
  const std::string want = r.results(0).response().o().data();

  // Unary Extend with append_only: the same k/v, no q, no o.
  pb::ExtendRequest up = prefill.steps(0);
  up.set_sequence_id(unary);
  up.clear_q();
  up.set_append_only(true);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second is an exact replay
    pb::ExtendResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    grpc::Status st = seq_->Extend(&c, up, &resp);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    EXPECT_EQ(resp.length(), 6);
    EXPECT_FALSE(resp.has_o());
    EXPECT_EQ(resp.replayed(), attempt == 1);
  }
  // Packed append_only: the same k/v, q unset; o has dtype and shape only.
  pb::ExtendBatchRequest pp = Pack(PerStep({{packed, 0, 6}}, 0, pb::BFLOAT16, 5));
  pp.mutable_packed()->clear_q();
  pp.mutable_packed()->set_append_only(true);
  for (int attempt = 0; attempt < 2; ++attempt) {
    pb::ExtendBatchResponse resp;
    grpc::Status st = Batch(pp, &resp);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    ASSERT_EQ(resp.steps(0).code(), 0) << resp.steps(0).message();
    EXPECT_EQ(resp.steps(0).length(), 6);
    EXPECT_EQ(resp.steps(0).kv_len(), 0);
    EXPECT_EQ(resp.steps(0).replayed(), attempt == 1);
    EXPECT_TRUE(resp.o().data().empty());
    EXPECT_EQ(resp.o().shape(0), 6);
  }
  // Then the same decode step on both: o equals the reference bit for bit.
  for (const std::string &id : {unary, packed}) {
    pb::ExtendBatchRequest d = decode;
    d.mutable_steps(0)->set_sequence_id(id);
    pb::ExtendBatchResponse resp;
    ASSERT_TRUE(Batch(d, &resp).ok());
    ASSERT_EQ(resp.results(0).code(), 0) << resp.results(0).message();
    EXPECT_EQ(resp.results(0).response().o().data(), want);
    EXPECT_EQ(resp.results(0).response().length(), 7);
  }
}

class PackedErrorsTest : public PackedFixture {
 protected:
  void SetUp() override {
    Start();
    a_ = Create(pb::FLOAT32);
    b_ = Create(pb::FLOAT32);
  }
  pb::ExtendBatchRequest Good() { return Pack(PerStep({{a_, 0, 2}, {b_, 0, 1}}, 0, pb::FLOAT32, 9)); }
  /// `r` fails as a whole with INVALID_ARGUMENT whose message has `what`; nothing changed.
  void ExpectRefused(const pb::ExtendBatchRequest &r, const std::string &what) {
    pb::ExtendBatchResponse resp;
    grpc::Status st = Batch(r, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(what), std::string::npos) << st.error_message();
    EXPECT_EQ(Length(a_, 0), 0);
    EXPECT_EQ(Length(b_, 0), 0);
  }
  std::string a_, b_;
};

TEST_F(PackedErrorsTest, RequestLevelErrorsChangeNothing) {
  pb::ExtendBatchRequest r = Good();
  r.mutable_packed()->mutable_steps(1)->set_query_tokens(2);  // rows: 4 != 3
  ExpectRefused(r, "sum of the steps' query_tokens");
  r = Good();
  r.mutable_packed()->mutable_v()->set_dtype(pb::FLOAT16);
  ExpectRefused(r, "packed.v");
  r = Good();
  r.mutable_packed()->mutable_q()->set_dtype(pb::DType(99));
  ExpectRefused(r, "packed.q.dtype");
  r = Good();
  r.mutable_packed()->set_append_only(true);  // q still set
  ExpectRefused(r, "packed.q: must be unset when append_only");
  r = Good();
  r.mutable_packed()->mutable_k_region()->set_region_id("0123456789abcdef0123456789abcdef");
  r.mutable_packed()->mutable_k()->clear_data();
  ExpectRefused(r, "packed.k_region: region bytes");  // a slice of 0 bytes (more: shared_memory_py)
  r = Good();
  r.mutable_packed()->mutable_o_region()->set_region_id("0123456789abcdef0123456789abcdef");
  ExpectRefused(r, "packed.o_region: region bytes");
  r = Good();
  r.mutable_packed()->mutable_steps(1)->set_sequence_id(a_);
  ExpectRefused(r, "appears twice");
  r = Good();
  r.mutable_packed()->mutable_k()->mutable_data()->pop_back();
  ExpectRefused(r, "packed.k.data");
  r = Good();
  *r.add_steps() = PerStep({{a_, 0, 1}}, 0, pb::FLOAT32, 1).steps(0);
  ExpectRefused(r, "got both");
  r = Good();
  r.mutable_packed()->clear_steps();
  ExpectRefused(r, "at least one step");
}

TEST_F(PackedErrorsTest, StepErrorsAreReportedPerStep) {
  // b_ at a wrong position, an unknown sequence; a_ is applied, b_ is unchanged.
  const std::string unknown = "0123456789abcdef0123456789abcdef";
  pb::ExtendBatchRequest r =
      Pack(PerStep({{a_, 0, 2}, {b_, 3, 1}, {unknown, 0, 1}}, 0, pb::FLOAT32, 9));
  pb::ExtendBatchResponse resp;
  grpc::Status st = Batch(r, &resp);
  ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  ASSERT_EQ(resp.steps_size(), 3);
  EXPECT_EQ(resp.steps(0).code(), 0) << resp.steps(0).message();
  EXPECT_EQ(resp.steps(0).length(), 2);
  EXPECT_EQ(resp.steps(1).code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_NE(resp.steps(1).message().find("length 0"), std::string::npos) << resp.steps(1).message();
  EXPECT_EQ(resp.steps(2).code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(Length(a_, 0), 2);
  EXPECT_EQ(Length(b_, 0), 0);
  // The failed steps' rows of o (rows 2 and 3) are zero; step 0's are not.
  const pb::Tensor &o = resp.o();
  const size_t row = o.data().size() / 4;
  EXPECT_EQ(o.data().substr(2 * row), std::string(2 * row, '\0'));
  EXPECT_NE(o.data().substr(0, row), std::string(row, '\0'));
}

}  // namespace
}  // namespace attn::testing
