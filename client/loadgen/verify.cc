#include "loadgen/verify.h"

#include <cmath>
#include <limits>

#include "loadgen/dtype_codec.h"
#include "loadgen/oracle.h"

namespace attn::loadgen {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Comparison Fail(const std::string& detail) {
  Comparison c;
  c.pass = false;
  c.rel_error = kInf;
  c.worst_row_rel_error = kInf;
  c.detail = detail;
  return c;
}

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string s = "(";
  for (int i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + ")";
}

bool ShapeIs(const attention::v1::Tensor& t, const std::vector<int64_t>& expected) {
  if (t.shape_size() != static_cast<int>(expected.size())) return false;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (t.shape(static_cast<int>(i)) != expected[i]) return false;
  }
  return true;
}

}  // namespace

double ToleranceFor(attention::v1::DType dtype) {
  switch (dtype) {
    case attention::v1::FLOAT32:
      return 1e-5;
    case attention::v1::FLOAT16:
      return 2e-3;
    case attention::v1::BFLOAT16:
      return 1e-2;
    case attention::v1::FLOAT8_E4M3:
      return 6e-2;
    default:
      return 0;
  }
}

Comparison CompareOutputs(const std::vector<double>& out, const std::vector<double>& ref,
                          int64_t row_len, double tol) {
  if (out.size() != ref.size()) {
    return Fail("size " + std::to_string(out.size()) + " != reference " +
                std::to_string(ref.size()));
  }
  Comparison c;
  double diff_sq = 0, ref_sq = 0;
  const int64_t rows = row_len > 0 ? static_cast<int64_t>(out.size()) / row_len : 0;
  for (int64_t r = 0; r < rows; ++r) {
    double row_diff_sq = 0, row_ref_sq = 0;
    bool finite = true;
    for (int64_t h = 0; h < row_len; ++h) {
      const size_t idx = static_cast<size_t>(r * row_len + h);
      if (!std::isfinite(out[idx])) finite = false;
      const double d = out[idx] - ref[idx];
      row_diff_sq += d * d;
      row_ref_sq += ref[idx] * ref[idx];
    }
    diff_sq += row_diff_sq;
    ref_sq += row_ref_sq;
    double row_error;
    std::string reason;
    if (!finite) {
      row_error = kInf;
      reason = "NaN or inf in output row " + std::to_string(r);
    } else if (row_ref_sq == 0) {
      row_error = row_diff_sq == 0 ? 0 : kInf;
      if (row_diff_sq != 0) reason = "masked row " + std::to_string(r) + " is not zero";
    } else {
      row_error = std::sqrt(row_diff_sq / row_ref_sq);
      if (row_error > 5 * tol) {
        reason = "row " + std::to_string(r) + " relative error " + std::to_string(row_error) +
                 " > 5 x " + std::to_string(tol);
      }
    }
    if (row_error > c.worst_row_rel_error || std::isnan(row_error))
      c.worst_row_rel_error = row_error;
    if (!reason.empty()) {
      ++c.bad_rows;
      if (c.detail.empty()) c.detail = reason;
    }
  }
  if (c.worst_row_rel_error == kInf) {
    c.rel_error = kInf;
  } else if (ref_sq == 0) {
    c.rel_error = diff_sq == 0 ? 0 : kInf;
  } else {
    c.rel_error = std::sqrt(diff_sq / ref_sq);
  }
  if (c.rel_error > tol && c.detail.empty()) {
    c.detail = "relative error " + std::to_string(c.rel_error) + " > " + std::to_string(tol);
  }
  c.pass = c.detail.empty();
  return c;
}

Comparison CompareLse(const std::vector<double>& lse, const std::vector<double>& ref,
                      double abs_tol) {
  if (lse.size() != ref.size()) {
    return Fail("lse size " + std::to_string(lse.size()) + " != reference " +
                std::to_string(ref.size()));
  }
  Comparison c;
  for (size_t i = 0; i < lse.size(); ++i) {
    double err;
    if (std::isnan(lse[i])) {
      err = kInf;
    } else if (std::isinf(ref[i]) || std::isinf(lse[i])) {
      err = lse[i] == ref[i] ? 0 : kInf;
    } else {
      err = std::fabs(lse[i] - ref[i]);
    }
    c.rel_error = std::max(c.rel_error, err);
    if (err > abs_tol) {
      ++c.bad_rows;
      if (c.detail.empty()) {
        c.detail = "lse[" + std::to_string(i) + "] = " + std::to_string(lse[i]) + ", reference " +
                   std::to_string(ref[i]);
      }
    }
  }
  c.worst_row_rel_error = c.rel_error;
  c.pass = c.detail.empty();
  return c;
}

