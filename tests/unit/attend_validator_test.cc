#include "validation/attend_validator.h"

#include <gtest/gtest.h>

#include <cmath>

namespace attn {
namespace {

using attention::v1::AttendRequest;

void Fill(attention::v1::Tensor* t, attention::v1::DType dt, std::vector<int64_t> shape) {
  t->set_dtype(dt);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  t->mutable_data()->assign(n * (dt == attention::v1::FLOAT32 ? 4 : 2), '\x01');
}

AttendRequest Padded(int64_t B, int64_t T, int64_t S, int64_t N, int64_t K, int64_t H) {
  AttendRequest r;
  Fill(r.mutable_q(), attention::v1::BFLOAT16, {B, T, N, H});
  Fill(r.mutable_k(), attention::v1::BFLOAT16, {B, S, K, H});
  Fill(r.mutable_v(), attention::v1::BFLOAT16, {B, S, K, H});
  return r;
}

void ExpectInvalid(const AttendRequest& r, const std::string& needle) {
  auto v = ValidateAttend(r);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find(needle), std::string::npos) << v.status().message();
}

TEST(AttendValidator, GoodPaddedRequestDescribesTheProblem) {
  AttendRequest r = Padded(2, 5, 7, 8, 2, 64);
  r.mutable_mask()->set_causal(attention::v1::CAUSAL_BOTTOM_RIGHT);
  r.mutable_mask()->set_window_left(3);
  r.add_kv_lengths(7);
  r.add_kv_lengths(4);
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape.batch, 2);
  EXPECT_EQ(v->shape.max_q_len, 5);
  EXPECT_EQ(v->shape.max_kv_len, 7);
  EXPECT_EQ(v->shape.num_heads, 8);
  EXPECT_EQ(v->shape.num_kv_heads, 2);
  EXPECT_EQ(v->shape.mask.window_left, 3);
  EXPECT_EQ(v->shape.mask.window_right, -1);
  EXPECT_FLOAT_EQ(v->shape.scale, 0.125f);  // 1/sqrt(64)
  ASSERT_EQ(v->q_lengths.size(), 2u);       // q defaults to full length when kv given
  EXPECT_EQ(v->q_lengths[1], 5);
  EXPECT_EQ(v->kv_lengths[1], 4);
  EXPECT_DOUBLE_EQ(v->flops, 4.0 * (5 * 7 + 5 * 4) * 8 * 64 * 0.5);
  EXPECT_EQ(v->lse_shape, (std::vector<int64_t>{2, 8, 5}));
  auto t = v->Tensors(nullptr, nullptr);
  EXPECT_EQ(t.kv_lengths[1], 4);
}

TEST(AttendValidator, Fp8OptionsDefaultOnAndE4M3ScalesAreCarried) {
  AttendRequest r = Padded(1, 4, 4, 2, 2, 64);
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->shape.fp8.rotate);  // unset means on
  EXPECT_TRUE(v->shape.fp8.smooth_k);
  r.mutable_fp8()->set_rotate(false);
  v = ValidateAttend(r);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->shape.fp8.rotate);
  EXPECT_TRUE(v->shape.fp8.smooth_k);
  r.mutable_fp8()->set_smooth_k(false);
  r.mutable_fp8()->set_rotate(true);
  v = ValidateAttend(r);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->shape.fp8.rotate);
  EXPECT_FALSE(v->shape.fp8.smooth_k);
  // FLOAT8_E4M3 inputs: one byte per element, the per-tensor scales become the descales.
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v()}) {
    t->set_dtype(attention::v1::FLOAT8_E4M3);
    t->mutable_data()->resize(t->data().size() / 2);
  }
  r.mutable_q()->set_scale(0.5f);
  r.mutable_k()->set_scale(0.25f);
  r.mutable_v()->set_scale(2.f);
  v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape.dtype, kernels::DType::kFloat8E4M3);
  EXPECT_FLOAT_EQ(v->shape.fp8.q_descale, 0.5f);
  EXPECT_FLOAT_EQ(v->shape.fp8.k_descale, 0.25f);
  EXPECT_FLOAT_EQ(v->shape.fp8.v_descale, 2.f);
  r.mutable_v()->set_scale(0.f);
  ExpectInvalid(r, "v.scale");
}

