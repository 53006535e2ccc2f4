#include "validation/sequence_validator.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/client_text.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using kernels::DType;

Status Range(const char *field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return InvalidArgument(std::string(field) + ": expected [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + std::to_string(v));
  }
  return Status::Ok();
}

/// Checks one rank-3 tensor's dtype and byte size; fills dtype and shape.
Status DecodeTensor(const pb::Tensor &t, const char *field, DType *dtype,
                    std::array<int64_t, 3> *shape) {
  if (t.shape_size() != 3) {
    return InvalidArgument(std::string(field) + ": expected rank 3, got rank " +
                           std::to_string(t.shape_size()));
  }
  auto dt = DTypeFromProto(t.dtype(), std::string(field) + ".dtype");
  if (!dt.ok()) return dt.status();
  int64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    const int64_t d = t.shape(i);
    if (d < 1 || d > kMaxExtendExtent) {
      return InvalidArgument(std::string(field) + ".shape[" + std::to_string(i) +
                             "]: expected [1, 2^24], got " + std::to_string(d));
    }
    (*shape)[i] = d;
    if (n > (int64_t{1} << 60) / d) {  // 2^24 cubed would overflow (found by tests/fuzz)
      return InvalidArgument(std::string(field) + ": shape has too many elements");
    }
    n *= d;
  }
  const uint64_t expected = static_cast<uint64_t>(n) * kernels::DTypeSize(*dt);
  if (t.data().size() != expected) {
    return InvalidArgument(std::string(field) + ".data: expected " + std::to_string(expected) +
                           " bytes, got " + std::to_string(t.data().size()));
  }
  *dtype = *dt;
  return Status::Ok();
}

/// Length of the valid UTF-8 character at s[i] (1..4), or 0 when the bytes there are not one
/// (stray continuation byte, overlong form, surrogate, above U+10FFFF, or cut short).
size_t Utf8CharLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // at most U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

/// How a sequence id is quoted in error messages (at most this many bytes of it).
constexpr size_t kIdEchoBytes = 64;

}  // namespace

