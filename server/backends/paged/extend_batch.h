// Continuous batching of sequence steps (DESIGN.md §8): many Extend steps on distinct
// sequences, from different RPCs (Extend, ExtendBatch entries, ExtendStream messages), run as
// one append launch and one paged attention launch per compatible group.
//
// Each step is prepared on its own (PrepareExtend: lock, checks, replay, pages), in sequence-id
// order so that two threads running overlapping batches never deadlock. Prepared steps are
// grouped by (sub-pool, q dtype, q heads, scale) and each group runs AppendAttendBatch on the
// PagedAttentionBackend (appends before the attention of the same step; one round trip); a
// failed launch rolls back every step of its group (AbortExtend) and reports the error on
// each. Per-(sequence, layer) rules are those of ExtendStep: position checks, exact replays
// answered from the stored result, concurrent steps on one sequence run one after the other
// (a batch never holds two steps of one sequence: those run after the batch, in order). A step
// whose `still_wanted` says no once its sequence is locked is dropped unapplied, and so is one
// whose `still_running` says no while a backend that polls it (paged-cpu) computes the step.
// Thread-safety: thread-safe; the steps' outputs and outcomes are written by this call only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attn/common/status.h"
#include "backends/paged/extend_step.h"
#include "backends/paged/paged_attention_backend.h"
#include "kv_cache/sequence_store.h"

namespace attn {

/// One step of a batch: inputs, and where its result goes.
struct BatchedExtend {
  const ExtendArgs *args = nullptr;    ///< decoded request (pointers alias its bytes)
  const std::string *owner = nullptr;  ///< caller identity
  std::string *o = nullptr;            ///< out: (T, N, H) output bytes
  ExtendOutcome *outcome = nullptr;    ///< out
  Status status;                       ///< out: the step's result
  int64_t launch_size = 0;    ///< out: steps in the attention launch it ran in (0: none ran)
  int64_t launch_tokens = 0;  ///< out: query tokens of that launch
  /// Asked once the sequence is locked (PrepareExtend); may be empty.
  StillWanted still_wanted;
  /// Asked while the step's attention runs, by a backend that can stop it part-way
  /// (PagedAttendItem::stop; paged-cpu), from several threads at once; may be empty. A step
  /// it stops is rolled back like a failed launch, alone: the other steps are committed.
  StillWanted still_running;
  /// out: the step was dropped by `still_wanted` or `still_running` (not applied; `status`
  /// says why).
  bool dropped = false;
  /// Where the backend writes why `still_running` stopped the step (scratch of this call).
  Status stopped;
};

/// Host wall time of the phases of RunExtendSteps, in nanoseconds (added to, never reset):
/// preparing the steps (locks, checks, replays, pages), the backend's AppendAttendBatch calls
/// (staging, copies, kernels and sync; on a GPU also the wait for a free lane), and committing.
struct StepPhases {
  int64_t prepare_ns = 0;
  int64_t launch_ns = 0;
  int64_t commit_ns = 0;
  StepPhases &operator+=(const StepPhases &o) {
    prepare_ns += o.prepare_ns;
    launch_ns += o.launch_ns;
    commit_ns += o.commit_ns;
    return *this;
  }
};

/// Runs `steps[0..n)`; every step gets its own status (errors as ExtendStep). `total` (may be
/// null) gets the time of every launch this call made added (LaunchTimes); `phases` (may be
/// null) the host time of its phases.
void RunExtendSteps(SequenceStore *store, PagedAttentionBackend *backend, BatchedExtend *steps,
                    size_t n, LaunchTimes *total = nullptr, StepPhases *phases = nullptr);

}  // namespace attn
