#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "loadgen/dtype_codec.h"
#include "loadgen/oracle.h"
#include "loadgen/random_normal.h"
#include "loadgen/verify.h"
#include "loadgen/workload.h"

namespace attn::loadgen {
namespace {

std::vector<double> Random(int64_t n, uint64_t seed) {
  std::vector<float> f(static_cast<size_t>(n));
  NormalGenerator(seed).Fill(f.data(), n);
  return std::vector<double>(f.begin(), f.end());
}

TEST(ClientVerify, MetricAcceptsSmallNoiseAndCatchesFivePercent) {
  const auto ref = Random(64 * 32, 1);
  const auto noise = Random(64 * 32, 2);
  std::vector<double> close(ref), off(ref);
  for (size_t i = 0; i < ref.size(); ++i) {
    close[i] += 1e-3 * noise[i];
    off[i] *= 1.05;  // 5% perturbation
  }
  const Comparison ok = CompareOutputs(close, ref, 32, 1e-2);
  EXPECT_TRUE(ok.pass) << ok.detail;
  EXPECT_NEAR(ok.rel_error, 1e-3, 3e-4);
  const Comparison bad = CompareOutputs(off, ref, 32, 1e-2);
  EXPECT_FALSE(bad.pass);
  EXPECT_NEAR(bad.rel_error, 0.05, 1e-9);
  EXPECT_EQ(CompareOutputs(ref, ref, 32, 1e-5).rel_error, 0.0);
}

TEST(ClientVerify, OneBadRowFailsEvenWhenTheTotalPasses) {
  const auto ref = Random(100 * 16, 1);
  std::vector<double> out(ref);
  for (int h = 0; h < 16; ++h) out[50 * 16 + h] *= 1.08;  // row 50 off by 8% > 5 x 1e-2
  const Comparison c = CompareOutputs(out, ref, 16, 1e-2);
  EXPECT_LT(c.rel_error, 1e-2);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.bad_rows, 1);
  EXPECT_NEAR(c.worst_row_rel_error, 0.08, 1e-9);
}

TEST(ClientVerify, NanAndNonzeroMaskedRowsFail) {
  std::vector<double> ref = Random(4 * 8, 1);
  for (int h = 0; h < 8; ++h) ref[8 + h] = 0;  // row 1 masked
  std::vector<double> out(ref);
  EXPECT_TRUE(CompareOutputs(out, ref, 8, 1e-5).pass);
  out[8] = 1e-30;
  EXPECT_FALSE(CompareOutputs(out, ref, 8, 1e-2).pass);
  out = ref;
  out[0] = std::nan("");
  const Comparison c = CompareOutputs(out, ref, 8, 1e-2);
  EXPECT_FALSE(c.pass);
  EXPECT_TRUE(std::isinf(c.rel_error));
}

TEST(ClientVerify, LseWithinAbsoluteToleranceAndInfinitiesMatch) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> ref = {1.0, -inf, 2.0};
  EXPECT_TRUE(CompareLse({1.0005, -inf, 2.0}, ref, 1e-3).pass);
  EXPECT_FALSE(CompareLse({1.002, -inf, 2.0}, ref, 1e-3).pass);
  EXPECT_FALSE(CompareLse({1.0, 0.0, 2.0}, ref, 1e-3).pass);
  EXPECT_FALSE(CompareLse({1.0, -inf, std::nan("")}, ref, 1e-3).pass);
}

// Builds a response whose o is the oracle output (times `factor`) encoded in the request dtype.
attention::v1::AttendResponse OracleResponse(const attention::v1::AttendRequest& request,
                                             double factor) {
  OracleProblem p;
  p.q_len = request.q().shape(1);
  p.kv_len = request.k().shape(1);
  p.heads = request.q().shape(2);
  p.kv_heads = request.k().shape(2);
  p.head_dim = request.q().shape(3);
  p.causal = Causal::kBottomRight;
  std::vector<double> q, k, v, o, lse;
  DecodeValues(request.q().data(), request.q().dtype(), &q);
  DecodeValues(request.k().data(), request.k().dtype(), &k);
  DecodeValues(request.v().data(), request.v().dtype(), &v);
  ReferenceAttention(p, q, k, v, &o, &lse);
  std::vector<float> of(o.begin(), o.end()), lf(lse.begin(), lse.end());
  for (float& x : of) x = static_cast<float>(x * factor);
  attention::v1::AttendResponse response;
  auto* ot = response.mutable_o();
  ot->set_dtype(request.q().dtype());
  for (int64_t e : request.q().shape()) ot->add_shape(e);
  EncodeValues(of.data(), static_cast<int64_t>(of.size()), ot->dtype(), ot->mutable_data());
  auto* lt = response.mutable_lse();
  lt->set_dtype(attention::v1::FLOAT32);
  for (int64_t e : {p.batch, p.heads, p.q_len}) lt->add_shape(e);
  EncodeValues(lf.data(), static_cast<int64_t>(lf.size()), attention::v1::FLOAT32,
               lt->mutable_data());
  return response;
}

