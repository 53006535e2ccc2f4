#include "validation/work_bound.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace attn {
namespace {

std::string Sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

}  // namespace

Status CheckWorkBound(const ValidatedAttend& v, bool on_cpu, const WorkBounds& bounds) {
  if (on_cpu) {
    if (bounds.max_cpu_score_pairs > 0 && v.score_pairs > bounds.max_cpu_score_pairs) {
      return ResourceExhausted(
          "request scores " + Sci(v.score_pairs) +
          " query-key pairs (Σ T·S·N, halved when causal) on the cpu backend, over the bound "
          "of " +
          Sci(bounds.max_cpu_score_pairs) +
          " per call (--max-cpu-score-pairs); split it into smaller calls or use a GPU backend");
    }
    return Status::Ok();
  }
  if (bounds.max_gpu_flops > 0 && v.flops > bounds.max_gpu_flops) {
    return ResourceExhausted("request costs " + Sci(v.flops) +
                             " FLOPs (4·Σ T·S·N·H, halved when causal), over the bound of " +
                             Sci(bounds.max_gpu_flops) +
                             " per call (--max-gpu-flops); split it into smaller calls");
  }
  return Status::Ok();
}

double StepScorePairs(const ExtendArgs& a) {
  if (a.append_only) return 0.0;
  const double t = static_cast<double>(a.q_shape[0]);
  const double n = static_cast<double>(a.q_shape[1]);
  return n * t * (static_cast<double>(a.position) + (t + 1.0) / 2.0);
}

Status CheckStepReach(const ExtendArgs& a, uint64_t pool_bytes) {
  const int64_t kv_heads = std::max<int64_t>(1, a.k_shape[1]);
  const int64_t head_dim = std::max<int64_t>(1, a.k_shape[2]);
  const uint64_t reach = pool_bytes / (2 * static_cast<uint64_t>(kv_heads * head_dim));
  const int64_t tokens = a.k_shape[0];
  if (a.position <= static_cast<int64_t>(reach) &&
      tokens <= static_cast<int64_t>(reach) - a.position) {
    return Status::Ok();
  }
  return FailedPrecondition(
      "position " + std::to_string(a.position) + " + " + std::to_string(tokens) +
      " tokens is beyond what any layer of " + std::to_string(kv_heads) + " kv heads x head_dim " +
      std::to_string(head_dim) + " can hold in this KV cache (" + std::to_string(reach) +
      " tokens), so it is not the layer's length: send the layer's current "
      "length (GetSequence)");
}

Status CheckStepsWorkBound(double pairs, int64_t head_dim, bool on_cpu, const WorkBounds& bounds) {
  if (on_cpu) {
    if (bounds.max_cpu_score_pairs > 0 && pairs > bounds.max_cpu_score_pairs) {
      return ResourceExhausted(
          "sequence steps score " + Sci(pairs) +
          " query-key pairs (N·T·(position + (T+1)/2) per step) on the paged-cpu backend, over "
          "the bound of " +
          Sci(bounds.max_cpu_score_pairs) +
          " per call (--max-cpu-score-pairs); send the prefill in smaller chunks (several "
          "Extend calls at increasing positions) or use a GPU KV cache");
    }
    return Status::Ok();
  }
  const double flops = 4.0 * pairs * static_cast<double>(head_dim);
  if (bounds.max_gpu_flops > 0 && flops > bounds.max_gpu_flops) {
    return ResourceExhausted("sequence steps cost " + Sci(flops) +
                             " FLOPs (4·H·N·T·(position + (T+1)/2) per step), over the bound of " +
                             Sci(bounds.max_gpu_flops) +
                             " per call (--max-gpu-flops); send the prefill in smaller chunks");
  }
  return Status::Ok();
}

}  // namespace attn
