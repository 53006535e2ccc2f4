// The pieces of one GPU paged call's round trip (GpuPagedAttention, DESIGN.md §7): where an
// append batch's and an attention batch's inputs and outputs sit in the call's staging region
// (Layout*), packing them into the lane's pinned buffer (Pack*), the kernel launches on the
// device copy (Launch*) and copying results out (Finish*). Every segment is 256-byte aligned.
// CUDA builds only. Thread-safety: pure functions of their arguments.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attn/kernels/fused_attention.h"
#include "attn/kernels/paged_decode.h"
#include "backends/paged/attend_split.h"
#include "backends/paged/decode_plan_cache.h"
#include "backends/paged/paged_attention_backend.h"

namespace attn {

/// Rounds `n` up to a multiple of 256 (the alignment of every packed segment).
inline uint64_t AlignSegment(uint64_t n) { return (n + 255) / 256 * 256; }

/// Where one AppendBatch's inputs sit in its region of the staging buffer (offsets from the
/// region's start; the whole region is uploaded, saturation counters included as zeros).
struct PagedAppendJob {
  PagedAppendItem *items = nullptr;
  int64_t B = 0, K = 0, row_bytes = 0, max_new = 1, max_blocks = 1, launches = 0;
  bool fp8 = false;
  kernels::DType src = kernels::DType::kBFloat16;
  uint64_t at_k = 0, at_v = 0, at_bt = 0, at_len = 0, at_off = 0, at_ks = 0, at_vs = 0, at_sat = 0,
           bytes = 0;
};

/// Where one attention call's inputs and outputs sit in its region: [0, upload) is uploaded
/// (the split-KV workspace's arrival counters last, as zeros); the rest of the workspace and
/// o follow on the device only; o comes back over q. A folded append (`appends` set) carries
/// each step's new k/v rows at its q rows (at_nk, at_nv) into the decode launch instead of an
/// append launch of its own.
struct PagedAttendJob {
  const PagedLayerView *layers = nullptr;
  const PagedQuery *queries = nullptr;
  void *const *outs = nullptr;
  const PagedAppendItem *appends = nullptr;  // folded append: one per step, else null
  int64_t count = 0, K = 0, max_blocks = 1, row_bytes = 0, kv_row_bytes = 0;
  bool fp8 = false;
  AttendSplit split;
  kernels::PagedDecodePlan plan;  // when split.decode_entries > 0
  kernels::FusedPagedPlan pplan;  // when split.prefill_entries > 0
  uint64_t qo_bytes = 0, at_q = 0, at_bt = 0, at_len = 0, at_off = 0, at_ks = 0, at_vs = 0,
           at_pbt = 0, at_plen = 0, at_poff = 0, at_nk = 0, at_nv = 0, at_ws = 0, upload = 0,
           at_o = 0, bytes = 0;
};

/// Checks an append call (one KV layout class and source dtype, non-negative starts and counts)
/// and lays out its staging region (job->B == 0: nothing to append). Errors: INVALID_ARGUMENT.
Status LayoutAppend(PagedAppendItem *items, size_t n, PagedAppendJob *job);
/// Packs the append's inputs into `h` (its region of the staging buffer); k/v rows in a CUDA IPC
/// region (PagedAppendItem::device) are left for CopyDeviceInputs (gpu_paged_device_io.h).
void PackAppend(const PagedAppendJob &j, char *h);
/// Enqueues the append launches on `stream` over the device copy `d` of the region.
Status LaunchAppend(const PagedAppendJob &j, char *d, cudaStream_t stream);
/// Adds the FP8 saturation counts downloaded into `h` to their items.
void FinishAppend(const PagedAppendJob &j, const char *h);

/// True when `n` steps' appends can fold into their decode launch (DecodeQueries::new_k): 16-bit
/// pages in the query dtype, every step attends exactly the 1..64 tokens it appends as its
/// newest keys (appends[i].start + tokens == attends[i].layer.kv_len), and no layer (block
/// table) appears twice (a step would otherwise need another step's appended keys in pages);
/// steps with CUDA IPC k/v (PagedAppendItem::device) keep the separate append.
bool FoldableAppend(const PagedAppendItem *appends, const PagedAttendItem *attends, size_t n);

/// Checks an attention call (one layout class, dtype, query heads and scale; 1 <= T <= kv_len),
/// splits it over its launches (AttendSplit), plans them for the CUDA device of `plans` (decode
/// plans from that cache) and lays out its region. `appends`: null, or the steps' appends
/// (FoldableAppend held) to fold into the decode launch. Errors: INVALID_ARGUMENT; the kernels'
/// planning errors.
Status LayoutAttend(DecodePlanCache &plans, const PagedLayerView *layers, const PagedQuery *queries,
                    void *const *outs, int64_t count, PagedAttendJob *job,
                    const PagedAppendItem *appends = nullptr);
/// Packs q, block tables, lengths, offsets and FP8 scales into `h` (q rows in a CUDA IPC region
/// are left for CopyDeviceInputs).
void PackAttend(const PagedAttendJob &j, char *h);
/// Enqueues the decode launch and the fused paged launch (either may be empty) on `stream`.
/// `o_host`: null, or the device address of pinned host memory (the staging region's q rows)
/// where a decode-only call's kernel writes o itself, so no download of o follows (the rows as
/// FinishAttend reads them; the upload of q from there is stream-ordered before the kernel).
Status LaunchAttend(const PagedAttendJob &j, char *d, cudaStream_t stream,
                    void *o_host = nullptr);
/// Copies each step's output rows out of `h` (downloaded over q) to its caller's buffer.
void FinishAttend(const PagedAttendJob &j, const char *h);

}  // namespace attn
