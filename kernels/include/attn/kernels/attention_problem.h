// The attention problem every kernel family computes, and the tensors it reads and writes.
//
//   O = softmax(scale · Q Kᵀ + band mask) V      (DESIGN.md §4)
//
// Layouts (row-major, innermost last; element type `dtype` unless stated):
//   kPadded:  q, o (B, T, N, H)   k, v (B, S, K, H)   lse (B, N, T) float32
//   kVarlen:  q, o (total_q, N, H)   k, v (total_kv, K, H)   lse (N, total_q) float32
//             batch entry b owns rows [q_offsets[b], q_offsets[b+1]) of q/o and
//             [kv_offsets[b], kv_offsets[b+1]) of k/v.
// Grouped heads: N % K == 0; query head h reads KV head h / (N / K) (MHA K=N, MQA K=1).
// Lengths: T_b = q_lengths[b], S_b = kv_lengths[b] (padded: full extents T, S when absent).
//   Keys j >= S_b and queries i >= T_b are masked; output rows i >= T_b are zero.
// A query row that sees no key outputs zeros and lse = -inf.
// This header is host- and device-compatible and includes nothing from the server or proto.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ATTN_HD __host__ __device__ __forceinline__
#else
#define ATTN_HD inline
#endif

namespace attn::kernels {

/// Element types. Sizes: kFloat32 4 bytes, kFloat16 2 (IEEE binary16), kBFloat16 2 (bfloat16),
/// kFloat8E4M3 1 (OCP FP8 E4M3, finite-only with NaN 0x7F/0xFF).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat8E4M3 = 3 };

/// Bytes per element of `dtype`.
ATTN_HD int DTypeSize(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : (dtype == DType::kFloat8E4M3 ? 1 : 2);
}
/// "float32", "float16", "bfloat16", "float8_e4m3".
const char* DTypeName(DType dtype);

/// Where the causal diagonal sits. Top-left keeps j <= i; bottom-right keeps j <= i + (S_b - T_b).
/// PyTorch/JAX `is_causal` is top-left; FlashAttention and KV-cache decode are bottom-right.
enum class CausalAlignment : int { kNone = 0, kTopLeft = 1, kBottomRight = 2 };
const char* CausalAlignmentName(CausalAlignment a);

/// The band mask: a causal alignment plus an optional sliding window, in keys.
/// The band's diagonal for row i is d(i) = i (top-left) or i + S_b - T_b (bottom-right, and
/// also for kNone, as in FlashAttention's window_size). Keys kept: d(i) - window_left <= j <=
/// d(i) + window_right; a negative window means unbounded on that side; causal forces
/// window_right = 0.
struct MaskSpec {
  CausalAlignment causal = CausalAlignment::kNone;
  int64_t window_left = -1;
  int64_t window_right = -1;
};

/// Inclusive key range [lo, hi]; empty when lo > hi.
struct KeyRange {
  int64_t lo;
  int64_t hi;
  ATTN_HD bool empty() const { return lo > hi; }
};

/// The keys query row `i` of a batch entry with `q_len` queries and `kv_len` keys may see,
/// clipped to [0, kv_len). Rows i >= q_len see nothing. Single source of the mask semantics.
ATTN_HD KeyRange BandKeyRange(const MaskSpec& m, int64_t i, int64_t q_len, int64_t kv_len) {
  if (i >= q_len || kv_len <= 0) return {0, -1};
  const int64_t diag = i + (m.causal == CausalAlignment::kTopLeft ? 0 : kv_len - q_len);
  int64_t lo = 0;
  int64_t hi = kv_len - 1;
  // Compared as window < distance, never as diag ± window: windows up to INT64_MAX mean
  // "unbounded" and must not overflow (|diag|, lo and hi are bounded by the lengths).
  if (m.window_left >= 0 && m.window_left < diag - lo) lo = diag - m.window_left;
  const int64_t wr = m.causal != CausalAlignment::kNone ? 0 : m.window_right;
  if (wr >= 0 && wr < hi - diag) hi = diag + wr;
  return {lo, hi};
}

/// The same band with every window that keeps all keys of any problem with q lengths <=
/// max_q_len and kv lengths <= max_kv_len spelled as unbounded (-1). A window w >= max_q_len +
/// max_kv_len never drops a key (a row's diagonal d(i) lies in [-(T_b - 1), S_b - 1] and keys
/// in [0, S_b - 1], so |j - d(i)| <= T_b + S_b - 2); the remaining windows are < max_q_len +
/// max_kv_len, so they fit the int32 band bounds libraries such as cuDNN take when the bounds
/// do. Exact: BandKeyRange gives the same keys before and after for every row of every entry.
/// Windows < 0 stay unbounded; bounds must be >= 0. The Attend validator calls it once per
/// request with its token limit (2^24 each), before any backend.
MaskSpec NormalizeMask(const MaskSpec& m, int64_t max_q_len, int64_t max_kv_len);

/// Padded (B, T, N, H) tensors or packed varlen (total, N, H) tensors.
enum class Layout : int { kPadded = 0, kVarlen = 1 };

/// How the `fp8` backend quantises a request (issue 20; docs/fp8.md). Ignored by every other
/// family. The accuracy measures of the pre-pass (attn/kernels/fp8_prepass.h) are on by
/// default; a request can turn them off (AttendRequest.fp8).
/// The format of Q·Kᵀ: kAuto is the device's default (sm_89: INT8 per token in our kernel;
/// sm_90: cuDNN's per-tensor E4M3 FP8 SDPA).
enum class Fp8QkFormat : int { kAuto = 0, kE4M3PerTensor = 1, kInt8PerToken = 2 };
/// The format of P·V in our kernel: kAuto is E4M3 on sm_89 (native QMMA) and 16-bit on sm_90
/// (e4m3 mma.sync is emulated there); k16Bit needs INT8 Q·Kᵀ (the only kernel built with it).
enum class Fp8PvFormat : int { kAuto = 0, kE4M3 = 1, k16Bit = 2 };

struct Fp8Options {
  bool rotate = true;    ///< Hadamard-rotate q and k per head (QKᵀ unchanged) before the scale
  bool smooth_k = true;  ///< subtract K's mean over each entry's valid keys, per kv head
  Fp8QkFormat qk = Fp8QkFormat::kAuto;  ///< AttendRequest.fp8.qk_format
  Fp8PvFormat pv = Fp8PvFormat::kAuto;  ///< AttendRequest.fp8.pv_format
  /// dtype kFloat8E4M3 only: the request's per-tensor dequantisation scales (Tensor.scale),
  /// real = stored × descale; o comes back in E4M3 with v_descale as its scale.
  float q_descale = 1.f, k_descale = 1.f, v_descale = 1.f;
};

/// Shape, dtype and semantics of one attention launch: what Plan() is keyed on.
struct AttentionShape {
  Layout layout = Layout::kPadded;
  DType dtype = DType::kBFloat16;  ///< dtype of q, k, v and o
  int64_t batch = 0;               ///< B
  int64_t max_q_len = 0;           ///< T: padded extent, or max q length for varlen
  int64_t max_kv_len = 0;          ///< S: padded extent, or max kv length for varlen
  int64_t total_q = 0;             ///< varlen only: rows of q/o (sum of q_lengths)
  int64_t total_kv = 0;            ///< varlen only: rows of k/v (sum of kv_lengths)
  int64_t num_heads = 0;           ///< N
  int64_t num_kv_heads = 0;        ///< K; N % K == 0
  int64_t head_dim = 0;            ///< H
  MaskSpec mask;
  float scale = 0.f;        ///< softmax scale; callers resolve the default 1/sqrt(H) first
  bool has_lengths = false; ///< padded: q_lengths/kv_lengths given (varlen: always true)
  bool return_lse = false;
  Fp8Options fp8;           ///< `fp8` backend only (above)

