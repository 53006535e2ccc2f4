// The GPU compute behind stateful sequences (DESIGN.md §5, §7): pages live in device memory
// (DeviceKvMemory); appends run the paged append kernel and attention runs the split-KV paged
// decode kernel (kernels/decode/, attn/kernels/paged_decode.h) over the layer's block table,
// and prefill steps run the fused kernel reading the pages (attn/kernels/fused_attention.h).
//
// Each call packs its host inputs (q, new k/v, block tables, lengths, offsets, FP8 scales)
// into one pinned buffer, copies it to a device buffer carved from the GPU pool in one
// transfer, enqueues the kernels on this object's stream and copies the outputs back in one
// transfer. Batched steps (AppendBatch/AttendBatch, continuous batching) do the same for many
// sequences at once. Prefill steps (T > kPagedDecodeMaxQueryLen query tokens) over 16-bit pages
// run in one fused paged launch (FusedPagedRun, varlen over those steps, bottom-right causal:
// the T rows are the last T of kv_len keys), the other steps in one decode launch; both share
// the call's upload and download (AttendSplit, kv_cache/attend_split.h). With FP8 pages a
// prefill is cut into chunks of at most 64 query rows that run as separate rows of the decode
// launch: chunk [r0, r1) of a T-token step over kv_len keys attends the first kv_len - T + r1
// keys with bottom-right alignment, which is exactly the rows' bottom-right causal mask
// (DESIGN.md §4).
//
// What it serves (SupportsSequence): q/k/v fp16 or bf16, pages of the same dtype or FP8 E4M3,
// head dim 64 or 128, page sizes that are powers of two. Anything else is refused at
// CreateSequence with the reason.
// Errors: RESOURCE_EXHAUSTED when the GPU pool cannot hold a call's buffers; INTERNAL naming the
// CUDA call on a device fault (the object then stays faulted and every later call gets
// INTERNAL). Thread-safety: thread-safe; calls are serialised on one stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kv_cache/paged_attention_backend.h"
#include "memory/device_pool.h"

namespace attn {

class GpuPagedAttention final : public PagedAttentionBackend {
 public:
  /// Uses CUDA device `device` and carves per-call buffers from `pool` (not owned; outlives
  /// this). Errors: INTERNAL when the stream or the pinned staging buffer cannot be made.
  static StatusOr<std::unique_ptr<GpuPagedAttention>> Create(int device, DevicePool *pool);
  ~GpuPagedAttention() override;

  const std::string &name() const override { return name_; }
  Status SupportsSequence(kernels::DType dtype, kernels::DType kv_dtype, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_dim) const override;
  Status Append(const PagedLayerView &layer, int64_t start, int64_t tokens, const void *k,
                const void *v, kernels::DType src_dtype, int64_t *saturations) override;
  Status CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                  int64_t tokens) override;
  Status Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) override;
  /// One append launch for 16-bit pages; one launch per item for FP8 pages (so each item's
  /// saturations are counted on their own); one transfer each way and one sync either way.
  /// `times` (may be null): CUDA-event times of the copies and kernels.
  Status AppendBatch(PagedAppendItem *items, size_t n, LaunchTimes *times) override;
  /// At most two launches over every item (AttendMany).
  Status AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) override;

  /// One decode launch over many layers' decode-sized steps and one fused paged launch over
  /// their prefill steps (T > kPagedDecodeMaxQueryLen, 16-bit pages; AttendSplit): item i
  /// computes outs[i] for queries[i] over layers[i]. All items must share the sub-pool (layout
  /// class), q dtype, N and scale (INVALID_ARGUMENT otherwise). Used by Attend and by batched
  /// sequence steps. `times` (may be null) gets the CUDA-event times of the upload, the kernels
  /// and the download added.
  Status AttendMany(const PagedLayerView *layers, const PagedQuery *queries, void *const *outs,
                    int64_t count, LaunchTimes *times = nullptr);

 private:
  GpuPagedAttention(int device, DevicePool *pool) : device_(device), pool_(pool) {}
  Status Check(cudaError_t err, const char *what);
  /// Handles a kernel launch that returned `s` (not ok): waits for the stream, marks the object
  /// faulted on INTERNAL, returns `s`. Called with mu_ held.
  Status LaunchFailed(const Status &s);
  /// Makes the pinned staging buffer at least `bytes` long.
  Status ReservePinned(uint64_t bytes);
  /// Records timing event `i` (0: before the upload, 1: after it, 2: after the kernels,
  /// 3: after the download) on the stream. Called with mu_ held.
  Status Mark(int i);
  /// After the stream synchronised: adds the intervals between the four events to `times`
  /// (no-op when null). Called with mu_ held.
  void AddEventTimes(LaunchTimes *times);

  const std::string name_ = "gpu";
  const int device_;
  DevicePool *const pool_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[4] = {nullptr, nullptr, nullptr, nullptr};
  char *pinned_ = nullptr;
  uint64_t pinned_bytes_ = 0;
  std::mutex mu_;
  bool faulted_ = false;
  std::string fault_;
};

/// Rounds `n` up to a multiple of 256 (the alignment of every packed segment).
inline uint64_t AlignSegment(uint64_t n) { return (n + 255) / 256 * 256; }

}  // namespace attn
