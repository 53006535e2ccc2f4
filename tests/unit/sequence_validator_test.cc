// CreateSequence.reserve_tokens bound (sequence.proto: [0, 2^24], outside it INVALID_ARGUMENT
// naming the field, before the cache is asked; issue 14 item 6); a negative Extend position is
// INVALID_ARGUMENT (never a layer's length; was FAILED_PRECONDITION from the cache).
#include "validation/sequence_validator.h"

#include <gtest/gtest.h>

namespace attn {
namespace {

attention::v1::CreateSequenceRequest Request(int64_t reserve) {
  attention::v1::CreateSequenceRequest r;
  r.set_num_layers(1);
  r.set_num_kv_heads(1);
  r.set_num_heads(1);
  r.set_head_dim(64);
  r.set_dtype(attention::v1::BFLOAT16);
  r.set_reserve_tokens(reserve);
  return r;
}

TEST(SequenceValidator, ReserveTokensBoundIsTheDocumentedOne) {
  EXPECT_EQ(kMaxReserveTokens, int64_t{1} << 24);  // the bound sequence.proto documents
  EXPECT_TRUE(ValidateCreateSequence(Request(0)).ok());
  auto at = ValidateCreateSequence(Request(int64_t{1} << 24));
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_EQ(at->reserve_tokens, int64_t{1} << 24);
  for (int64_t bad : {(int64_t{1} << 24) + 1, int64_t{1} << 40, int64_t{-1}}) {
    auto v = ValidateCreateSequence(Request(bad));
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(v.status().message().find("reserve_tokens"), std::string::npos)
        << v.status().message();
  }
}

TEST(SequenceValidator, NegativePositionIsInvalidArgument) {
  attention::v1::ExtendRequest r;
  r.set_sequence_id(std::string(32, 'a'));
  r.set_position(-1);
  auto v = ValidateExtend(r);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(),
            "position: expected >= 0 (the layer's current length), got -1");
}

// A step without q that is not append-only is told what is missing and how to append only
// (was "q: expected rank 3, got rank 0"); an append-only step with q is refused too.
TEST(SequenceValidator, MissingQNamesAppendOnly) {
  attention::v1::ExtendRequest r;
  r.set_sequence_id(std::string(32, 'a'));
  for (auto* t : {r.mutable_k(), r.mutable_v()}) {
    t->set_dtype(attention::v1::FLOAT32);
    for (int64_t d : {1, 1, 2}) t->add_shape(d);
    t->set_data(std::string(8, '\0'));
  }
  auto v = ValidateExtend(r);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("q: required"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find("append_only"), std::string::npos) << v.status().message();
  r.set_append_only(true);
  EXPECT_TRUE(ValidateExtend(r).ok());
  *r.mutable_q() = r.k();
  EXPECT_EQ(ValidateExtend(r).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attn