TEST(AttendValidator, Fp8FormatsParseAndImpossiblePairsAreRefused) {
  using F = attention::v1::Fp8Options;
  AttendRequest r = Padded(1, 4, 4, 2, 2, 64);
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape.fp8.qk, kernels::Fp8QkFormat::kAuto);
  EXPECT_EQ(v->shape.fp8.pv, kernels::Fp8PvFormat::kAuto);
  r.mutable_fp8()->set_qk_format(F::QK_INT8_PER_TOKEN);
  r.mutable_fp8()->set_pv_format(F::PV_16BIT);
  v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape.fp8.qk, kernels::Fp8QkFormat::kInt8PerToken);
  EXPECT_EQ(v->shape.fp8.pv, kernels::Fp8PvFormat::k16Bit);
  r.mutable_fp8()->set_qk_format(F::QK_E4M3_PER_TENSOR);  // no such kernel pair
  ExpectInvalid(r, "PV_16BIT needs qk_format QK_INT8_PER_TOKEN");
  r.mutable_fp8()->set_pv_format(F::PV_E4M3);
  v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape.fp8.qk, kernels::Fp8QkFormat::kE4M3PerTensor);
  EXPECT_EQ(v->shape.fp8.pv, kernels::Fp8PvFormat::kE4M3);
  r.mutable_fp8()->set_qk_format(static_cast<F::QkFormat>(7));  // an unknown enum value
  ExpectInvalid(r, "fp8.qk_format: unknown value 7");
  r.mutable_fp8()->set_qk_format(F::QK_INT8_PER_TOKEN);
  r.mutable_fp8()->set_pv_format(static_cast<F::PvFormat>(9));
  ExpectInvalid(r, "fp8.pv_format: unknown value 9");
  // FLOAT8_E4M3 inputs are per-tensor already: INT8 Q·Kᵀ is refused for them.
  r.mutable_fp8()->set_pv_format(F::PV_FORMAT_UNSPECIFIED);
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v()}) {
    t->set_dtype(attention::v1::FLOAT8_E4M3);
    t->mutable_data()->resize(t->data().size() / 2);
    t->set_scale(1.f);
  }
  ExpectInvalid(r, "FLOAT8_E4M3 inputs are per-tensor E4M3 already");
  r.mutable_fp8()->set_qk_format(F::QK_FORMAT_UNSPECIFIED);
  EXPECT_TRUE(ValidateAttend(r).ok());
}

TEST(AttendValidator, VarlenComputesOffsets) {
  AttendRequest r;
  r.set_layout(attention::v1::LAYOUT_VARLEN);
  Fill(r.mutable_q(), attention::v1::FLOAT16, {5, 4, 32});
  Fill(r.mutable_k(), attention::v1::FLOAT16, {9, 1, 32});
  Fill(r.mutable_v(), attention::v1::FLOAT16, {9, 1, 32});
  for (int x : {2, 0, 3}) r.add_q_lengths(x);
  for (int x : {4, 5, 0}) r.add_kv_lengths(x);
  auto v = ValidateAttend(r);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape.batch, 3);
  EXPECT_EQ(v->shape.max_q_len, 3);
  EXPECT_EQ(v->shape.max_kv_len, 5);
  EXPECT_EQ(v->q_offsets, (std::vector<int64_t>{0, 2, 2, 5}));
  EXPECT_EQ(v->kv_offsets, (std::vector<int64_t>{0, 4, 9, 9}));
  EXPECT_EQ(v->lse_shape, (std::vector<int64_t>{4, 5}));
}

TEST(AttendValidator, RejectsEachBadField) {
  AttendRequest r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_q()->mutable_data()->append("x");
  ExpectInvalid(r, "q.data: expected 128 bytes");

  r = Padded(1, 4, 4, 6, 4, 8);
  ExpectInvalid(r, "divisible");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_k()->set_dtype(attention::v1::FLOAT32);
  r.mutable_k()->mutable_data()->resize(r.k().data().size() * 2);
  ExpectInvalid(r, "k.dtype: expected q's dtype bfloat16");
  // Named as a dtype mismatch even when the bytes fit the (wrong) dtype of q instead.
  r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_v()->set_dtype(attention::v1::FLOAT16);
  r.mutable_v()->mutable_data()->resize(r.v().data().size() * 2);
  ExpectInvalid(r, "v.dtype: expected q's dtype bfloat16, got float16");

  r = Padded(2, 4, 4, 2, 2, 8);
  r.clear_k();
  Fill(r.mutable_k(), attention::v1::BFLOAT16, {3, 4, 2, 8});
  ExpectInvalid(r, "k.shape[0] (batch, must equal q's): expected 2, got 3");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_q()->set_shape(0, -1);
  ExpectInvalid(r, "q.shape[0]: expected >= 1");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.add_q_lengths(5);
  ExpectInvalid(r, "q_lengths[0]: expected in [0, T=4], got 5");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_mask()->set_window_left(-2);
  ExpectInvalid(r, "mask.window_left");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_mask()->set_causal(static_cast<attention::v1::CausalAlignment>(9));
  ExpectInvalid(r, "mask.causal");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.set_scale(std::nanf(""));
  ExpectInvalid(r, "scale");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.set_layout(static_cast<attention::v1::Layout>(5));
  ExpectInvalid(r, "layout");

  r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_q()->set_dtype(attention::v1::FLOAT8_E4M3);
  r.mutable_q()->mutable_data()->resize(64);
  ExpectInvalid(r, "q.scale");

  r.Clear();
  r.set_layout(attention::v1::LAYOUT_VARLEN);
  Fill(r.mutable_q(), attention::v1::FLOAT16, {5, 4, 32});
  Fill(r.mutable_k(), attention::v1::FLOAT16, {9, 1, 32});
  Fill(r.mutable_v(), attention::v1::FLOAT16, {9, 1, 32});
  ExpectInvalid(r, "q_lengths: required");
  r.add_q_lengths(5);
  r.add_kv_lengths(8);
  ExpectInvalid(r, "sum(kv_lengths)");
}

TEST(AttendValidator, OverflowingShapeIsRejectedNotWrapped) {
  AttendRequest r = Padded(1, 4, 4, 2, 2, 8);
  r.mutable_q()->set_shape(1, int64_t{1} << 40);
  r.mutable_q()->set_shape(3, int64_t{1} << 40);
  ExpectInvalid(r, "too many elements");
}

}  // namespace
}  // namespace attn
