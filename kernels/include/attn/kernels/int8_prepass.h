// The per-token INT8 pre-pass of our 8-bit attention kernel's INT8 Q·Kᵀ path (issue 20;
// attn/kernels/int8_attention.h): SageAttention's recipe (Zhang et al. 2024, "SageAttention:
// Accurate 8-Bit Attention for Plug-and-play Inference Acceleration", §3.2-3.4: K smoothing,
// per-token/per-block INT8 Q and K) with the Hadamard rotation of FlashAttention-3 (Shah et al.
// 2024, §3.3) applied first, as the per-tensor pre-pass (attn/kernels/fp8_prepass.h) does.
//
// For every valid row (token t of entry b, head n) of q and of k:
//   x        = the row's head_dim values in fp32, rotated (x·Hₙ, shape.fp8.rotate) and, for k with
//              shape.fp8.smooth_k, minus K's mean over the entry's valid keys (of the rotated
//              keys, per kv head and channel): exactly the transform of Fp8Prepass (the same
//              device code, fp8_prepass_device.cuh), so both pre-passes see the same values.
//   amax     = max_i |x_i| in fp32 (exact: an integer max on the fp32 bits, NaN above +inf).
//   scale    = amax / 127 (IEEE division, round to nearest)          when amax is finite and the
//                                                                    quotient is > 0;
//            = 1, x8 = 0                                             when amax == 0 (all-zero row)
//                                                                    or amax / 127 underflows;
//            = NaN (0x7FFFFFFF), x8 = 0                              when amax is ±inf or NaN:
//              the row's logits become NaN in the kernel, so exactly the rows that see a
//              non-finite key (and a non-finite query row itself) come out NaN, as in exact
//              arithmetic; nothing else is touched.
//   x8_i     = clamp(round_to_nearest_even(x_i / scale), −127, 127)  int8 (−128 never occurs:
//              the range is symmetric, as SageAttention's).
//   so x_i ≈ x8_i · scale with |x_i − x8_i·scale| ≤ scale/2 (+1 ulp of the division).
// Padding rows (padded layout: tokens t ≥ T_b of q, t ≥ S_b of k) are written as x8 = 0 with
// scale = 0, and they take no part in any statistic, so values past the lengths (±1e4, NaN, inf)
// change nothing anywhere. Each valid row's x8 and scale depend on that row alone (and on K's
// mean when smoothing): changing one token changes no other token's output when smooth_k is off.
// Every fp32 operation is a separately rounded _rn intrinsic (no contraction), so the host
// reference (Int8PrepassReference) reproduces the device bit for bit.
//
// V, for the P·V format of the attention kernel (Int8PvFormat):
//   kE4M3   per-tensor E4M3 over valid rows, as Fp8Prepass does: amax over the valid rows of v
//           (exact, NaN propagates), scale = min(448 / amax, 2^126) (1 when amax is 0 or not
//           finite), v8 = e4m3_rn_satfinite(v · scale), padding rows E4M3 zeros; v_scalars =
//           (scale, descale = 1/scale, amax). The kernel's Vᵀ pre-pass transposes v8.
//   k16Bit  nothing: the kernel reads the bf16/fp16 v itself (per-token Q/K scales and no
//           per-tensor V scale: a row's output depends only on the keys it sees).
//
// Passes over the 16-bit inputs: q 1, k 1 (+1 for K's mean with smooth_k: fp8_kmean.h), v 2
// (kE4M3 only). Stream-ordered, no host synchronisation, no allocation, graph-capturable.
// Thread-safety: concurrent calls with distinct outputs and workspaces are safe. Built only when
// ATTN_CUDA is on (the host reference too: it lives in the fp8 family).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/common/status.h"
#include "attn/kernels/attention_problem.h"

