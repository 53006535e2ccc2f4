#include "validation/attend_validator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/client_text.h"

namespace attn {
namespace {

using attention::v1::AttendRequest;
using attention::v1::Tensor;
using kernels::DType;

// The shape as the client sent it; long shapes are cut (common/client_text.h).
std::string ShapeString(const Tensor& t) {
  return EchoList(t.shape_size(), [&t](int64_t i) { return t.shape(static_cast<int>(i)); });
}

// Element count with overflow detection (caps at 2^62).
StatusOr<int64_t> Elements(const Tensor& t, const std::string& field) {
  int64_t n = 1;
  for (int i = 0; i < t.shape_size(); ++i) {
    const int64_t d = t.shape(i);
    if (d < 0) {
      return InvalidArgument(field + ".shape[" + std::to_string(i) + "]: expected >= 1, got " +
                             std::to_string(d));
    }
    if (d == 0) {
      return InvalidArgument(field + ": empty tensor (shape " + ShapeString(t) +
                             "); every extent must be >= 1");
    }
    if (n > (int64_t{1} << 62) / d) {
      return InvalidArgument(field + ": shape " + ShapeString(t) + " has too many elements");
    }
    n *= d;
  }
  return n;
}

Status CheckTensor(const Tensor& t, const std::string& field, int rank, DType* dtype_out) {
  if (t.shape_size() != rank) {
    return InvalidArgument(field + ": expected rank " + std::to_string(rank) + ", got rank " +
                           std::to_string(t.shape_size()) + " (shape " + ShapeString(t) + ")");
  }
  auto dt = DTypeFromProto(t.dtype(), field + ".dtype");
  if (!dt.ok()) return dt.status();
  auto n = Elements(t, field);
  if (!n.ok()) return n.status();
  // Bytes must not wrap: 2^62 fp32 elements would otherwise "need" 0 bytes (found by tests/fuzz).
  if (*n > (int64_t{1} << 62) / kernels::DTypeSize(*dt)) {
    return InvalidArgument(field + ": shape " + ShapeString(t) + " has too many bytes");
  }
  const uint64_t expected = static_cast<uint64_t>(*n) * kernels::DTypeSize(*dt);
  if (t.data().size() != expected) {
    return InvalidArgument(field + ".data: expected " + std::to_string(expected) +
                           " bytes for shape " + ShapeString(t) + " of " + kernels::DTypeName(*dt) +
                           ", got " + std::to_string(t.data().size()));
  }
  if (*dt == DType::kFloat8E4M3 && !(t.scale() > 0.f && std::isfinite(t.scale()))) {
    return InvalidArgument(field + ".scale: FLOAT8_E4M3 needs a finite scale > 0, got " +
                           EchoFloat(t.scale()));
  }
  *dtype_out = *dt;
  return Status::Ok();
}

Status Mismatch(const std::string& what, int64_t expected, int64_t got) {
  return InvalidArgument(what + ": expected " + std::to_string(expected) + ", got " +
                         std::to_string(got));
}

// q, k and v: rank, dtype, bytes, and their agreement (head_dim, batch, v's shape equal to
// k's, heads divisible by kv heads); the head limits. Sets the shape's dtype and head counts.
Status CheckTensorsAndHeads(const AttendRequest& r, const ValidationLimits& limits, int rank,
                            kernels::AttentionShape* shape) {
  kernels::AttentionShape& s = *shape;
  const bool varlen = rank == 3;
  DType qd, kd, vd;
  ATTN_RETURN_IF_ERROR(CheckTensor(r.q(), "q", rank, &qd));
  // Mixed dtypes are named as such before k's or v's byte-size check (which would blame the
  // size).
  for (const auto& [t, name] : {std::pair{&r.k(), "k"}, std::pair{&r.v(), "v"}}) {
    auto got = DTypeFromProto(t->dtype(), std::string(name) + ".dtype");
    if (got.ok() && *got != qd) {
      return InvalidArgument(std::string(name) + ".dtype: expected q's dtype " +
                             kernels::DTypeName(qd) + ", got " + kernels::DTypeName(*got));
    }
  }
  ATTN_RETURN_IF_ERROR(CheckTensor(r.k(), "k", rank, &kd));
  ATTN_RETURN_IF_ERROR(CheckTensor(r.v(), "v", rank, &vd));
  s.dtype = qd;
  const auto& q = r.q().shape();
  const auto& k = r.k().shape();
  s.num_heads = q[rank - 2];
  s.head_dim = q[rank - 1];
  s.num_kv_heads = k[rank - 2];
  if (k[rank - 1] != s.head_dim) {
    return Mismatch("k.shape[" + std::to_string(rank - 1) + "] (head_dim, must equal q's)",
                    s.head_dim, k[rank - 1]);
  }
  if (!varlen && k[0] != q[0]) {
    return Mismatch("k.shape[0] (batch, must equal q's)", q[0], k[0]);
  }
  for (int i = 0; i < rank; ++i) {
    if (r.v().shape(i) != r.k().shape(i)) {
      return InvalidArgument("v.shape: expected k's shape " + ShapeString(r.k()) + ", got " +
                             ShapeString(r.v()));
    }
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument(
        "num_heads (q.shape[" + std::to_string(rank - 2) + "] = " + std::to_string(s.num_heads) +
        ") must be divisible by num_kv_heads " + "(k.shape[" + std::to_string(rank - 2) +
        "] = " + std::to_string(s.num_kv_heads) + ")");
  }
  if (s.head_dim > limits.max_head_dim) {
    return InvalidArgument("q.shape[" + std::to_string(rank - 1) +
                           "] (head_dim): expected <= " + std::to_string(limits.max_head_dim) +
                           ", got " + std::to_string(s.head_dim));
  }
  if (s.num_heads > limits.max_heads) {
    return InvalidArgument("q.shape[" + std::to_string(rank - 2) +
                           "] (num_heads): expected <= " + std::to_string(limits.max_heads) +
                           ", got " + std::to_string(s.num_heads));
  }
  return Status::Ok();
}

// LAYOUT_PADDED: batch, T and S from the shapes; optional per-entry lengths within them.
Status CheckPaddedLengths(const AttendRequest& r, const ValidationLimits& limits,
                          ValidatedAttend* validated) {
  ValidatedAttend& out = *validated;
  kernels::AttentionShape& s = out.shape;
  const auto& q = r.q().shape();
  const auto& k = r.k().shape();
  const int nq = r.q_lengths_size();
  const int nkv = r.kv_lengths_size();
  s.batch = q[0];
  s.max_q_len = q[1];
  s.max_kv_len = k[1];
  if (k[0] != s.batch) return Mismatch("k.shape[0] (batch, must equal q's)", s.batch, k[0]);
  if (s.batch > limits.max_batch) {
    return InvalidArgument("batch: expected <= " + std::to_string(limits.max_batch) + ", got " +
                           std::to_string(s.batch));
  }
  if (s.max_q_len > limits.max_tokens || s.max_kv_len > limits.max_tokens) {
    return InvalidArgument("T and S: expected <= " + std::to_string(limits.max_tokens) +
                           ", got T=" + std::to_string(s.max_q_len) +
                           " S=" + std::to_string(s.max_kv_len));
  }
  if (nq != 0 && nq != s.batch)
    return Mismatch("q_lengths (entries, must equal the batch)", s.batch, nq);
  if (nkv != 0 && nkv != s.batch) {
    return Mismatch("kv_lengths (entries, must equal the batch)", s.batch, nkv);
  }
  for (int b = 0; b < nq; ++b) {
    if (r.q_lengths(b) < 0 || r.q_lengths(b) > s.max_q_len) {
      return InvalidArgument("q_lengths[" + std::to_string(b) +
                             "]: expected in [0, T=" + std::to_string(s.max_q_len) + "], got " +
                             std::to_string(r.q_lengths(b)));
    }
  }
  for (int b = 0; b < nkv; ++b) {
    if (r.kv_lengths(b) < 0 || r.kv_lengths(b) > s.max_kv_len) {
      return InvalidArgument("kv_lengths[" + std::to_string(b) +
                             "]: expected in [0, S=" + std::to_string(s.max_kv_len) + "], got " +
                             std::to_string(r.kv_lengths(b)));
    }
  }
  s.has_lengths = nq > 0 || nkv > 0;
  if (s.has_lengths) {
    out.q_lengths.assign(s.batch, static_cast<int32_t>(s.max_q_len));
    out.kv_lengths.assign(s.batch, static_cast<int32_t>(s.max_kv_len));
    for (int b = 0; b < nq; ++b) out.q_lengths[b] = r.q_lengths(b);
    for (int b = 0; b < nkv; ++b) out.kv_lengths[b] = r.kv_lengths(b);
  }
  return Status::Ok();
}

// LAYOUT_VARLEN: the required lengths, their offsets, and their sums against total_q/total_kv.
Status CheckVarlenLengths(const AttendRequest& r, const ValidationLimits& limits,
                          ValidatedAttend* validated) {
  ValidatedAttend& out = *validated;
  kernels::AttentionShape& s = out.shape;
  const auto& q = r.q().shape();
  const auto& k = r.k().shape();
  const int nq = r.q_lengths_size();
  const int nkv = r.kv_lengths_size();
  s.total_q = q[0];
  s.total_kv = k[0];
  if (nq == 0) return InvalidArgument("q_lengths: required for LAYOUT_VARLEN, got none");
  if (nkv != nq) return Mismatch("kv_lengths (entries, must equal q_lengths')", nq, nkv);
  s.batch = nq;
  if (s.batch > limits.max_batch) {
    return InvalidArgument("batch: expected <= " + std::to_string(limits.max_batch) + ", got " +
                           std::to_string(s.batch));
  }
  out.q_lengths.resize(nq);
  out.kv_lengths.resize(nq);
  out.q_offsets.assign(nq + 1, 0);
  out.kv_offsets.assign(nq + 1, 0);
  for (int b = 0; b < nq; ++b) {
    if (r.q_lengths(b) < 0) {
      return InvalidArgument("q_lengths[" + std::to_string(b) + "]: expected >= 0, got " +
                             std::to_string(r.q_lengths(b)));
    }
    if (r.kv_lengths(b) < 0) {
      return InvalidArgument("kv_lengths[" + std::to_string(b) + "]: expected >= 0, got " +
                             std::to_string(r.kv_lengths(b)));
    }
    out.q_lengths[b] = r.q_lengths(b);
    out.kv_lengths[b] = r.kv_lengths(b);
    out.q_offsets[b + 1] = out.q_offsets[b] + r.q_lengths(b);
    out.kv_offsets[b + 1] = out.kv_offsets[b] + r.kv_lengths(b);
    s.max_q_len = std::max<int64_t>(s.max_q_len, r.q_lengths(b));
    s.max_kv_len = std::max<int64_t>(s.max_kv_len, r.kv_lengths(b));
  }
  if (out.q_offsets[nq] != s.total_q) {
    return Mismatch("sum(q_lengths) (must equal q.shape[0], total_q)", s.total_q,
                    out.q_offsets[nq]);
  }
  if (out.kv_offsets[nq] != s.total_kv) {
    return Mismatch("sum(kv_lengths) (must equal k.shape[0], total_kv)", s.total_kv,
                    out.kv_offsets[nq]);
  }
  if (s.total_q > limits.max_tokens || s.total_kv > limits.max_tokens) {
    return InvalidArgument("total_q and total_kv: expected <= " +
                           std::to_string(limits.max_tokens));
  }
  s.has_lengths = true;
  return Status::Ok();
}

// The mask (causal alignment, windows; normalised against the token limit) and the scale.
/// AttendRequest.fp8's formats into `o`. FLOAT8_E4M3 inputs are per-tensor E4M3 already, so
/// they refuse INT8 Q·Kᵀ and 16-bit P·V; 16-bit P·V exists only with INT8 Q·Kᵀ.
Status ParseFp8Formats(const attention::v1::Fp8Options& f, DType dtype, kernels::Fp8Options* o) {
  using F = attention::v1::Fp8Options;
  switch (f.qk_format()) {
    case F::QK_FORMAT_UNSPECIFIED: o->qk = kernels::Fp8QkFormat::kAuto; break;
    case F::QK_E4M3_PER_TENSOR: o->qk = kernels::Fp8QkFormat::kE4M3PerTensor; break;
    case F::QK_INT8_PER_TOKEN: o->qk = kernels::Fp8QkFormat::kInt8PerToken; break;
    default:
      return InvalidArgument("fp8.qk_format: unknown value " + std::to_string(f.qk_format()));
  }
  switch (f.pv_format()) {
    case F::PV_FORMAT_UNSPECIFIED: o->pv = kernels::Fp8PvFormat::kAuto; break;
    case F::PV_E4M3: o->pv = kernels::Fp8PvFormat::kE4M3; break;
    case F::PV_16BIT: o->pv = kernels::Fp8PvFormat::k16Bit; break;
    default:
      return InvalidArgument("fp8.pv_format: unknown value " + std::to_string(f.pv_format()));
  }
  if (dtype == DType::kFloat8E4M3 &&
      (o->qk == kernels::Fp8QkFormat::kInt8PerToken || o->pv == kernels::Fp8PvFormat::k16Bit)) {
    return InvalidArgument(
        "fp8: FLOAT8_E4M3 inputs are per-tensor E4M3 already; qk_format QK_INT8_PER_TOKEN and "
        "pv_format PV_16BIT need float16 or bfloat16 inputs");
  }
  if (o->pv == kernels::Fp8PvFormat::k16Bit && o->qk == kernels::Fp8QkFormat::kE4M3PerTensor) {
    return InvalidArgument(
        "fp8: pv_format PV_16BIT needs qk_format QK_INT8_PER_TOKEN (or unset); no kernel pairs "
        "per-tensor E4M3 Q·Kᵀ with 16-bit P·V");
  }
  return Status::Ok();
}

Status CheckMaskAndScale(const AttendRequest& r, const ValidationLimits& limits,
                         kernels::AttentionShape* shape) {
  kernels::AttentionShape& s = *shape;
  const auto& m = r.mask();
  switch (m.causal()) {
    case attention::v1::CAUSAL_NONE:
      s.mask.causal = kernels::CausalAlignment::kNone;
      break;
    case attention::v1::CAUSAL_TOP_LEFT:
      s.mask.causal = kernels::CausalAlignment::kTopLeft;
      break;
    case attention::v1::CAUSAL_BOTTOM_RIGHT:
      s.mask.causal = kernels::CausalAlignment::kBottomRight;
      break;
    default:
      return InvalidArgument(
          "mask.causal: expected CAUSAL_NONE, CAUSAL_TOP_LEFT or "
          "CAUSAL_BOTTOM_RIGHT, got " +
          std::to_string(m.causal()));
  }
  if (m.has_window_left()) {
    if (m.window_left() < 0) {
      return InvalidArgument("mask.window_left: expected >= 0, got " +
                             std::to_string(m.window_left()));
    }
    s.mask.window_left = m.window_left();
  }
  if (m.has_window_right()) {
    if (m.window_right() < 0) {
      return InvalidArgument("mask.window_right: expected >= 0, got " +
                             std::to_string(m.window_right()));
    }
    if (s.mask.causal != kernels::CausalAlignment::kNone && m.window_right() != 0) {
      return InvalidArgument(
          "mask.window_right: expected unset or 0 with a causal alignment, got " +
          std::to_string(m.window_right()));
    }
    s.mask.window_right = m.window_right();
  }
  // A window of 2 * max_tokens or more (>= T + S of every request this validator accepts)
  // keeps every key: it becomes unbounded here, the one place before any backend, so no
  // window reaches a kernel or library wider than any problem (the mask arithmetic, diagonal
  // ± window, cannot overflow: found by tests/fuzz; cuDNN's band bounds are int32: 2^32
  // narrowed to 0 and 2^31 to a negative bound, issue 14). The bound is the limit's, not this
  // request's T + S, so requests with the same window keep one batching signature whatever
  // their lengths (attend_coalescer.h); with the default 2^24 every remaining window < 2^25.
  s.mask = kernels::NormalizeMask(s.mask, limits.max_tokens, limits.max_tokens);
  if (r.has_scale()) {
    if (!(std::isfinite(r.scale()) && r.scale() > 0.f)) {
      return InvalidArgument("scale: expected finite and > 0, got " + EchoFloat(r.scale()));
    }
    s.scale = r.scale();
  } else {
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  }
  // fp8 options (unset: on) and, for FLOAT8_E4M3 inputs, the per-tensor descales (CheckTensor
  // has checked them finite and > 0).
  s.fp8.rotate = !r.fp8().has_rotate() || r.fp8().rotate();
  s.fp8.smooth_k = !r.fp8().has_smooth_k() || r.fp8().smooth_k();
  ATTN_RETURN_IF_ERROR(ParseFp8Formats(r.fp8(), s.dtype, &s.fp8));
  if (s.dtype == DType::kFloat8E4M3) {
    s.fp8.q_descale = r.q().scale();
    s.fp8.k_descale = r.k().scale();
    s.fp8.v_descale = r.v().scale();
  }
  return Status::Ok();
}

// The validated call's data pointers, output shapes, and its work: FLOPs, score pairs, tokens.
void FillOutputsAndWork(const AttendRequest& r, bool varlen, ValidatedAttend* validated) {
  ValidatedAttend& out = *validated;
  const kernels::AttentionShape& s = out.shape;
  out.q = r.q().data().data();
  out.k = r.k().data().data();
  out.v = r.v().data().data();
  out.o_bytes = static_cast<uint64_t>(s.q_elements()) * kernels::DTypeSize(s.dtype);
  out.o_shape.assign(r.q().shape().begin(), r.q().shape().end());
  if (varlen) {
    out.lse_shape = {s.num_heads, s.total_q};
  } else {
    out.lse_shape = {s.batch, s.num_heads, s.max_q_len};
  }
  // FLOPs: 4·Σ_b T_b·S_b·N·H, halved for causal masks (DESIGN.md §10).
  const double causal_share = s.mask.causal == kernels::CausalAlignment::kNone ? 1.0 : 0.5;
  // A band narrower than S caps the keys per row at window_left + window_right + 1.
  const bool banded = s.mask.window_left >= 0 && (s.mask.window_right >= 0 ||
                                                  s.mask.causal != kernels::CausalAlignment::kNone);
  const double band = banded ? static_cast<double>(s.mask.window_left) +
                                   std::max<int64_t>(s.mask.window_right, 0) + 1
                             : 0;
  double pairs = 0;
  double visited = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    const double tb = out.q_lengths.empty() ? s.max_q_len : out.q_lengths[b];
    const double sb = out.kv_lengths.empty() ? s.max_kv_len : out.kv_lengths[b];
    pairs += tb * sb;
    visited += banded ? std::min(tb * sb * causal_share, tb * band) : tb * sb * causal_share;
    out.query_tokens += static_cast<int64_t>(tb);
  }
  out.flops = 4.0 * pairs * s.num_heads * s.head_dim * causal_share;
  out.score_pairs = visited * s.num_heads;
}

}  // namespace