double ResolveTolerance(double requested, attention::v1::DType dtype) {
  return requested > 0 ? requested : ToleranceFor(dtype);
}

Comparison VerifyAttend(const attention::v1::AttendRequest& request,
                        const attention::v1::AttendResponse& response, double tolerance) {
  if (request.layout() != attention::v1::LAYOUT_PADDED) return Fail("only PADDED is verified");
  const auto& qt = request.q();
  const auto& kt = request.k();
  if (qt.shape_size() != 4 || kt.shape_size() != 4) return Fail("request q/k are not rank 4");
  OracleProblem p;
  p.batch = qt.shape(0);
  p.q_len = qt.shape(1);
  p.heads = qt.shape(2);
  p.head_dim = qt.shape(3);
  p.kv_len = kt.shape(1);
  p.kv_heads = kt.shape(2);
  if (p.kv_heads <= 0 || p.heads % p.kv_heads != 0) return Fail("request has N % K != 0");
  switch (request.mask().causal()) {
    case attention::v1::CAUSAL_TOP_LEFT:
      p.causal = Causal::kTopLeft;
      break;
    case attention::v1::CAUSAL_BOTTOM_RIGHT:
      p.causal = Causal::kBottomRight;
      break;
    default:
      p.causal = Causal::kNone;
      break;
  }
  if (request.mask().has_window_left()) p.window_left = request.mask().window_left();
  if (request.mask().has_window_right()) p.window_right = request.mask().window_right();
  p.q_lengths.assign(request.q_lengths().begin(), request.q_lengths().end());
  p.kv_lengths.assign(request.kv_lengths().begin(), request.kv_lengths().end());
  if (request.has_scale()) p.scale = request.scale();

  std::vector<double> q, k, v;
  if (!DecodeValues(qt.data(), qt.dtype(), &q) || !DecodeValues(kt.data(), kt.dtype(), &k) ||
      !DecodeValues(request.v().data(), request.v().dtype(), &v)) {
    return Fail("cannot decode request tensors");
  }
  const auto& ot = response.o();
  const std::vector<int64_t> o_shape = {p.batch, p.q_len, p.heads, p.head_dim};
  if (ot.dtype() != qt.dtype()) {
    return Fail("o dtype " + DTypeName(ot.dtype()) + ", expected " + DTypeName(qt.dtype()));
  }
  if (!ShapeIs(ot, o_shape))
    return Fail("o shape " + ShapeString(ot.shape()) + ", expected " + ShapeString(qt.shape()));
  std::vector<double> o;
  if (!DecodeValues(ot.data(), ot.dtype(), &o) || o.size() != q.size()) {
    return Fail("o holds " + std::to_string(ot.data().size()) + " bytes, expected " +
                std::to_string(q.size() * DTypeSize(qt.dtype())));
  }
  std::vector<double> ref_o, ref_lse;
  ReferenceAttention(p, q, k, v, &ref_o, &ref_lse);
  Comparison c = CompareOutputs(o, ref_o, p.head_dim, ResolveTolerance(tolerance, qt.dtype()));
  if (request.return_lse()) {
    const auto& lt = response.lse();
    std::vector<double> lse;
    if (lt.dtype() != attention::v1::FLOAT32 || !ShapeIs(lt, {p.batch, p.heads, p.q_len}) ||
        !DecodeValues(lt.data(), lt.dtype(), &lse) || lse.size() != ref_lse.size()) {
      c.pass = false;
      if (c.detail.empty()) c.detail = "lse missing or not float32 (B,N,T)";
    } else {
      const Comparison l = CompareLse(lse, ref_lse, kLseTolerance);
      if (!l.pass) {
        c.pass = false;
        if (c.detail.empty()) c.detail = l.detail;
      }
    }
  }
  return c;
}

}  // namespace attn::loadgen
