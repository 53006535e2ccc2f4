// The work bound of one Attend call or sequence call (issue 16 item 1): a request's estimated cost on the
// backend it resolved to, against a per-backend-kind bound, so that no single call can hold
// a worker for minutes. The cpu reference is bounded in query-key pairs scored (its time is
// about pairs × (H + a few exp/loads); 2^30 pairs is ~10 s of one core at H = 1), the GPU
// backends in FLOPs (2.5e14 is well under a second of an H200's tensor cores).
// Defaults admit the largest requests frontends send on purpose: a 32 × 512-token packed
// causal prefill with 64 heads is 2.7e8 pairs on cpu; a 32k-token prefill with 64 heads of
// dim 128 is 3.5e13 FLOPs dense on a GPU.
// Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "attn/common/status.h"
#include "kv_cache/extend_args.h"
#include "validation/attend_validator.h"

namespace attn {

/// Bounds per Attend call and per sequence call (all its steps); 0 = unlimited.
struct WorkBounds {
  double max_cpu_score_pairs = 0;  ///< --max-cpu-score-pairs
  double max_gpu_flops = 0;        ///< --max-gpu-flops
};

/// Ok when `v` fits the bound of its backend kind (`on_cpu`: the cpu reference, else a GPU
/// backend). Errors: RESOURCE_EXHAUSTED naming the estimate, the bound and its flag.
Status CheckWorkBound(const ValidatedAttend& v, bool on_cpu, const WorkBounds& bounds);

/// Query-key pairs one sequence step scores: it attends its T query tokens bottom-right causal
/// over the layer's `position` + T keys, so N · Σ_{i<T} (position + i + 1) = N · T · (position +
/// (T + 1) / 2); 0 for an append-only step. `position` is the request's (a step whose position
/// is not the layer's length fails anyway, so the request bounds the real cost).
double StepScorePairs(const ExtendArgs& a);

/// Ok when the step's last token, `a.position` + T, is within the most tokens one layer of its
/// layout can ever hold in a KV pool of `pool_bytes`: K and V of K kv heads × head_dim H per
/// token at one byte an element (FP8 pages, the narrowest), so pool_bytes / (2 · K · H). Beyond
/// it no layer can be that long, so the position cannot be the layer's length: checked before the
/// work bound, whose estimate would otherwise blame the request's cost for a wrong position.
/// Errors: FAILED_PRECONDITION naming the position and the reach.
Status CheckStepReach(const ExtendArgs& a, uint64_t pool_bytes);

/// The work bound of one Extend, ExtendBatch (per-step or packed, all its steps together) or
/// stream message: `pairs` (Σ StepScorePairs) scored on the paged-cpu backend (`on_cpu`)
/// against --max-cpu-score-pairs, else 4 · pairs · `head_dim` FLOPs against --max-gpu-flops.
/// Errors: RESOURCE_EXHAUSTED naming the estimate, the bound and its flag (nothing queued).
Status CheckStepsWorkBound(double pairs, int64_t head_dim, bool on_cpu, const WorkBounds& bounds);

}  // namespace attn
