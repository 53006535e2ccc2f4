// ValidatePackedExtendBatch (server/validation/packed_batch_validator.h): a good batch gives one
// ExtendArgs per step aliasing its rows of the packed tensors; append_only gives q-less args;
// region fields go through the resolver (refused by RefuseRegions, resolved by a fake one with
// the exact byte counts); every malformed batch is INVALID_ARGUMENT naming the field. Also
// ValidateExtend's append_only and ValidateExtendBatch's form check.
#include "validation/packed_batch_validator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "validation/sequence_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
constexpr int64_t kN = 4, kK = 2, kH = 8;

std::string Id(char c) { return std::string(32, c); }

void SetTensor(pb::Tensor *t, int64_t rows, int64_t heads) {
  t->set_dtype(pb::BFLOAT16);
  for (int64_t d : {rows, heads, kH}) t->add_shape(d);
  t->mutable_data()->assign(static_cast<size_t>(rows * heads * kH * 2), '\1');
}

/// Steps of 2, 1 and 3 tokens on sequences a, b, c at positions 0, 5, 7.
pb::PackedExtendBatch Good() {
  pb::PackedExtendBatch p;
  p.set_layer(1);
  const std::vector<std::pair<char, int64_t>> steps = {{'a', 2}, {'b', 1}, {'c', 3}};
  const int64_t positions[] = {0, 5, 7};
  for (size_t i = 0; i < steps.size(); ++i) {
    pb::PackedStep *s = p.add_steps();
    s->set_sequence_id(Id(steps[i].first));
    s->set_position(positions[i]);
    s->set_query_tokens(steps[i].second);
  }
  SetTensor(p.mutable_q(), 6, kN);
  SetTensor(p.mutable_k(), 6, kK);
  SetTensor(p.mutable_v(), 6, kK);
  return p;
}

void ExpectInvalid(const pb::PackedExtendBatch &p, const std::string &what) {
  auto b = ValidatePackedExtendBatch(p, RefuseRegions());
  ASSERT_FALSE(b.ok()) << what;
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().ToString();
  EXPECT_NE(b.status().message().find(what), std::string::npos) << b.status().message();
}

TEST(PackedBatchValidator, StepsAliasTheirRows) {
  const pb::PackedExtendBatch p = Good();
  auto b = ValidatePackedExtendBatch(p, RefuseRegions());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->total_tokens, 6);
  EXPECT_EQ(b->num_heads, kN);
  EXPECT_EQ(b->o, nullptr);
  EXPECT_EQ(b->o_row_bytes, static_cast<uint64_t>(kN * kH * 2));
  ASSERT_EQ(b->steps.size(), 3u);
  const int64_t rows[] = {0, 2, 3}, tokens[] = {2, 1, 3};
  for (size_t i = 0; i < 3; ++i) {
    const ExtendArgs &a = b->steps[i];
    EXPECT_EQ(b->first_row[i], rows[i]);
    EXPECT_EQ(a.layer, 1);
    EXPECT_EQ(a.sequence_id, p.steps(static_cast<int>(i)).sequence_id());
    EXPECT_EQ(a.position, p.steps(static_cast<int>(i)).position());
    EXPECT_EQ(a.q, p.q().data().data() + rows[i] * kN * kH * 2);
    EXPECT_EQ(a.k, p.k().data().data() + rows[i] * kK * kH * 2);
    EXPECT_EQ(a.v, p.v().data().data() + rows[i] * kK * kH * 2);
    EXPECT_EQ(a.q_bytes, static_cast<size_t>(tokens[i] * kN * kH * 2));
    EXPECT_EQ(a.k_bytes, static_cast<size_t>(tokens[i] * kK * kH * 2));
    EXPECT_EQ(a.q_shape, (std::array<int64_t, 3>{tokens[i], kN, kH}));
    EXPECT_EQ(a.k_shape, (std::array<int64_t, 3>{tokens[i], kK, kH}));
    EXPECT_FALSE(a.append_only);
  }
}

TEST(PackedBatchValidator, AppendOnlyHasNoQuery) {
  pb::PackedExtendBatch p = Good();
  p.clear_q();
  p.set_append_only(true);
  auto b = ValidatePackedExtendBatch(p, RefuseRegions());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->num_heads, 0);
  for (const ExtendArgs &a : b->steps) {
    EXPECT_TRUE(a.append_only);
    EXPECT_EQ(a.q, nullptr);
    EXPECT_EQ(a.q_bytes, 0u);
    EXPECT_EQ(a.q_shape[1], 0);
    EXPECT_EQ(a.q_shape[0], a.k_shape[0]);
  }
  p.mutable_o_region()->set_region_id(Id('d'));
  ExpectInvalid(p, "packed.o_region: must be unset when append_only");
}

