#include "batching/attend_coalescer.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace attn {
namespace {

using kernels::Layout;

// Query and key lengths of entry b of `v`.
int64_t QLen(const ValidatedAttend& v, int64_t b) {
  return v.q_lengths.empty() ? v.shape.max_q_len : v.q_lengths[static_cast<size_t>(b)];
}
int64_t KvLen(const ValidatedAttend& v, int64_t b) {
  return v.kv_lengths.empty() ? v.shape.max_kv_len : v.kv_lengths[static_cast<size_t>(b)];
}
// First q / kv row of entry b in `v`'s own tensors.
int64_t QRow(const ValidatedAttend& v, int64_t b) {
  return v.shape.layout == Layout::kVarlen ? v.q_offsets[static_cast<size_t>(b)]
                                           : b * v.shape.max_q_len;
}
int64_t KvRow(const ValidatedAttend& v, int64_t b) {
  return v.shape.layout == Layout::kVarlen ? v.kv_offsets[static_cast<size_t>(b)]
                                           : b * v.shape.max_kv_len;
}

}  // namespace

std::string AttendSignature(const ValidatedAttend& v, const std::string& backend) {
  const kernels::AttentionShape& s = v.shape;
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.scale, sizeof(scale_bits));
  return backend + "|" + kernels::DTypeName(s.dtype) + "|N" + std::to_string(s.num_heads) + "|K" +
         std::to_string(s.num_kv_heads) + "|H" + std::to_string(s.head_dim) + "|c" +
         std::to_string(static_cast<int>(s.mask.causal)) + "|wl" +
         std::to_string(s.mask.window_left) + "|wr" + std::to_string(s.mask.window_right) +
         "|s" + std::to_string(scale_bits) + (s.return_lse ? "|lse" : "");
}

bool MayCoalesce(const ValidatedAttend& v, const Backend& backend) {
  return v.shape.dtype != kernels::DType::kFloat8E4M3 && backend.coalescable();
}

StatusOr<PackedAttend> PackedAttend::Plan(const std::vector<const ValidatedAttend*>& parts) {
  if (parts.empty()) return InvalidArgument("PackedAttend::Plan: no parts");
  const kernels::AttentionShape& first = parts.front()->shape;
  PackedAttend p;
  kernels::AttentionShape& s = p.shape_;
  s.layout = Layout::kVarlen;
  s.dtype = first.dtype;
  s.num_heads = first.num_heads;
  s.num_kv_heads = first.num_kv_heads;
  s.head_dim = first.head_dim;
  s.mask = first.mask;
  s.scale = first.scale;
  s.return_lse = first.return_lse;
  s.has_lengths = true;
  int64_t entries = 0;
  for (const ValidatedAttend* v : parts) {
    const kernels::AttentionShape& x = v->shape;
    if (x.dtype != s.dtype || x.num_heads != s.num_heads || x.num_kv_heads != s.num_kv_heads ||
        x.head_dim != s.head_dim || x.mask.causal != s.mask.causal ||
        x.mask.window_left != s.mask.window_left || x.mask.window_right != s.mask.window_right ||
        x.scale != s.scale || x.return_lse != s.return_lse) {
      return InvalidArgument("PackedAttend::Plan: parts have different signatures");
    }
    entries += x.batch;
  }
  s.batch = entries;
  p.q_lengths_.reserve(static_cast<size_t>(entries));
  p.kv_lengths_.reserve(static_cast<size_t>(entries));
  p.q_offsets_.assign(1, 0);
  p.kv_offsets_.assign(1, 0);
  p.q_offsets_.reserve(static_cast<size_t>(entries) + 1);
  p.kv_offsets_.reserve(static_cast<size_t>(entries) + 1);
  for (const ValidatedAttend* v : parts) {
    p.parts_.push_back({static_cast<int64_t>(p.q_lengths_.size()), v->shape.batch});
    for (int64_t b = 0; b < v->shape.batch; ++b) {
      const int64_t tq = QLen(*v, b), tk = KvLen(*v, b);
      p.q_lengths_.push_back(static_cast<int32_t>(tq));
      p.kv_lengths_.push_back(static_cast<int32_t>(tk));
      p.q_offsets_.push_back(p.q_offsets_.back() + tq);
      p.kv_offsets_.push_back(p.kv_offsets_.back() + tk);
      s.max_q_len = std::max(s.max_q_len, tq);
      s.max_kv_len = std::max(s.max_kv_len, tk);
    }
  }
  s.total_q = p.q_offsets_.back();
  s.total_kv = p.kv_offsets_.back();
  return p;
}

