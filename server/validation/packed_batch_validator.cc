#include "validation/packed_batch_validator.h"

#include <array>
#include <set>
#include <string>

#include "validation/attend_validator.h"
#include "validation/sequence_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using kernels::DType;

/// Largest element count of one packed tensor (shape products beyond it would overflow).
constexpr int64_t kMaxElements = int64_t{1} << 60;

std::string Shape3(const std::array<int64_t, 3> &s) {
  return "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
         ")";
}

/// A tensor's dtype and shape (rank 3, extents in [1, 2^24]) and its byte count.
struct TensorShape {
  DType dtype = DType::kFloat32;
  std::array<int64_t, 3> shape{};
  uint64_t bytes = 0;
};

Status DecodeShape(const pb::Tensor &t, const std::string &field, TensorShape *out) {
  if (t.shape_size() != 3) {
    return InvalidArgument(field + ": expected rank 3, got rank " + std::to_string(t.shape_size()));
  }
  auto dt = DTypeFromProto(t.dtype(), field + ".dtype");
  if (!dt.ok()) return dt.status();
  int64_t n = 1;
  for (int i = 0; i < 3; ++i) {
    const int64_t d = t.shape(i);
    if (d < 1 || d > kMaxExtendExtent) {
      return InvalidArgument(field + ".shape[" + std::to_string(i) + "]: expected [1, 2^24], got " +
                             std::to_string(d));
    }
    if (n > kMaxElements / d) return InvalidArgument(field + ": shape has too many elements");
    n *= d;
    out->shape[static_cast<size_t>(i)] = d;
  }
  out->dtype = *dt;
  out->bytes = static_cast<uint64_t>(n) * kernels::DTypeSize(*dt);
  return Status::Ok();
}

/// Where a tensor's `bytes` bytes are: its data, or its region (resolved), never both.
StatusOr<const void *> LocateBytes(const pb::Tensor &t, const char *field, bool has_region,
                                   const pb::RegionSlice &region, const char *region_field,
                                   uint64_t bytes, const RegionResolver &regions) {
  if (has_region) {
    if (!t.data().empty()) {
      return InvalidArgument(std::string(field) + ": data and " + region_field +
                             " are both set; give the bytes in one of them");
    }
    StatusOr<void *> at = regions(region_field, region, bytes, /*writable=*/false);
    if (!at.ok()) return at.status();
    return static_cast<const void *>(*at);
  }
  if (t.data().size() != bytes) {
    return InvalidArgument(std::string(field) + ".data: expected " + std::to_string(bytes) +
                           " bytes (its shape times the dtype size), got " +
                           std::to_string(t.data().size()));
  }
  return static_cast<const void *>(t.data().data());
}

/// The steps' own checks; fills first_row and total_tokens.
Status CheckSteps(const pb::PackedExtendBatch &p, PackedBatch *b) {
  if (p.layer() < 0) {
    return InvalidArgument("packed.layer: expected >= 0, got " + std::to_string(p.layer()));
  }
  if (p.steps_size() == 0) return InvalidArgument("packed.steps: expected at least one step");
  std::set<std::string> ids;
  int64_t rows = 0;
  for (int i = 0; i < p.steps_size(); ++i) {
    const pb::PackedStep &s = p.steps(i);
    const std::string at = "packed.steps[" + std::to_string(i) + "]";
    if (Status id = ValidateSequenceId(s.sequence_id()); !id.ok()) {
      return InvalidArgument(at + "." + id.message());
    }
    if (!ids.insert(s.sequence_id()).second) {
      return InvalidArgument(at + ": sequence \"" + s.sequence_id() +
                             "\" appears twice in the batch");
    }
    if (s.position() < 0) {
      return InvalidArgument(at + ".position: expected >= 0 (the layer's current length), got " +
                             std::to_string(s.position()));
    }
    if (s.query_tokens() < 1 || s.query_tokens() > kMaxExtendExtent) {
      return InvalidArgument(at + ".query_tokens: expected [1, 2^24], got " +
                             std::to_string(s.query_tokens()));
    }
    b->first_row.push_back(rows);
    rows += s.query_tokens();  // at most 2^24 per step: no overflow for any repeated field size
  }
  b->total_tokens = rows;
  return Status::Ok();
}

