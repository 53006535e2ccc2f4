// Pure checks of what the cudnn family accepts (cudnn_attention.h), before asking cuDNN.
// No cuDNN or CUDA needed: compiled in every build and unit-tested on CPU. Thread-safe.
#pragma once

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Pure checks of what the cudnn family accepts, before asking cuDNN (no library needed).
/// fp8 == false: dtype fp16/bf16, head dim a multiple of 8 and <= 256, sm >= 80.
/// fp8 == true: dtype fp16, bf16 or E4M3, head dim a multiple of 16 and <= 256, sm >= 90, and
///   on sm < 100 no bottom-right diagonal (bottom-right causal, or a window with kNone, whose
///   diagonal is bottom-right): "cuDNN FP8 SDPA has no bottom-right alignment before
///   Blackwell" -- except bottom-right causal with T == S and no lengths, which is the top-left
///   mask and runs as such; and padded layouts only (packed varlen is refused).
/// Both: positive finite scale; q/k/v element counts below 2^31 (int32 ragged offsets).
/// Returns FAILED_PRECONDITION with the reason.
Status CudnnShapeSupports(const AttentionShape& shape, int sm, bool fp8);

}  // namespace attn::kernels
