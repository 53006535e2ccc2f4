#include "attn/kernels/attention_problem.h"

namespace attn::kernels {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3";
  }
  return "unknown";
}

const char* CausalAlignmentName(CausalAlignment a) {
  switch (a) {
    case CausalAlignment::kNone: return "none";
    case CausalAlignment::kTopLeft: return "top_left";
    case CausalAlignment::kBottomRight: return "bottom_right";
  }
  return "unknown";
}

MaskSpec NormalizeMask(const MaskSpec& m, int64_t max_q_len, int64_t max_kv_len) {
  // No overflow: extents are tensor dimensions, far below 2^62 each.
  const int64_t reach = max_q_len + max_kv_len;
  MaskSpec out = m;
  if (out.window_left >= reach) out.window_left = -1;
  if (out.window_right >= reach) out.window_right = -1;
  return out;
}

double AttentionShape::dense_flops() const {
  const double per_pair = 4.0 * static_cast<double>(num_heads) * static_cast<double>(head_dim);
  if (layout == Layout::kPadded) {
    return per_pair * static_cast<double>(batch) * static_cast<double>(max_q_len) *
           static_cast<double>(max_kv_len);
  }
  // Varlen: without per-entry lengths here, bound by the maxima (callers with lengths refine).
  return per_pair * static_cast<double>(total_q) * static_cast<double>(max_kv_len);
}

}  // namespace attn::kernels
