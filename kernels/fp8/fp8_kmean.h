// K's mean over each entry's valid keys, in the rotated basis, on its own: the smoothing
// statistic of the accuracy pre-passes (attn/kernels/fp8_prepass.h, attn/kernels/int8_prepass.h),
// for the paths that need it without the per-tensor E4M3 quantisation (the per-token INT8
// pre-pass, kernels/fp8/int8_prepass.cu).
//
// Defined in kernels/fp8/fp8_prepass.cu and fp8_prepass_reference.cc (the pre-pass's own
// MeanPartialKernel / MeanFinalKernel and their host twin), so that every path smooths K with the
// same means bit for bit. Internal to kernels/fp8/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "attn/common/status.h"
#include "attn/kernels/attention_problem.h"

namespace attn::kernels::fp8 {

/// Enqueues the K mean of `s` on `stream`: for every (entry b, kv head h, channel d),
/// mean[b, h, d] = (1/S_b) Σ_{valid t} rot(k[b, t, h, :])[d] in fp32 (0 for an entry without
/// keys), rot = the Hadamard rotation when s.fp8.rotate (identity otherwise), written as
/// (B, K, H) floats at byte offset PrepassWorkspaceLayout(s).mean_offset of `workspace` (whose
/// partial sums it uses as scratch). dev.k: (B, S, K, H) padded or (total_kv, K, H) varlen,
/// s.dtype kFloat16/kBFloat16, 16-byte aligned; dev.kv_lengths / dev.kv_offsets as for
/// Fp8Prepass. A no-op when !s.fp8.smooth_k. Errors: as Fp8Prepass.
Status EnqueueKMean(const AttentionShape& s, const AttentionTensors& dev, void* workspace,
                    cudaStream_t stream);

/// EnqueueKMean on the host, bit for bit: k as 16-bit patterns of s.dtype, host_index's
/// lengths/offsets host pointers. Returns (B, K, H) floats (empty when !s.fp8.smooth_k).
std::vector<float> KMeanReference(const AttentionShape& s, const uint16_t* k,
                                  const AttentionTensors& host_index);

}  // namespace attn::kernels::fp8