  ATTN_HD int64_t group_size() const { return num_heads / num_kv_heads; }
  /// Rows of q/o: B*T (padded) or total_q (varlen).
  ATTN_HD int64_t q_rows() const { return layout == Layout::kPadded ? batch * max_q_len : total_q; }
  /// Rows of k/v: B*S (padded) or total_kv (varlen).
  ATTN_HD int64_t kv_rows() const {
    return layout == Layout::kPadded ? batch * max_kv_len : total_kv;
  }
  ATTN_HD int64_t q_elements() const { return q_rows() * num_heads * head_dim; }
  ATTN_HD int64_t kv_elements() const { return kv_rows() * num_kv_heads * head_dim; }
  /// Elements of lse: B*N*T (padded) or N*total_q (varlen).
  ATTN_HD int64_t lse_elements() const { return q_rows() * num_heads; }
  /// FLOPs counted as 4·Σ_b T_b·S_b·N·H over full extents (DESIGN.md §10), not halved for causal.
  double dense_flops() const;
};

/// Pointers for one launch. Host pointers for the CPU reference, device pointers for CUDA
/// families. Ownership stays with the caller; kernels never free.
struct AttentionTensors {
  const void* q = nullptr;  ///< see layouts above
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;                ///< null unless shape.return_lse
  const int32_t* q_lengths = nullptr;  ///< (B) or null (padded, full extents)
  const int32_t* kv_lengths = nullptr; ///< (B) or null (padded, full extents)
  const int64_t* q_offsets = nullptr;  ///< varlen: (B+1) exclusive prefix sum of q_lengths
  const int64_t* kv_offsets = nullptr; ///< varlen: (B+1) exclusive prefix sum of kv_lengths
};

/// Length of batch entry b's queries given host or device-visible `lengths` (null: `full`).
ATTN_HD int64_t LengthOr(const int32_t* lengths, int64_t b, int64_t full) {
  return lengths ? static_cast<int64_t>(lengths[b]) : full;
}

}  // namespace attn::kernels