TEST(PackedBatchValidator, RegionsGoThroughTheResolver) {
  pb::PackedExtendBatch p = Good();
  p.mutable_k()->clear_data();
  p.mutable_k_region()->set_region_id(Id('e'));
  p.mutable_o_region()->set_region_id(Id('f'));
  ExpectInvalid(p, "shared-memory regions: packed.k_region");
  std::string k_bytes(6 * kK * kH * 2, '\2'), o_bytes(6 * kN * kH * 2, '\0');
  std::vector<std::string> asked;
  RegionResolver fake = [&](const char *field, const pb::RegionSlice &, uint64_t bytes,
                            bool writable) -> StatusOr<void *> {
    asked.push_back(std::string(field) + ":" + std::to_string(bytes) + (writable ? ":w" : ""));
    return static_cast<void *>(field == std::string("o_region") ? o_bytes.data() : k_bytes.data());
  };
  auto b = ValidatePackedExtendBatch(p, fake);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(asked, (std::vector<std::string>{"k_region:" + std::to_string(k_bytes.size()),
                                             "o_region:" + std::to_string(o_bytes.size()) + ":w"}));
  EXPECT_EQ(b->steps[1].k, k_bytes.data() + 2 * kK * kH * 2);
  EXPECT_EQ(b->o, o_bytes.data());
  p.mutable_k()->set_data("x");  // data and a region together
  ExpectInvalid(p, "packed.k: data and k_region are both set");
}

TEST(PackedBatchValidator, MalformedBatchesAreInvalidArgument) {
  pb::PackedExtendBatch p = Good();
  p.set_layer(-1);
  ExpectInvalid(p, "packed.layer");
  p = Good();
  p.clear_steps();
  ExpectInvalid(p, "at least one step");
  p = Good();
  p.mutable_steps(2)->set_sequence_id(Id('a'));
  ExpectInvalid(p, "appears twice");
  p = Good();
  p.mutable_steps(1)->set_sequence_id("not-an-id");
  ExpectInvalid(p, "packed.steps[1].sequence_id");
  p = Good();
  p.mutable_steps(0)->set_query_tokens(0);
  ExpectInvalid(p, "packed.steps[0].query_tokens");
  p = Good();
  p.mutable_steps(0)->set_position(-2);
  ExpectInvalid(p, "packed.steps[0].position");
  p = Good();
  p.mutable_steps(2)->set_query_tokens(4);  // 7 != 6 rows
  ExpectInvalid(p, "sum of the steps' query_tokens (7)");
  p = Good();
  p.mutable_q()->set_dtype(pb::FLOAT32);
  ExpectInvalid(p, "packed.q.dtype: expected k's dtype");
  p = Good();
  p.mutable_v()->set_shape(1, 3);
  ExpectInvalid(p, "packed.v: expected k's dtype and shape");
  p = Good();
  p.mutable_q()->set_shape(2, 16);
  ExpectInvalid(p, "packed.q.shape");
  p = Good();
  p.mutable_k()->add_shape(1);
  ExpectInvalid(p, "packed.k: expected rank 3");
  p = Good();
  p.mutable_q()->mutable_data()->pop_back();
  ExpectInvalid(p, "packed.q.data: expected");
  p = Good();
  p.clear_q();
  ExpectInvalid(p, "packed.q: expected");
  p = Good();
  p.set_append_only(true);
  ExpectInvalid(p, "packed.q: must be unset when append_only");
}

TEST(SequenceValidator, ExtendAppendOnly) {
  pb::ExtendRequest r;
  r.set_sequence_id(Id('a'));
  r.set_append_only(true);
  SetTensor(r.mutable_k(), 3, kK);
  SetTensor(r.mutable_v(), 3, kK);
  auto a = ValidateExtend(r);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->append_only);
  EXPECT_EQ(a->q, nullptr);
  EXPECT_EQ(a->q_shape, (std::array<int64_t, 3>{3, 0, kH}));
  SetTensor(r.mutable_q(), 3, kN);
  auto b = ValidateExtend(r);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("q: must be unset"), std::string::npos);
}

TEST(SequenceValidator, ExtendBatchTakesOneForm) {
  pb::ExtendBatchRequest r;
  *r.mutable_packed() = Good();
  EXPECT_TRUE(ValidateExtendBatch(r).ok());
  r.add_steps()->set_sequence_id(Id('z'));
  auto s = ValidateExtendBatch(r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("got both"), std::string::npos);
}

}  // namespace
}  // namespace attn