StatusOr<DType> DTypeFromProto(int dtype, const std::string& field) {
  switch (dtype) {
    case attention::v1::FLOAT32:
      return DType::kFloat32;
    case attention::v1::FLOAT16:
      return DType::kFloat16;
    case attention::v1::BFLOAT16:
      return DType::kBFloat16;
    case attention::v1::FLOAT8_E4M3:
      return DType::kFloat8E4M3;
    default:
      return InvalidArgument(field +
                             ": expected one of FLOAT32, FLOAT16, BFLOAT16, "
                             "FLOAT8_E4M3, got " +
                             std::to_string(dtype) +
                             (dtype == 0 ? " (DTYPE_UNSPECIFIED)" : " (unknown)"));
  }
}

attention::v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return attention::v1::FLOAT32;
    case DType::kFloat16:
      return attention::v1::FLOAT16;
    case DType::kBFloat16:
      return attention::v1::BFLOAT16;
    case DType::kFloat8E4M3:
      return attention::v1::FLOAT8_E4M3;
  }
  return attention::v1::DTYPE_UNSPECIFIED;
}

StatusOr<ValidatedAttend> ValidateAttend(const AttendRequest& r, const ValidationLimits& limits) {
  ValidatedAttend out;
  kernels::AttentionShape& s = out.shape;
  if (r.layout() != attention::v1::LAYOUT_PADDED && r.layout() != attention::v1::LAYOUT_VARLEN) {
    return InvalidArgument("layout: expected LAYOUT_PADDED or LAYOUT_VARLEN, got " +
                           std::to_string(r.layout()));
  }
  const bool varlen = r.layout() == attention::v1::LAYOUT_VARLEN;
  s.layout = varlen ? kernels::Layout::kVarlen : kernels::Layout::kPadded;
  ATTN_RETURN_IF_ERROR(CheckTensorsAndHeads(r, limits, varlen ? 3 : 4, &s));
  ATTN_RETURN_IF_ERROR(varlen ? CheckVarlenLengths(r, limits, &out)
                              : CheckPaddedLengths(r, limits, &out));
  ATTN_RETURN_IF_ERROR(CheckMaskAndScale(r, limits, &s));
  s.return_lse = r.return_lse();
  FillOutputsAndWork(r, varlen, &out);
  return out;
}

kernels::AttentionTensors ValidatedAttend::Tensors(void* o, float* lse) const {
  kernels::AttentionTensors t;
  t.q = q;
  t.k = k;
  t.v = v;
  t.o = o;
  t.lse = lse;
  if (!q_lengths.empty()) {
    t.q_lengths = q_lengths.data();
    t.kv_lengths = kv_lengths.data();
  }
  if (!q_offsets.empty()) {
    t.q_offsets = q_offsets.data();
    t.kv_offsets = kv_offsets.data();
  }
  return t;
}

}  // namespace attn
