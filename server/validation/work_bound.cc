#include "validation/work_bound.h"

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
