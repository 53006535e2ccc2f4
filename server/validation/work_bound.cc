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

}  // namespace attn