namespace attn::kernels {

/// The P·V format of the INT8 Q·Kᵀ path (the pre-pass prepares V for it).
enum class Int8PvFormat : int {
  kE4M3 = 0,   ///< P and V in E4M3 (V per-tensor), mma.sync m16n8k32 e4m3: the L4's fast path
  k16Bit = 1,  ///< P and V in the input dtype (bf16/fp16), mma.sync m16n8k16: causal-invariant
};
const char* Int8PvFormatName(Int8PvFormat pv);  ///< "e4m3" / "16-bit"

/// The largest |x8| of the per-token quantisation (symmetric INT8).
inline constexpr float kInt8Max = 127.f;

/// Device outputs of Int8Prepass. Row-major, 16-byte aligned where marked.
struct Int8PrepassOutputs {
  int8_t* q8 = nullptr;        ///< shape.q_elements() bytes, q's layout; 8-byte aligned
  int8_t* k8 = nullptr;        ///< shape.kv_elements() bytes, k's layout; 8-byte aligned
  float* q_scale = nullptr;    ///< (q_rows, N) floats: row (token) major, then query head
  float* k_scale = nullptr;    ///< (kv_rows, K) floats: row major, then kv head
  uint8_t* v8 = nullptr;       ///< kE4M3 only: shape.kv_elements() bytes E4M3, v's layout
  float* v_scalars = nullptr;  ///< kE4M3 only: 3 floats: scale, descale, amax of V
};

/// The recipe's name for reports, e.g. "int8 per-token q/k, hadamard q/k, k-smoothing, e4m3 p·v".
std::string Int8RecipeName(const Fp8Options& options, Int8PvFormat pv);

/// Device workspace bytes Int8Prepass needs (K's mean and its partial sums, the layout of
/// Fp8PrepassWorkspaceBytes, so Fp8PrepassLseShift can read it); 0 when smooth_k is off.
int64_t Int8PrepassWorkspaceBytes(const AttentionShape& shape);

/// Quantises dev.q and dev.k (device, shape.dtype kFloat16 or kBFloat16, shape's layout, 16-byte
/// aligned) per token to INT8 under shape.fp8's recipe (above), and dev.v as `pv` needs.
/// dev.q_lengths/kv_lengths (padded, when shape.has_lengths) and dev.q_offsets/kv_offsets
/// (varlen) are read on the device. `workspace`: at least Int8PrepassWorkspaceBytes(shape) bytes
/// of device memory, 16-byte aligned; with smooth_k it holds K's mean afterwards, which
/// Fp8PrepassLseShift needs (shape.return_lse) to undo the smoothing's shift of the lse.
/// Errors: INVALID_ARGUMENT (dtype, head_dim not a multiple of 8 or above 256, B or N above
/// 65535, null or misaligned pointers, missing varlen offsets, small workspace); INTERNAL
/// naming a failed launch.
Status Int8Prepass(const AttentionShape& shape, const AttentionTensors& dev, Int8PvFormat pv,
                   const Int8PrepassOutputs& out, void* workspace, int64_t workspace_bytes,
                   cudaStream_t stream);

/// What Int8Prepass writes, on the host (tests and CPU-side checks of the recipe; not fast).
struct Int8PrepassHost {
  std::vector<int8_t> q8, k8;         ///< as Int8PrepassOutputs
  std::vector<float> q_scale, k_scale;
  std::vector<uint8_t> v8;            ///< kE4M3 only (empty otherwise)
  std::vector<float> v_scalars;       ///< kE4M3 only: scale, descale, amax
  std::vector<float> mean_k;          ///< smooth_k only: (B, K, H) floats
};

/// Int8Prepass on the host, bit for bit: q, k, v as 16-bit patterns of shape.dtype, lengths and
/// offsets as `index` gives them (host pointers). K's mean is fp8::KMeanReference's (the
/// device's reduction order, kernels/fp8/fp8_kmean.h). Errors: INVALID_ARGUMENT as Int8Prepass.
Status Int8PrepassReference(const AttentionShape& shape, const uint16_t* q, const uint16_t* k,
                            const uint16_t* v, const AttentionTensors& index, Int8PvFormat pv,
                            Int8PrepassHost* out);

}  // namespace attn::kernels