TEST(ClientVerify, VerifyAttendEndToEnd) {
  for (auto dtype : {attention::v1::FLOAT32, attention::v1::FLOAT16, attention::v1::BFLOAT16}) {
    ModelShape shape;
    shape.heads = 4;
    shape.kv_heads = 2;
    shape.head_dim = 16;
    shape.dtype = dtype;
    shape.return_lse = true;
    attention::v1::AttendRequest request;
    BuildAttendRequest(shape, 33, 5, &request);
    const Comparison good = VerifyAttend(request, OracleResponse(request, 1.0), 0);
    EXPECT_TRUE(good.pass) << DTypeName(dtype) << ": " << good.detail;
    const Comparison bad = VerifyAttend(request, OracleResponse(request, 1.05), 0);
    EXPECT_FALSE(bad.pass) << DTypeName(dtype);
    EXPECT_NEAR(bad.rel_error, 0.05, 0.01);

    auto wrong_shape = OracleResponse(request, 1.0);
    wrong_shape.mutable_o()->set_shape(1, 32);
    EXPECT_FALSE(VerifyAttend(request, wrong_shape, 0).pass);
    auto no_lse = OracleResponse(request, 1.0);
    no_lse.clear_lse();
    EXPECT_FALSE(VerifyAttend(request, no_lse, 0).pass);
  }
}

TEST(ClientVerify, ToleranceOverridesTheDtypeDefault) {
  EXPECT_EQ(ResolveTolerance(0, attention::v1::BFLOAT16), 1e-2);
  EXPECT_EQ(ResolveTolerance(0, attention::v1::FLOAT32), 1e-5);
  EXPECT_EQ(ResolveTolerance(0.06, attention::v1::BFLOAT16), 0.06);
  EXPECT_EQ(ResolveTolerance(1e-7, attention::v1::FLOAT32), 1e-7);
  // A bf16 output 5% off (as FP8 arithmetic leaves it): fails bf16's 1e-2, passes 0.06, fails
  // 0.04 (below its error); the lse check (1e-3 absolute) is not loosened by the tolerance.
  ModelShape shape;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  shape.dtype = attention::v1::BFLOAT16;
  attention::v1::AttendRequest request;
  BuildAttendRequest(shape, 33, 5, &request);
  const auto off = OracleResponse(request, 1.05);
  EXPECT_FALSE(VerifyAttend(request, off, 0).pass);
  const Comparison loose = VerifyAttend(request, off, 0.06);
  EXPECT_TRUE(loose.pass) << loose.detail;
  EXPECT_NEAR(loose.rel_error, 0.05, 0.01);
  EXPECT_FALSE(VerifyAttend(request, off, 0.04).pass);
  // The exact output fails a tolerance below its bf16 rounding error.
  const auto exact = OracleResponse(request, 1.0);
  const Comparison rounded = VerifyAttend(request, exact, 0);
  ASSERT_TRUE(rounded.pass) << rounded.detail;
  ASSERT_GT(rounded.rel_error, 0);
  EXPECT_FALSE(VerifyAttend(request, exact, rounded.rel_error / 2).pass);
  EXPECT_TRUE(VerifyAttend(request, exact, rounded.rel_error * 2).pass);
  request.set_return_lse(true);
  auto lse_off = OracleResponse(request, 1.0);
  std::vector<float> lse(static_cast<size_t>(lse_off.lse().data().size() / 4));
  std::memcpy(lse.data(), lse_off.lse().data().data(), lse_off.lse().data().size());
  lse[0] += 0.01f;
  lse_off.mutable_lse()->set_data(std::string(reinterpret_cast<const char*>(lse.data()),
                                              lse.size() * sizeof(float)));
  EXPECT_FALSE(VerifyAttend(request, lse_off, 0.5).pass);
}

}  // namespace
}  // namespace attn::loadgen