StatusOr<PackedAttend> PackedAttend::Pack(const std::vector<const ValidatedAttend*>& parts) {
  StatusOr<PackedAttend> p = Plan(parts);
  if (!p.ok()) return p.status();
  p->buffers_ = HostTensorBuffers(p->shape_);
  p->PackInto(parts, p->buffers_.q(), p->buffers_.k(), p->buffers_.v());
  return p;
}

void PackedAttend::PackInto(const std::vector<const ValidatedAttend*>& parts, void* q, void* k,
                            void* v) const {
  const size_t es = static_cast<size_t>(kernels::DTypeSize(shape_.dtype));
  const size_t q_row = static_cast<size_t>(shape_.num_heads * shape_.head_dim) * es;
  const size_t kv_row = static_cast<size_t>(shape_.num_kv_heads * shape_.head_dim) * es;
  char* const qd = static_cast<char*>(q);
  char* const kd = static_cast<char*>(k);
  char* const vd = static_cast<char*>(v);
  for (size_t i = 0; i < parts_.size() && i < parts.size(); ++i) {
    const ValidatedAttend& x = *parts[i];
    for (int64_t b = 0; b < parts_[i].entries; ++b) {
      const size_t g = static_cast<size_t>(parts_[i].first_entry + b);
      const int64_t qo = q_offsets_[g], ko = kv_offsets_[g];
      std::memcpy(qd + qo * q_row, static_cast<const char*>(x.q) + QRow(x, b) * q_row,
                  static_cast<size_t>(q_lengths_[g]) * q_row);
      std::memcpy(kd + ko * kv_row, static_cast<const char*>(x.k) + KvRow(x, b) * kv_row,
                  static_cast<size_t>(kv_lengths_[g]) * kv_row);
      std::memcpy(vd + ko * kv_row, static_cast<const char*>(x.v) + KvRow(x, b) * kv_row,
                  static_cast<size_t>(kv_lengths_[g]) * kv_row);
    }
  }
}

kernels::AttentionTensors PackedAttend::IndexTensors() const {
  kernels::AttentionTensors t;
  t.q_lengths = q_lengths_.data();
  t.kv_lengths = kv_lengths_.data();
  t.q_offsets = q_offsets_.data();
  t.kv_offsets = kv_offsets_.data();
  return t;
}

kernels::AttentionTensors PackedAttend::Tensors() { return buffers_.Tensors(IndexTensors()); }

void PackedAttend::Scatter(size_t part, const ValidatedAttend& v, void* o, float* lse) const {
  ScatterFrom(part, v, buffers_.o(), buffers_.lse(), o, lse);
}

void PackedAttend::ScatterFrom(size_t part, const ValidatedAttend& v, const void* packed_o,
                               const float* packed_lse, void* o, float* lse) const {
  const Part& pt = parts_[part];
  const size_t es = static_cast<size_t>(kernels::DTypeSize(shape_.dtype));
  const size_t q_row = static_cast<size_t>(shape_.num_heads * shape_.head_dim) * es;
  const int64_t N = shape_.num_heads;
  const int64_t total_q = shape_.total_q;
  const char* const src_o = static_cast<const char*>(packed_o);
  char* out = static_cast<char*>(o);
  const bool padded = v.shape.layout == Layout::kPadded;
  const bool want_lse = shape_.return_lse && lse != nullptr;
  constexpr float kNoRows = -std::numeric_limits<float>::infinity();
  // The part's own q-row count (varlen lse is (N, part total_q)); a padded entry's row extent.
  const int64_t part_q = v.shape.layout == Layout::kVarlen ? v.shape.total_q : 0;
  const int64_t T = v.shape.max_q_len;
  for (int64_t b = 0; b < pt.entries; ++b) {
    const size_t g = static_cast<size_t>(pt.first_entry + b);
    const int64_t src_row = q_offsets_[g];
    const int64_t rows = q_lengths_[g];
    const int64_t dst_row = QRow(v, b);
    std::memcpy(out + dst_row * q_row, src_o + src_row * q_row, static_cast<size_t>(rows) * q_row);
    // Padded rows [T_b, T) are zero (each byte written once: this may run under a held lane).
    if (padded) {
      std::memset(out + (dst_row + rows) * q_row, 0, static_cast<size_t>(T - rows) * q_row);
    }
    if (!want_lse) continue;
    for (int64_t n = 0; n < N; ++n) {
      const float* src = packed_lse + n * total_q + src_row;
      float* dst = padded ? lse + (b * N + n) * T : lse + n * part_q + dst_row;
      std::copy(src, src + rows, dst);
      if (padded) std::fill(dst + rows, dst + T, kNoRows);
    }
  }
}

}  // namespace attn
