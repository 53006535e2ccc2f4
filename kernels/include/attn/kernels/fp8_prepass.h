// The accuracy pre-pass of per-tensor FP8 (E4M3) attention (issue 20): statistics over valid
// positions only, K smoothing, a Hadamard rotation of Q and K, and the quantisation, in as few
// passes over each tensor as those statistics allow. Used by the `fp8` backend before cuDNN's
// FP8 SDPA (sm_90) and before our own e4m3 kernel (sm_89).
//
// What it computes, for the recipe in shape.fp8 (AttentionShape::fp8, attention_problem.h):
//   valid rows   q: token t of entry b with t < T_b (q_lengths, or varlen offsets; all rows when
//                the padded request has no lengths); k, v: t < S_b the same way. Padding rows
//                are written as E4M3 zeros and take no part in any statistic, so what the
//                request masks out by length can neither move a scale nor reach an output
//                through NaN/Inf arithmetic (issue 20: "values the request masks out decide the
//                precision of the values it keeps").
//   rotate       x ← x·Hₙ for every q and k row, Hₙ the orthonormal Sylvester-Hadamard matrix of
//                order n = the largest power of two dividing head_dim (block-diagonal when n <
//                head_dim), applied by the fast Walsh-Hadamard transform (log2 n add/sub stages,
//                then · n^-1/2). Q·Kᵀ is unchanged (Hₙ·Hₙᵀ = I), while a few outlier channels
//                are spread over all n (FlashAttention-3's "incoherent processing", Shah et al.
//                2024, §3.3). V is not rotated.
//   smooth_k     after the rotation: mean_{b,h} = (1/S_b) Σ_{valid t} rot(k[b,t,h,:]) in fp32 per
//                (entry, kv head), and rot(k) ← rot(k) − mean. Exact for attention: every logit
//                of a row of entry b shifts by the same scale·rot(q)·mean_{b,h} (= q·mean of the
//                unrotated keys), which the softmax removes (SageAttention, Zhang et al. 2024,
//                §3.2). The LSE shifts by that amount: Fp8PrepassLseShift adds it back.
//   amax         max |x| over valid rows of the transformed tensor (exact: integer max on the
//                fp32 bits, NaN propagates), then the per-tensor scale of fp8_quantize.h:
//                scale = min(448 / amax, 2^126) (1 when amax is 0 or not finite), x8 =
//                e4m3_rn_satfinite(x · scale), descale = 1 / scale.
// Passes over the bf16/fp16 input: two over each tensor, in two launches for all three. Pass 1
// takes the amax of rot(q) and of v, and for k either its amax or, with smoothing, per chunk of
// keys the sum, max and min of every rotated channel; a small kernel then forms K's mean and its
// amax from those extremes (rounding is monotonic, so max |fl(x − mean)| over the keys is exactly
// max(|fl(max − mean)|, |fl(min − mean)|): no third read of k). Pass 2 quantises all three,
// walking its blocks in reverse so that what pass 1 read last is still in L2. Each thread issues
// the loads of all its rows before transforming any. Every transform is recomputed identically
// in each pass (add/sub/mul only, no contraction), so the amax is exactly that of the values
// quantised, and the host reference (Fp8PrepassReference) reproduces the device bit for bit.
//
// Stream-ordered, no host synchronisation, no allocation (caller's workspace), graph-capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/common/status.h"
#include "attn/kernels/attention_problem.h"

namespace attn::kernels {

/// Index of each device float in the pre-pass's `scalars` output (9 floats). The order is the
/// cuDNN FP8 path's (cudnn_attention.cc) and Fp8Backend's.
enum Fp8Scalar : int {
  kFp8ScaleQ,
  kFp8DescaleQ,
  kFp8AmaxQ,
  kFp8ScaleK,
  kFp8DescaleK,
  kFp8AmaxK,
  kFp8ScaleV,
  kFp8DescaleV,
  kFp8AmaxV,
  kFp8NumScalars
};

/// Tokens per pre-pass block along one entry's rows (the chunk of the K mean's partial sums).
inline constexpr int kFp8PrepassChunk = 64;

/// Order of the Hadamard blocks for `head_dim`: the largest power of two dividing it (capped at
/// head_dim). 0 when head_dim is not a positive multiple of 8 (the pre-pass needs 8 | head_dim).
int Fp8HadamardOrder(int64_t head_dim);

/// The recipe's name as ExecutionReport and GetServerInfo give it, e.g.
/// "e4m3 per-tensor, hadamard q/k, k-smoothing" or "e4m3 per-tensor" (both measures off).
std::string Fp8RecipeName(const Fp8Options& options);

/// Device workspace bytes Fp8Prepass needs for `shape` (the K mean's partial sums and means, and
/// the lse shift's inputs); 0 when smooth_k is off.
int64_t Fp8PrepassWorkspaceBytes(const AttentionShape& shape);

/// Quantises dev.q, dev.k, dev.v (device, shape.dtype kFloat16 or kBFloat16, shape's layout) to
/// E4M3 under shape.fp8's recipe (above): q8 (shape.q_elements() bytes), k8, v8
/// (shape.kv_elements() bytes each), and the 9 floats of `scalars` (Fp8Scalar order: scale,
/// descale and amax of q, k, v). dev.q_lengths/kv_lengths (padded, when shape.has_lengths) and
/// dev.q_offsets/kv_offsets (varlen) are read on the device. `workspace`: at least
/// Fp8PrepassWorkspaceBytes(shape) bytes of device memory, 16-byte aligned, kept unchanged
/// until Fp8PrepassLseShift has run when that is needed.
/// Errors: INVALID_ARGUMENT (dtype, head_dim not a multiple of 8 or above 256, null or
/// misaligned pointers, small workspace); INTERNAL naming a failed launch.
Status Fp8Prepass(const AttentionShape& shape, const AttentionTensors& dev, void* q8, void* k8,
                  void* v8, float* scalars, void* workspace, int64_t workspace_bytes,
                  cudaStream_t stream);

/// With smooth_k and shape.return_lse: adds scale·rot(q[b,t,n,:])·mean_{b,n/g} to every finite
/// dev.lse entry of a valid row (the softmax's shift, undone), reading the unquantised dev.q and
/// the means Fp8Prepass left in `workspace`. Rows that see no key keep −inf. A no-op otherwise.
/// Errors: as Fp8Prepass.
Status Fp8PrepassLseShift(const AttentionShape& shape, const AttentionTensors& dev,
                          const void* workspace, cudaStream_t stream);

/// What Fp8Prepass computes, on the host, bit for bit (the GPU parity test compares them): the
/// inputs as 16-bit patterns of shape.dtype, lengths/offsets as AttentionTensors gives them
/// (host pointers). Fills q8, k8, v8 (resized), scalars (9 floats) and mean_k ((B, K, H) floats,
/// empty without smooth_k). For tests and the CPU-side checks of the recipe; not fast.
Status Fp8PrepassReference(const AttentionShape& shape, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const AttentionTensors& index,
                           std::vector<uint8_t>* q8, std::vector<uint8_t>* k8,
                           std::vector<uint8_t>* v8, std::vector<float>* scalars,
                           std::vector<float>* mean_k);

}  // namespace attn::kernels
