// Pure checks of the cudnn family (cudnn_attention.h: CudnnShapeSupports). No cuDNN needed.
#include <cmath>
#include <string>

#include "attn/kernels/cudnn_attention_supports.h"

namespace attn::kernels {

Status CudnnShapeSupports(const AttentionShape& s, int sm, bool fp8) {
  const std::string who = fp8 ? "cuDNN FP8 SDPA" : "cuDNN SDPA";
  if (fp8) {
    if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16 &&
        s.dtype != DType::kFloat8E4M3) {
      return FailedPrecondition(who + " takes float16, bfloat16 or float8_e4m3 inputs, got " +
                                DTypeName(s.dtype));
    }
    if (sm < 90) {
      return FailedPrecondition(who + " needs sm_90 (Hopper) or newer; this GPU is sm_" +
                                std::to_string(sm));
    }
    if (s.head_dim % 16 != 0 || s.head_dim > 256) {
      return FailedPrecondition(who +
                                " needs a head dim that is a multiple of 16 and <= 256, got " +
                                std::to_string(s.head_dim));
    }
    if (s.layout != Layout::kPadded) {
      return FailedPrecondition(who + " on Hopper runs padded layouts only (its kernels fault on "
                                      "ragged offsets with cuDNN 9.19): packed varlen is refused");
    }
    // Bottom-right equals top-left when every entry has T_b == S_b (padded, no lengths, T == S).
    const bool same_diagonal = !s.has_lengths && s.max_q_len == s.max_kv_len;
    const bool bottom_right =
        (s.mask.causal == CausalAlignment::kBottomRight && !same_diagonal) ||
        (s.mask.causal == CausalAlignment::kNone &&
         (s.mask.window_left >= 0 || s.mask.window_right >= 0));
    if (bottom_right && sm < 100) {
      return FailedPrecondition(
          who + " has no bottom-right diagonal alignment before Blackwell (sm_100): "
                "bottom-right causal masks and windows without a causal alignment are refused");
    }
  } else {
    if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
      return FailedPrecondition(who + " takes float16 or bfloat16, got " + DTypeName(s.dtype));
    }
    if (sm < 80) {
      return FailedPrecondition(who + " needs sm_80 or newer; this GPU is sm_" +
                                std::to_string(sm));
    }
    if (s.head_dim % 8 != 0 || s.head_dim > 256) {
      return FailedPrecondition(who + " needs a head dim that is a multiple of 8 and <= 256, got " +
                                std::to_string(s.head_dim));
    }
  }
  if (!(std::isfinite(s.scale) && s.scale > 0.f)) {
    return FailedPrecondition(who + " needs a positive finite scale");
  }
  if (s.num_heads <= 0 || s.num_kv_heads <= 0 || s.num_heads % s.num_kv_heads != 0) {
    return FailedPrecondition(who + " needs N % K == 0 with N, K > 0");
  }
  constexpr int64_t kInt32Max = 0x7fffffff;
  if (s.q_elements() >= kInt32Max || s.kv_elements() >= kInt32Max) {
    return FailedPrecondition(who + ": q or k/v has 2^31 or more elements (int32 ragged offsets)");
  }
  if (s.max_q_len >= kInt32Max / 2 || s.max_kv_len >= kInt32Max / 2) {
    return FailedPrecondition(who + ": T or S too large");
  }
  // cuDNN's band bounds are int32 (window_left + 1 and window_right). The Attend validator
  // normalises windows wider than the problem to unbounded (NormalizeMask), so this only
  // refuses a direct caller that did not: never narrow silently (issue 14).
  if (s.mask.window_left >= kInt32Max - 1 || s.mask.window_right >= kInt32Max - 1) {
    return FailedPrecondition(who + ": a window of 2^31 - 2 or more keys (int32 band bounds); "
                                    "normalise it with NormalizeMask first");
  }
  return Status::Ok();
}

}  // namespace attn::kernels
