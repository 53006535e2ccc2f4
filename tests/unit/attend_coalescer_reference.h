// The reference for attend_coalescer_test.cc: PackedAttend's Pack and Scatter as they were
// before issue 17 split them into Plan / PackInto / ScatterFrom (commit 1960c13), kept with
// their logic unchanged (only the packed output became a parameter of Scatter), so the split
// code is checked against the old code, not against itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "validation/validated_attend.h"

namespace attn::reference {

using kernels::Layout;

inline int64_t QLen(const ValidatedAttend& v, int64_t b) {
  return v.q_lengths.empty() ? v.shape.max_q_len : v.q_lengths[static_cast<size_t>(b)];
}
inline int64_t KvLen(const ValidatedAttend& v, int64_t b) {
  return v.kv_lengths.empty() ? v.shape.max_kv_len : v.kv_lengths[static_cast<size_t>(b)];
}
inline int64_t QRow(const ValidatedAttend& v, int64_t b) {
  return v.shape.layout == Layout::kVarlen ? v.q_offsets[static_cast<size_t>(b)]
                                           : b * v.shape.max_q_len;
}
inline int64_t KvRow(const ValidatedAttend& v, int64_t b) {
  return v.shape.layout == Layout::kVarlen ? v.kv_offsets[static_cast<size_t>(b)]
                                           : b * v.shape.max_kv_len;
}

/// The old Pack's result: packed q/k/v and the segment layout.
struct OldPacked {
  int64_t N = 0, total_q = 0, total_kv = 0;
  size_t q_row = 0, kv_row = 0;
  std::vector<char> q, k, v;
  std::vector<int32_t> q_lengths, kv_lengths;
  std::vector<int64_t> q_offsets{0}, kv_offsets{0};
  std::vector<std::pair<int64_t, int64_t>> parts;  ///< (first entry, entries)
};

/// The old PackedAttend::Pack (parts already checked compatible).
inline OldPacked OldPack(const std::vector<const ValidatedAttend*>& parts) {
  OldPacked p;
  const kernels::AttentionShape& s = parts.front()->shape;
  const size_t es = static_cast<size_t>(kernels::DTypeSize(s.dtype));
  p.N = s.num_heads;
  p.q_row = static_cast<size_t>(s.num_heads * s.head_dim) * es;
  p.kv_row = static_cast<size_t>(s.num_kv_heads * s.head_dim) * es;
  for (const ValidatedAttend* v : parts) {
    for (int64_t b = 0; b < v->shape.batch; ++b) {
      p.total_q += QLen(*v, b);
      p.total_kv += KvLen(*v, b);
    }
  }
  p.q.resize(std::max<size_t>(1, p.total_q * p.q_row));
  p.k.resize(std::max<size_t>(1, p.total_kv * p.kv_row));
  p.v.resize(std::max<size_t>(1, p.total_kv * p.kv_row));
  for (const ValidatedAttend* v : parts) {
    p.parts.emplace_back(static_cast<int64_t>(p.q_lengths.size()), v->shape.batch);
    for (int64_t b = 0; b < v->shape.batch; ++b) {
      const int64_t tq = QLen(*v, b), tk = KvLen(*v, b);
      const int64_t qo = p.q_offsets.back(), ko = p.kv_offsets.back();
      std::memcpy(p.q.data() + qo * p.q_row,
                  static_cast<const char*>(v->q) + QRow(*v, b) * p.q_row,
                  static_cast<size_t>(tq) * p.q_row);
      std::memcpy(p.k.data() + ko * p.kv_row,
                  static_cast<const char*>(v->k) + KvRow(*v, b) * p.kv_row,
                  static_cast<size_t>(tk) * p.kv_row);
      std::memcpy(p.v.data() + ko * p.kv_row,
                  static_cast<const char*>(v->v) + KvRow(*v, b) * p.kv_row,
                  static_cast<size_t>(tk) * p.kv_row);
      p.q_lengths.push_back(static_cast<int32_t>(tq));
      p.kv_lengths.push_back(static_cast<int32_t>(tk));
      p.q_offsets.push_back(qo + tq);
      p.kv_offsets.push_back(ko + tk);
    }
  }
  return p;
}

/// The old PackedAttend::Scatter, reading the packed output from `packed_o` / `packed_lse`.
inline void OldScatter(const OldPacked& p, size_t part, const ValidatedAttend& v,
                       const char* packed_o, const float* packed_lse, bool return_lse, void* o,
                       float* lse) {
  const int64_t first_entry = p.parts[part].first, entries = p.parts[part].second;
  char* out = static_cast<char*>(o);
  const bool padded = v.shape.layout == Layout::kPadded;
  if (padded) std::memset(out, 0, v.o_bytes);
  const bool want_lse = return_lse && lse != nullptr;
  if (want_lse && padded) {
    std::fill(lse, lse + v.shape.batch * p.N * v.shape.max_q_len,
              -std::numeric_limits<float>::infinity());
  }
  const int64_t part_q = v.shape.layout == Layout::kVarlen ? v.shape.total_q : 0;
  for (int64_t b = 0; b < entries; ++b) {
    const size_t g = static_cast<size_t>(first_entry + b);
    const int64_t src_row = p.q_offsets[g];
    const int64_t rows = p.q_lengths[g];
    const int64_t dst_row = QRow(v, b);
    std::memcpy(out + dst_row * p.q_row, packed_o + src_row * p.q_row,
                static_cast<size_t>(rows) * p.q_row);
    if (!want_lse) continue;
    for (int64_t n = 0; n < p.N; ++n) {
      const float* src = packed_lse + n * p.total_q + src_row;
      float* dst = padded ? lse + (b * p.N + n) * v.shape.max_q_len
                          : lse + n * part_q + dst_row;
      std::copy(src, src + rows, dst);
    }
  }
}

}  // namespace attn::reference