/// k and v, then q (unless append_only): shapes against each other and the steps.
Status CheckShapes(const pb::PackedExtendBatch &p, const PackedBatch &b, TensorShape *q,
                   TensorShape *k, TensorShape *v) {
  ATTN_RETURN_IF_ERROR(DecodeShape(p.k(), "packed.k", k));
  ATTN_RETURN_IF_ERROR(DecodeShape(p.v(), "packed.v", v));
  if (k->shape[0] != b.total_tokens) {
    return InvalidArgument("packed.k.shape[0]: expected the sum of the steps' query_tokens (" +
                           std::to_string(b.total_tokens) + "), got " +
                           std::to_string(k->shape[0]));
  }
  if (v->dtype != k->dtype || v->shape != k->shape) {
    return InvalidArgument(std::string("packed.v: expected k's dtype and shape (") +
                           kernels::DTypeName(k->dtype) + " " + Shape3(k->shape) + "), got " +
                           kernels::DTypeName(v->dtype) + " " + Shape3(v->shape));
  }
  if (p.append_only()) {
    if (p.has_q() || p.has_q_region()) {
      return InvalidArgument("packed.q: must be unset when append_only is set (nothing is attended)");
    }
    if (p.has_o_region()) {
      return InvalidArgument("packed.o_region: must be unset when append_only is set (no o)");
    }
    return Status::Ok();
  }
  if (!p.has_q()) {
    return InvalidArgument("packed.q: expected (total_tokens, N, H) queries (unset only when "
                           "append_only is set)");
  }
  ATTN_RETURN_IF_ERROR(DecodeShape(p.q(), "packed.q", q));
  if (q->dtype != k->dtype) {
    return InvalidArgument(std::string("packed.q.dtype: expected k's dtype ") +
                           kernels::DTypeName(k->dtype) + ", got " + kernels::DTypeName(q->dtype));
  }
  if (q->shape[0] != b.total_tokens || q->shape[2] != k->shape[2]) {
    return InvalidArgument("packed.q.shape: expected (" + std::to_string(b.total_tokens) +
                           " = the sum of query_tokens, N, H = " + std::to_string(k->shape[2]) +
                           " as k), got " + Shape3(q->shape));
  }
  return Status::Ok();
}

/// Step i's ExtendArgs over its rows of the located tensors.
ExtendArgs StepArgs(const pb::PackedExtendBatch &p, const PackedBatch &b, int i, const char *q,
                    const char *k, const char *v) {
  const pb::PackedStep &s = p.steps(i);
  const int64_t T = s.query_tokens(), row = b.first_row[static_cast<size_t>(i)];
  const uint64_t esize = kernels::DTypeSize(b.dtype);
  const uint64_t kv_row = static_cast<uint64_t>(b.num_kv_heads * b.head_dim) * esize;
  ExtendArgs a;
  a.sequence_id = s.sequence_id();
  a.layer = p.layer();
  a.position = s.position();
  a.q_dtype = a.k_dtype = a.v_dtype = b.dtype;
  a.k_shape = a.v_shape = {T, b.num_kv_heads, b.head_dim};
  a.k = k + static_cast<uint64_t>(row) * kv_row;
  a.v = v + static_cast<uint64_t>(row) * kv_row;
  a.k_bytes = a.v_bytes = static_cast<size_t>(static_cast<uint64_t>(T) * kv_row);
  if (b.append_only) {
    SetAppendOnly(&a);
    return a;
  }
  a.q_shape = {T, b.num_heads, b.head_dim};
  a.q = q + static_cast<uint64_t>(row) * b.o_row_bytes;
  a.q_bytes = static_cast<size_t>(static_cast<uint64_t>(T) * b.o_row_bytes);
  return a;
}

}  // namespace

RegionResolver RefuseRegions() {
  return [](const char *field, const pb::RegionSlice &slice, uint64_t, bool) -> StatusOr<void *> {
    return InvalidArgument(std::string("shared-memory regions: packed.") + field + " names region \"" +
                           Utf8SafeEcho(slice.region_id(), 64) +
                           "\", but regions are not accepted here; send the tensor's bytes in its "
                           "data field instead");
  };
}

StatusOr<PackedBatch> ValidatePackedExtendBatch(const pb::PackedExtendBatch &p,
                                                const RegionResolver &regions) {
  PackedBatch b;
  ATTN_RETURN_IF_ERROR(CheckSteps(p, &b));
  TensorShape q, k, v;
  ATTN_RETURN_IF_ERROR(CheckShapes(p, b, &q, &k, &v));
  b.append_only = p.append_only();
  b.dtype = k.dtype;
  b.num_kv_heads = k.shape[1];
  b.head_dim = k.shape[2];
  b.num_heads = b.append_only ? 0 : q.shape[1];
  b.o_row_bytes = static_cast<uint64_t>(b.num_heads * b.head_dim) * kernels::DTypeSize(b.dtype);
  const void *q_at = nullptr;
  if (!b.append_only) {
    auto at = LocateBytes(p.q(), "packed.q", p.has_q_region(), p.q_region(), "q_region", q.bytes,
                          regions);
    if (!at.ok()) return at.status();
    q_at = *at;
  }
  auto k_at =
      LocateBytes(p.k(), "packed.k", p.has_k_region(), p.k_region(), "k_region", k.bytes, regions);
  if (!k_at.ok()) return k_at.status();
  auto v_at =
      LocateBytes(p.v(), "packed.v", p.has_v_region(), p.v_region(), "v_region", v.bytes, regions);
  if (!v_at.ok()) return v_at.status();
  if (p.has_o_region()) {
    StatusOr<void *> o = regions("o_region", p.o_region(), q.bytes, /*writable=*/true);
    if (!o.ok()) return o.status();
    b.o = *o;
  }
  b.steps.reserve(static_cast<size_t>(p.steps_size()));
  for (int i = 0; i < p.steps_size(); ++i) {
    b.steps.push_back(StepArgs(p, b, i, static_cast<const char *>(q_at),
                               static_cast<const char *>(*k_at), static_cast<const char *>(*v_at)));
  }
  return b;
}

}  // namespace attn
