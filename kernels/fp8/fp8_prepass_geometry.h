// How the FP8 pre-pass (attn/kernels/fp8_prepass.h) walks a tensor: shared by the device
// kernels (fp8_prepass.cu) and the host reference (fp8_prepass_reference.cc), so that both
// take the same rows in the same order and the reference matches the device bit for bit.
//
// Internal to kernels/fp8/. Host- and device-compatible.
#pragma once

#include <cstdint>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/fp8_prepass.h"

namespace attn::kernels::fp8 {

/// Threads per pre-pass block. A block owns kFp8PrepassChunk tokens of one (entry, head): its
/// rows are walked in passes of RowsPerPass rows, LanesPerRow threads per row, 8 elements (one
/// 16-byte vector) per thread: thread `tid` takes row tid / lanes of each pass, elements
/// [8·(tid % lanes), 8·(tid % lanes) + 8).
inline constexpr int kPrepassThreads = 256;

/// Threads per row: the power of two >= head_dim / 8 (so that a row's lanes form an aligned
/// group of a warp and the Hadamard's cross-lane stages are xor shuffles inside it).
ATTN_HD int LanesPerRow(int64_t head_dim) {
  int l = 1;
  while (l * 8 < head_dim) l <<= 1;
  return l;
}
/// Rows per pass: at most one chunk (head_dim < 32 leaves threads >= RowsPerPass · lanes idle).
ATTN_HD int RowsPerPass(int64_t head_dim) {
  const int r = kPrepassThreads / LanesPerRow(head_dim);
  return r < kFp8PrepassChunk ? r : kFp8PrepassChunk;
}
ATTN_HD int64_t Chunks(int64_t extent) {
  return (extent + kFp8PrepassChunk - 1) / kFp8PrepassChunk;
}

/// One tensor as the pre-pass sees it: `heads` heads of `head_dim` elements per token row; entry
/// b owns rows [RowBase(b), RowBase(b) + Extent) of which the first Length(b) are valid.
struct PrepassTensor {
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t batch = 0;
  int64_t max_len = 0;  ///< padded extent T or S; varlen maximum length
  bool varlen = false;
  const int32_t* lengths = nullptr;  ///< padded with lengths: (B); else null
  const int64_t* offsets = nullptr;  ///< varlen: (B+1)

  ATTN_HD int64_t Length(int64_t b) const {
    int64_t n = varlen ? offsets[b + 1] - offsets[b] : (lengths ? lengths[b] : max_len);
    if (n < 0) n = 0;
    return n > max_len ? max_len : n;
  }
  ATTN_HD int64_t RowBase(int64_t b) const { return varlen ? offsets[b] : b * max_len; }
  /// Rows of entry b the quantisation writes: padded rows too (as zeros) in the padded layout.
  ATTN_HD int64_t WrittenRows(int64_t b) const { return varlen ? Length(b) : max_len; }
};

/// The query, key and value tensors of `s` with `t`'s index arrays (device or host pointers).
inline PrepassTensor QTensor(const AttentionShape& s, const AttentionTensors& t) {
  PrepassTensor p;
  p.heads = s.num_heads;
  p.head_dim = s.head_dim;
  p.batch = s.batch;
  p.max_len = s.max_q_len;
  p.varlen = s.layout == Layout::kVarlen;
  p.lengths = (!p.varlen && s.has_lengths) ? t.q_lengths : nullptr;
  p.offsets = p.varlen ? t.q_offsets : nullptr;
  return p;
}
inline PrepassTensor KvTensor(const AttentionShape& s, const AttentionTensors& t) {
  PrepassTensor p;
  p.heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.batch = s.batch;
  p.max_len = s.max_kv_len;
  p.varlen = s.layout == Layout::kVarlen;
  p.lengths = (!p.varlen && s.has_lengths) ? t.kv_lengths : nullptr;
  p.offsets = p.varlen ? t.kv_offsets : nullptr;
  return p;
}

/// 1 / sqrt(order) rounded once to float (computed on the host, passed to the kernels, so both
/// sides multiply by the same constant).
inline float HadamardNorm(int order) {
  return static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(order)));
}

/// Workspace layout: the K statistics per (entry, kv head, chunk, channel) of the rotated keys
/// (B, K, Chunks(S), H) floats each: partial sums, maxima and minima; then the means (B, K, H)
/// floats; each 256-byte aligned.
struct PrepassWorkspace {
  int64_t partial_offset = 0, max_offset = 0, min_offset = 0, mean_offset = 0, bytes = 0;
};
inline PrepassWorkspace PrepassWorkspaceLayout(const AttentionShape& s) {
  PrepassWorkspace w;
  if (!s.fp8.smooth_k || s.batch <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0) return w;
  auto up = [](int64_t x) { return (x + 255) / 256 * 256; };
  const int64_t units = s.batch * s.num_kv_heads;
  const int64_t stats = up(4 * units * Chunks(s.max_kv_len) * s.head_dim);
  w.partial_offset = 0;
  w.max_offset = stats;
  w.min_offset = 2 * stats;
  w.mean_offset = 3 * stats;
  w.bytes = w.mean_offset + up(4 * units * s.head_dim);
  return w;
}

}  // namespace attn::kernels::fp8
