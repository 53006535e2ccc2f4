// Unit tests of the per-request tensor element limit (security/tensor_limit.h): every tensor of
// a request counts, invalid shapes count 0, overflow saturates, 0 is unlimited.
#include "security/tensor_limit.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "attention/v1/attention.pb.h"
#include "attention/v1/sequence.pb.h"

namespace attn::security {
namespace {

TEST(TensorLimit, CountsEveryTensorOfARequest) {
  attention::v1::AttendRequest r;
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v()}) {
    for (int64_t d : {2, 3, 4}) t->add_shape(d);
  }
  EXPECT_EQ(CountTensorElements(r), 72);
  EXPECT_TRUE(CheckTensorElements(r, 72).ok());
  EXPECT_TRUE(CheckTensorElements(r, 0).ok());  // unlimited
  const Status s = CheckTensorElements(r, 71);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("72"), std::string::npos);
  EXPECT_NE(s.message().find("71"), std::string::npos);
  attention::v1::ExtendBatchRequest b;
  for (int i = 0; i < 3; ++i) {
    auto* step = b.add_steps();
    step->mutable_q()->add_shape(5);
    step->mutable_k()->add_shape(2);
  }
  EXPECT_EQ(CountTensorElements(b), 21);
  r.mutable_q()->set_shape(0, -1);  // invalid: counted as 0, validation rejects it later
  EXPECT_EQ(CountTensorElements(r), 48);
  r.mutable_k()->clear_shape();
  for (int i = 0; i < 4; ++i) r.mutable_k()->add_shape(int64_t{1} << 40);  // overflows
  EXPECT_EQ(CountTensorElements(r), INT64_MAX);
  EXPECT_EQ(CountTensorElements(attention::v1::GetServerInfoRequest()), 0);
}

}  // namespace
}  // namespace attn::security
