// One Extend step on one (sequence, layer) (DESIGN.md §3): check the request
// against the sequence, replay or append k/v at `position` (copy-on-write of a
// shared partial page, FP8 quantisation with defined scales), then attend q
// over the whole layer cache with bottom-right causal alignment (an append-only step,
// ExtendArgs.append_only, attends nothing: no output, kv_len 0). Errors (stored
// state unchanged on every error): NOT_FOUND (see SequenceStore::Acquire),
// INVALID_ARGUMENT (layer, dtypes, shapes, k/v lengths), FAILED_PRECONDITION
// (position is not the layer's length; the message gives the length),
// RESOURCE_EXHAUSTED (pages needed/free); FAILED_PRECONDITION for a step with tensors in a
// CUDA IPC region (ExtendArgs::device) on a backend that does not serve device I/O, or whose
// FP8 scales would have to be derived from device k/v. Such steps are never answered as
// replays nor stored for one (their bytes are not read on the host). Thread-safety:
// thread-safe; steps on one sequence are serialised by its lock.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"
#include "backends/paged/paged_attention_backend.h"
#include "kv_cache/extend_args.h"
#include "kv_cache/sequence_store.h"

namespace attn {

/// Runs the step for `owner`; on success `o` holds the (T, N, H) output bytes (empty for an
/// append-only step).
/// Same as PrepareExtend + Append + Attend + CommitExtend (AbortExtend on failure).
Status ExtendStep(SequenceStore *store, PagedAttentionBackend *backend, const std::string &owner,
                  const ExtendArgs &args, std::string *o, ExtendOutcome *outcome);

/// A step between PrepareExtend and CommitExtend/AbortExtend: the sequence stays locked, the
/// layer's block table already covers the new tokens (pages taken, a shared partial page
/// copied), nothing is written yet. `append` and `attend` describe the compute still to do
/// (their pointers refer into this object and the sequence: keep both alive and unmoved).
/// Used by the batched executor (backends/paged/extend_batch.h) to run many steps in one launch.
struct PreparedExtend {
  LockedSequence locked;
  bool replayed = false;   ///< an exact replay: `o` is already filled, nothing to compute
  /// ExtendArgs.append_only: `attend` has 0 query tokens and no output (nothing to attend).
  bool append_only = false;
  int32_t layer = 0;
  PagedAppendItem append;  ///< k/v to write (tokens T at the old length)
  PagedAttendItem attend;  ///< q over the layer after the append; o points at the output
  int64_t old_len = 0;
  int64_t from_spare = 0;  ///< pages taken from the layer's reserve (given back on abort)
  uint64_t digest = 0;
  /// False for steps with CUDA IPC tensors (ExtendArgs::device): never stored for a replay.
  bool replayable = true;
  std::vector<float> k_scales, v_scales;  ///< FP8 scales in use (derived on first prefill)
};

/// Whether a step is still wanted, asked once the sequence's lock is held (the step may have
/// waited for it behind another step of the same sequence): Ok to go on, else the status the
/// step ends with (CANCELLED, DEADLINE_EXCEEDED), and nothing is applied.
using StillWanted = std::function<Status()>;

/// Locks the sequence, asks `still_wanted` (may be empty: always wanted), checks `args`
/// (layer, dtypes, shapes, position), answers an exact replay from the stored result, or takes
/// the pages the step needs. `o` is resized to the output size (and filled for a replay);
/// `step` must not move until Commit/Abort. Errors as ExtendStep, or `still_wanted`'s; on error
/// nothing is held and nothing changed.
Status PrepareExtend(SequenceStore *store, PagedAttentionBackend *backend, const std::string &owner,
                     const ExtendArgs &args, std::string *o, ExtendOutcome *outcome,
                     PreparedExtend *step, const StillWanted &still_wanted = nullptr);
/// After the append and attend ran: records the step (last step for replays, FP8 scales,
/// saturations), fills `outcome` (with `times`, the launches' times) and unlocks the sequence.
void CommitExtend(SequenceStore *store, PreparedExtend *step, const std::string &o,
                  const LaunchTimes &times, ExtendOutcome *outcome);
/// After a failed append or attend: the layer keeps its old length, the new pages go back
/// (reserved ones to the reserve), `o` is cleared, and the sequence is unlocked.
void AbortExtend(SequenceStore *store, PreparedExtend *step, std::string *o);

}  // namespace attn
