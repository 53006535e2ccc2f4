// The GPU compute behind stateful sequences (DESIGN.md §5, §7): pages live in device memory
// (DeviceKvMemory); appends run the paged append kernel and attention runs the split-KV paged
// decode kernel (kernels/decode/, attn/kernels/paged_decode.h) over the layer's block table,
// and prefill steps run the fused kernel reading the pages (attn/kernels/fused_attention.h).
//
// Each call packs its host inputs (q, new k/v, block tables, lengths, offsets, FP8 scales)
// into one pinned buffer, copies it to a device buffer carved from the GPU pool in one
// transfer, enqueues the kernels on a stream and copies the outputs back, then synchronises
// once; a call without prefill steps or CUDA IPC outputs has its decode kernel write o straight
// into the pinned staging (mapped into the device's address space), so its trip has no download
// of o (~8 KB for a B=1 step of N32 H128: a copy node less, on the device and in the launch). Batched steps (AppendBatch/AttendBatch, continuous batching) do the same for many
// sequences at once, and AppendAttendBatch does a batch's appends and attention in that one
// round trip. Calls run on lanes (device/lane.h: a stream, its timing events and its pinned
// buffer each, one fault latch for all): a call takes a free lane, so calls from different
// batch threads overlap on the device and with each other's host work; one call holds its lane
// until its outputs are copied out. The layout, packing and launches are gpu_paged_jobs.h.
// With CUDA graphs on (the default; --kv-cuda-graphs), a call without prefill steps whose device
// buffer fits kGraphMaxBytes runs in its lane's scratch and is replayed from the lane's captured
// graphs (device/lane.h) under a key of every launch parameter (gpu_paged_graph_key.h): one
// graph launch per call instead of a copy, two to four kernels and a copy, with no host gaps
// between them on the device. Prefill
// steps (T > kPagedDecodeMaxQueryLen query tokens) over 16-bit pages run in one fused paged launch
// (FusedPagedRun, varlen over those steps, bottom-right causal: the T rows are the last T of kv_len
// keys), the other steps in one decode launch; both share the call's upload and download
// (AttendSplit, backends/paged/attend_split.h). With FP8 pages a prefill is cut into chunks of at
// most 64 query rows that run as separate rows of the decode launch: chunk [r0, r1) of a T-token
// step over kv_len keys attends the first kv_len - T + r1 keys with bottom-right alignment, which
// is exactly the rows' bottom-right causal mask (DESIGN.md §4).
//
// What it serves (SupportsSequence): q/k/v fp16 or bf16, pages of the same dtype or FP8 E4M3,
// head dim 64 or 128, page sizes that are powers of two. Anything else is refused at
// CreateSequence with the reason.
// Errors: RESOURCE_EXHAUSTED when the GPU pool cannot hold a call's buffers; INTERNAL naming the
// CUDA call on a device fault (the object then stays faulted and every later call gets
// INTERNAL). Thread-safety: thread-safe; concurrent calls run on different lanes (more callers
// than lanes wait for one). Calls on different sequences touch disjoint pages (a shared page is
// only read; copy-on-write gives a step its own last page), and every call synchronises its
// stream before returning, so a step's next call sees its appends whatever lane it runs on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/paged/decode_plan_cache.h"
#include "backends/paged/paged_attention_backend.h"
#include "device/device_pool.h"
#include "device/lane.h"