std::string Utf8SafeEcho(std::string_view s, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8CharLength(s, i);
    const size_t add = n == 0 ? 4 : n;
    if (out.size() + add > max_bytes) {
      out += "... (" + std::to_string(s.size()) + " bytes)";
      return out;
    }
    if (n == 0) {
      const auto c = static_cast<unsigned char>(s[i]);
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      i += 1;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

Status ValidateSequenceId(const std::string &id) {
  if (id.size() != 32 || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return InvalidArgument("sequence_id: expected 32 lowercase hex digits, got \"" +
                           Utf8SafeEcho(id, kIdEchoBytes) + "\"");
  }
  return Status::Ok();
}

StatusOr<SequenceConfig> ValidateCreateSequence(const pb::CreateSequenceRequest &r) {
  SequenceConfig c;
  ATTN_RETURN_IF_ERROR(Range("num_layers", r.num_layers(), 1, kMaxSequenceLayers));
  ATTN_RETURN_IF_ERROR(Range("num_kv_heads", r.num_kv_heads(), 1, kMaxSequenceHeads));
  ATTN_RETURN_IF_ERROR(Range("head_dim", r.head_dim(), 1, kMaxSequenceHeadDim));
  ATTN_RETURN_IF_ERROR(Range("num_heads", r.num_heads(), 1, kMaxSequenceHeads));
  ATTN_RETURN_IF_ERROR(Range("reserve_tokens", r.reserve_tokens(), 0, kMaxReserveTokens));
  if (r.num_heads() % r.num_kv_heads() != 0) {
    return InvalidArgument("num_heads (" + std::to_string(r.num_heads()) +
                           ") must be a multiple of num_kv_heads (" +
                           std::to_string(r.num_kv_heads()) + ")");
  }
  auto dt = DTypeFromProto(r.dtype(), "dtype");
  if (!dt.ok()) return dt.status();
  if (*dt == DType::kFloat8E4M3) {
    return InvalidArgument(
        "dtype: expected FLOAT32, FLOAT16 or BFLOAT16, got FLOAT8_E4M3 "
        "(use kv_cache_dtype for FP8 storage)");
  }
  DType kv = *dt;
  if (r.kv_cache_dtype() != pb::DTYPE_UNSPECIFIED) {
    auto k = DTypeFromProto(r.kv_cache_dtype(), "kv_cache_dtype");
    if (!k.ok()) return k.status();
    if (*k != *dt && *k != DType::kFloat8E4M3) {
      return InvalidArgument(std::string("kv_cache_dtype: expected DTYPE_UNSPECIFIED, dtype (") +
                             kernels::DTypeName(*dt) + ") or FLOAT8_E4M3, got " +
                             kernels::DTypeName(*k));
    }
    kv = *k;
  }
  const int64_t n_scales = int64_t{r.num_layers()} * r.num_kv_heads();
  if (r.k_scales_size() > 0 || r.v_scales_size() > 0) {
    if (kv != DType::kFloat8E4M3) {
      return InvalidArgument("k_scales/v_scales: only for kv_cache_dtype FLOAT8_E4M3");
    }
    if (r.k_scales_size() != n_scales || r.v_scales_size() != n_scales) {
      return InvalidArgument(
          "k_scales/v_scales: expected num_layers * num_kv_heads = " + std::to_string(n_scales) +
          " each, got " + std::to_string(r.k_scales_size()) + " and " +
          std::to_string(r.v_scales_size()));
    }
    for (int i = 0; i < n_scales; ++i) {
      for (float s : {r.k_scales(i), r.v_scales(i)}) {
        if (!(s > 0.f) || !std::isfinite(s)) {
          return InvalidArgument("k_scales/v_scales[" + std::to_string(i) +
                                 "]: expected finite > 0, got " + EchoFloat(s));
        }
      }
    }
    c.k_scales.assign(r.k_scales().begin(), r.k_scales().end());
    c.v_scales.assign(r.v_scales().begin(), r.v_scales().end());
  }
  if (r.has_scale() && !(r.scale() > 0.f && std::isfinite(r.scale()))) {
    return InvalidArgument("scale: expected finite > 0, got " + EchoFloat(r.scale()));
  }
  c.num_layers = r.num_layers();
  c.num_kv_heads = r.num_kv_heads();
  c.head_dim = r.head_dim();
  c.num_heads = r.num_heads();
  c.dtype = *dt;
  c.kv_dtype = kv;
  c.reserve_tokens = r.reserve_tokens();
  c.scale = r.has_scale() ? r.scale() : static_cast<float>(1.0 / std::sqrt(double(r.head_dim())));
  return c;
}

StatusOr<ExtendArgs> ValidateExtend(const pb::ExtendRequest &r) {
  ATTN_RETURN_IF_ERROR(ValidateSequenceId(r.sequence_id()));
  ExtendArgs a;
  a.sequence_id = r.sequence_id();
  a.layer = r.layer();
  a.position = r.position();
  if (a.position < 0) {  // never a layer's length: a malformed request, not a stale one
    return InvalidArgument("position: expected >= 0 (the layer's current length), got " +
                           std::to_string(a.position));
  }
  if (r.append_only()) {
    if (r.has_q()) {
      return InvalidArgument("q: must be unset when append_only is set (nothing is attended)");
    }
  } else {
    if (!r.has_q()) {
      return InvalidArgument(
          "q: required (T, N, H) queries, got none (set append_only to append k/v without "
          "attending)");
    }
    ATTN_RETURN_IF_ERROR(DecodeTensor(r.q(), "q", &a.q_dtype, &a.q_shape));
  }
  ATTN_RETURN_IF_ERROR(DecodeTensor(r.k(), "k", &a.k_dtype, &a.k_shape));
  ATTN_RETURN_IF_ERROR(DecodeTensor(r.v(), "v", &a.v_dtype, &a.v_shape));
  if (r.append_only()) {
    if (a.k_shape[0] != a.v_shape[0]) {
      return InvalidArgument("k and v must have the same T: k " + std::to_string(a.k_shape[0]) +
                             ", v " + std::to_string(a.v_shape[0]));
    }
    SetAppendOnly(&a);
    a.k = r.k().data().data();
    a.v = r.v().data().data();
    a.k_bytes = r.k().data().size();
    a.v_bytes = r.v().data().size();
    return a;
  }
  if (a.k_shape[0] != a.v_shape[0] || a.k_shape[0] != a.q_shape[0]) {
    return InvalidArgument("k, v and q must have the same T: q " + std::to_string(a.q_shape[0]) +
                           ", k " + std::to_string(a.k_shape[0]) + ", v " +
                           std::to_string(a.v_shape[0]));
  }
  a.q = r.q().data().data();
  a.k = r.k().data().data();
  a.v = r.v().data().data();
  a.q_bytes = r.q().data().size();
  a.k_bytes = r.k().data().size();
  a.v_bytes = r.v().data().size();
  return a;
}

Status ValidateExtendBatch(const pb::ExtendBatchRequest &r) {
  if (r.has_packed()) {
    if (r.steps_size() > 0) {
      return InvalidArgument("steps and packed: expected one form of batch, got both");
    }
    return Status::Ok();  // checked whole by ValidatePackedExtendBatch
  }
  if (r.steps_size() == 0) {
    return InvalidArgument("steps: expected at least one step (or a packed batch)");
  }
  std::set<std::string> ids;
  for (const pb::ExtendRequest &step : r.steps()) {
    if (step.layer() != r.steps(0).layer()) {
      return InvalidArgument("steps: every step must be on the same layer (" +
                             std::to_string(r.steps(0).layer()) + "), got " +
                             std::to_string(step.layer()));
    }
    if (!ids.insert(step.sequence_id()).second) {
      return InvalidArgument("steps: sequence \"" + Utf8SafeEcho(step.sequence_id(), kIdEchoBytes) +
                             "\" appears twice");
    }
  }
  return Status::Ok();
}

}  // namespace attn
