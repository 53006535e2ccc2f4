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

StatusOr<PackedAttend> PackedAttend::Pack(const std::vector<const ValidatedAttend*>& parts) {
  if (parts.empty()) return InvalidArgument("PackedAttend::Pack: no parts");
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
  int64_t entries = 0, total_q = 0, total_kv = 0;
  for (const ValidatedAttend* v : parts) {
    const kernels::AttentionShape& x = v->shape;
    if (x.dtype != s.dtype || x.num_heads != s.num_heads || x.num_kv_heads != s.num_kv_heads ||
        x.head_dim != s.head_dim || x.mask.causal != s.mask.causal ||
        x.mask.window_left != s.mask.window_left || x.mask.window_right != s.mask.window_right ||
        x.scale != s.scale || x.return_lse != s.return_lse) {
      return InvalidArgument("PackedAttend::Pack: parts have different signatures");
    }
    entries += x.batch;
    for (int64_t b = 0; b < x.batch; ++b) {
      total_q += QLen(*v, b);
      total_kv += KvLen(*v, b);
    }
  }
  const size_t es = static_cast<size_t>(kernels::DTypeSize(s.dtype));
  const size_t q_row = static_cast<size_t>(s.num_heads * s.head_dim) * es;
  const size_t kv_row = static_cast<size_t>(s.num_kv_heads * s.head_dim) * es;
  s.batch = entries;
  s.total_q = total_q;
  s.total_kv = total_kv;
  // At least one byte each so the pointers are never null, even for empty problems.
  p.q_.resize(std::max<size_t>(1, total_q * q_row));
  p.o_.resize(std::max<size_t>(1, total_q * q_row));
  p.k_.resize(std::max<size_t>(1, total_kv * kv_row));
  p.v_.resize(std::max<size_t>(1, total_kv * kv_row));
  if (s.return_lse) p.lse_.resize(std::max<size_t>(1, total_q * s.num_heads));
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
      const int64_t qo = p.q_offsets_.back(), ko = p.kv_offsets_.back();
      std::memcpy(p.q_.data() + qo * q_row, static_cast<const char*>(v->q) + QRow(*v, b) * q_row,
                  static_cast<size_t>(tq) * q_row);
      std::memcpy(p.k_.data() + ko * kv_row,
                  static_cast<const char*>(v->k) + KvRow(*v, b) * kv_row,
                  static_cast<size_t>(tk) * kv_row);
      std::memcpy(p.v_.data() + ko * kv_row,
                  static_cast<const char*>(v->v) + KvRow(*v, b) * kv_row,
                  static_cast<size_t>(tk) * kv_row);
      p.q_lengths_.push_back(static_cast<int32_t>(tq));
      p.kv_lengths_.push_back(static_cast<int32_t>(tk));
      p.q_offsets_.push_back(qo + tq);
      p.kv_offsets_.push_back(ko + tk);
      s.max_q_len = std::max(s.max_q_len, tq);
      s.max_kv_len = std::max(s.max_kv_len, tk);
    }
  }
  return p;
}

kernels::AttentionTensors PackedAttend::Tensors() {
  kernels::AttentionTensors t;
  t.q = q_.data();
  t.k = k_.data();
  t.v = v_.data();
  t.o = o_.data();
  t.lse = shape_.return_lse ? lse_.data() : nullptr;
  t.q_lengths = q_lengths_.data();
  t.kv_lengths = kv_lengths_.data();
  t.q_offsets = q_offsets_.data();
  t.kv_offsets = kv_offsets_.data();
  return t;
}

void PackedAttend::Scatter(size_t part, const ValidatedAttend& v, void* o, float* lse) const {
  const Part& pt = parts_[part];
  const size_t es = static_cast<size_t>(kernels::DTypeSize(shape_.dtype));
  const size_t q_row = static_cast<size_t>(shape_.num_heads * shape_.head_dim) * es;
  const int64_t N = shape_.num_heads;
  const int64_t total_q = shape_.total_q;
  char* out = static_cast<char*>(o);
  const bool padded = v.shape.layout == Layout::kPadded;
  if (padded) std::memset(out, 0, v.o_bytes);
  const bool want_lse = shape_.return_lse && lse != nullptr;
  if (want_lse && padded) {
    std::fill(lse, lse + v.shape.batch * N * v.shape.max_q_len,
              -std::numeric_limits<float>::infinity());
  }
  // The part's own q-row count (varlen lse is (N, part total_q)).
  const int64_t part_q = v.shape.layout == Layout::kVarlen ? v.shape.total_q : 0;
  for (int64_t b = 0; b < pt.entries; ++b) {
    const size_t g = static_cast<size_t>(pt.first_entry + b);
    const int64_t src_row = q_offsets_[g];
    const int64_t rows = q_lengths_[g];
    const int64_t dst_row = QRow(v, b);
    std::memcpy(out + dst_row * q_row, o_.data() + src_row * q_row,
                static_cast<size_t>(rows) * q_row);
    if (!want_lse) continue;
    for (int64_t n = 0; n < N; ++n) {
      const float* src = lse_.data() + n * total_q + src_row;
      float* dst = padded ? lse + (b * N + n) * v.shape.max_q_len
                          : lse + n * part_q + dst_row;
      std::copy(src, src + rows, dst);
    }
  }
}

}  // namespace attn