namespace attn {

/// The paged backend "paged-gpu": see the file comment.
struct PagedAppendJob;
struct PagedAttendJob;

class GpuPagedAttention final : public PagedAttentionBackend {
 public:
  /// Lanes by default: the server's two batch threads plus room for copy-on-write copies and
  /// direct callers without waiting.
  static constexpr int kDefaultLanes = 4;
  /// Largest device buffer of a call that may run as a CUDA graph (its lane keeps a scratch of
  /// that size): 64 decode steps of N32 K8 H128 bf16 need ~1.3 MiB (q, o and the new K/V rows).
  static constexpr uint64_t kGraphMaxBytes = 8ull << 20;
  /// Uses CUDA device `device` and carves per-call buffers from `pool` (not owned; outlives
  /// this), with `lanes` streams (>= 1; each pins a staging buffer of 1 MiB that grows to the
  /// largest call it ran). `graphs`: replay small calls from CUDA graphs (see the file
  /// comment). `timing_every`: a replayed graph measures its device times once in that many
  /// trips per lane (1: every trip; device/lane.h, --kv-timing-every). Errors: INTERNAL when a
  /// stream or event cannot be made, RESOURCE_EXHAUSTED when the pinned staging buffer cannot.
  static StatusOr<std::unique_ptr<GpuPagedAttention>> Create(int device, DevicePool *pool,
                                                             int lanes = kDefaultLanes,
                                                             bool graphs = true,
                                                             int timing_every = 1);
  ~GpuPagedAttention() override;

  const std::string &name() const override { return name_; }
  const std::string &device() const override { return device_name_; }
  Status SupportsSequence(kernels::DType dtype, kernels::DType kv_dtype, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_dim) const override;
  /// Steps with tensors in CUDA IPC regions on this GPU: copied device to device
  /// (gpu_paged_device_io.h), never as a CUDA graph.
  bool ServesDeviceIo() const override { return true; }
  Status Append(const PagedLayerView &layer, int64_t start, int64_t tokens, const void *k,
                const void *v, kernels::DType src_dtype, int64_t *saturations) override;
  Status CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                  int64_t tokens) override;
  Status Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) override;
  /// One append launch for 16-bit pages; one launch per item for FP8 pages (so each item's
  /// saturations are counted on their own); one transfer each way and one sync either way.
  /// `times` (may be null): CUDA-event times of the copies and kernels.
  Status AppendBatch(PagedAppendItem *items, size_t n, LaunchTimes *times) override;
  /// At most two launches over every item of >= 1 query tokens (AttendMany; items of 0 tokens,
  /// append-only steps, are skipped).
  Status AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) override;
  /// AppendBatch's launches, then AttendBatch's, in one upload, one download and one sync
  /// (one round trip per batch of steps instead of two). `times`: the call's CUDA-event times.
  Status AppendAttendBatch(PagedAppendItem *appends, const PagedAttendItem *attends, size_t n,
                           LaunchTimes *times) override;

  /// One decode launch over many layers' decode-sized steps and one fused paged launch over
  /// their prefill steps (T > kPagedDecodeMaxQueryLen, 16-bit pages; AttendSplit): item i
  /// computes outs[i] for queries[i] over layers[i]. All items must share the sub-pool (layout
  /// class), q dtype, N and scale (INVALID_ARGUMENT otherwise). Used by Attend and by batched
  /// sequence steps. `times` (may be null) gets the CUDA-event times of the upload, the kernels
  /// and the download added.
  Status AttendMany(const PagedLayerView *layers, const PagedQuery *queries, void *const *outs,
                    int64_t count, LaunchTimes *times = nullptr);

  /// Graph replays and captures over all lanes since start (tests, the shutdown log).
  GraphCounts graph_counts();
  /// The decode plans made and reused since start (tests, the shutdown log).
  const DecodePlanCache &plans() const { return plans_; }

 private:
  struct PackedTrip;
  GpuPagedAttention(int device, DevicePool *pool);
  /// One round trip on a free lane: pack, upload, the append's then the attention's launches,
  /// download, sync, copy out. Either job may be null or empty (not both).
  Status Run(PagedAppendJob *a, PagedAttendJob *t, LaunchTimes *times);

  const std::string name_ = "paged-gpu";
  const std::string device_name_ = "gpu";
  const int device_;
  DevicePool *const pool_;
  DecodePlanCache plans_;
  LaneSet lanes_;
};

}  // namespace attn
