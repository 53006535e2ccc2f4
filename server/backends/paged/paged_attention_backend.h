// The compute behind stateful sequences, the paged backends (DESIGN.md §5, §7): append new K/V
// into a layer's pages and attend over them. Two implementations share the page format: the CPU
// one ("paged-cpu", CpuPagedAttention, pages in host memory) and the GPU one ("paged-gpu",
// GpuPagedAttention, pages in device memory, kernels/decode/). The name is what a sequence
// step's ExecutionReport.backend says; device() ("cpu" or "gpu") is its ExecutionReport.device.
// Pointers in PagedLayerView.pool are where the pages live; block tables, scales and q/k/v/o
// are host memory, except the CUDA IPC tensors an item flags (DeviceStepIo, GPU only). The
// pages themselves (pools, block tables, sequences) are kv_cache/.
// Thread-safety: implementations must allow concurrent calls on different
// sequences.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"
#include "kv_cache/extend_args.h"

namespace attn {

/// One (sequence, layer) as the compute sees it.
struct PagedLayerView {
  kernels::PagedKvPool pool;  ///< the sub-pool's page arrays
  const int32_t *block_table = nullptr;
  int64_t num_blocks = 0;
  int64_t kv_len = 0;               ///< tokens in the cache (after the append, for Attend)
  const float *k_scales = nullptr;  ///< (K) FP8 only
  const float *v_scales = nullptr;  ///< (K) FP8 only
};

/// What one Attend call is asked to compute: q (T, N, H) of `dtype` against the
/// layer's kv_len tokens, bottom-right causal (query i sees keys j <= kv_len -
/// T + i), softmax `scale`.
struct PagedQuery {
  const void *q = nullptr;
  int64_t tokens = 0;     ///< T
  int64_t num_heads = 0;  ///< N
  kernels::DType dtype = kernels::DType::kBFloat16;
  float scale = 0.f;
  /// Non-null: the step's CUDA IPC tensors (device->q: q is a device address; device->o: o's
  /// rows also go there); only when the backend ServesDeviceIo. Outlives the call.
  const DeviceStepIo *device = nullptr;
};

/// One sequence's append in AppendBatch: k, v ((tokens, K, H) of src_dtype) written at
/// tokens [start, start + tokens) of `layer`.
struct PagedAppendItem {
  PagedLayerView layer;
  int64_t start = 0;
  int64_t tokens = 0;
  const void *k = nullptr;
  const void *v = nullptr;
  kernels::DType src_dtype = kernels::DType::kBFloat16;
  int64_t saturations = 0;  ///< out: FP8 elements clamped while writing this item
  /// Non-null: the step's CUDA IPC tensors (device->k / device->v: that pointer is a device
  /// address); only when the backend ServesDeviceIo. Outlives the call.
  const DeviceStepIo *device = nullptr;
};

/// One sequence's attention in AttendBatch: o ((T, N, H) of query.dtype) over `layer`. An item
/// of query.tokens == 0 (an append-only step, whose o is null) computes nothing.
struct PagedAttendItem {
  PagedLayerView layer;
  PagedQuery query;
  void *o = nullptr;
  /// May be null. Asked by a backend that can stop one item's computation part-way (paged-cpu:
  /// about every 2^20 multiply-adds of a long prefill), possibly from several threads at once:
  /// OK to go on, else why to stop (BatchedExtend::still_running). When it says stop, the
  /// backend writes that status into *stopped (non-null whenever stop is), leaves this item's
  /// o unspecified and goes on with the other items: the call returns OK for them, and the
  /// caller rolls the stopped item's step back. Backends that never stop (paged-gpu) ignore it.
  const std::function<Status()> *stop = nullptr;
  Status *stopped = nullptr;
};

/// Time spent by the launches of one AppendBatch/AttendBatch call, added (+=) by the backend
/// when the caller passes a LaunchTimes: device time of the kernels and of the host<->device
/// copies, in nanoseconds (CUDA events on a GPU, resolution ~0.5 µs; the CPU implementation
/// reports its computation's host wall time as kernel time and no copies).
struct LaunchTimes {
  int64_t kernel_ns = 0;
  int64_t h2d_ns = 0;
  int64_t d2h_ns = 0;
  /// The host's time inside the GPU lanes' round trips (device/lane.h LaneTimes): packing,
  /// enqueuing, waiting for the device, unpacking, and capturing CUDA graphs (a trip's first
  /// run of a key). 0 on the cpu backend.
  int64_t pack_ns = 0, enqueue_ns = 0, wait_ns = 0, finish_ns = 0, capture_ns = 0;
  int64_t graph_launch_ns = 0;  ///< the cudaGraphLaunch calls alone (part of enqueue_ns)
  /// GPU round trips, and those of them that ran without device timing (a CUDA graph replayed
  /// without its event nodes, --kv-timing-every): when untimed_trips > 0 the three device
  /// times above are partial and must be read as "not measured".
  int64_t trips = 0, untimed_trips = 0;
  bool device_timed() const { return untimed_trips == 0; }
  LaunchTimes &operator+=(const LaunchTimes &o) {
    kernel_ns += o.kernel_ns;
    h2d_ns += o.h2d_ns;
    d2h_ns += o.d2h_ns;
    pack_ns += o.pack_ns;
    enqueue_ns += o.enqueue_ns;
    wait_ns += o.wait_ns;
    finish_ns += o.finish_ns;
    capture_ns += o.capture_ns;
    graph_launch_ns += o.graph_launch_ns;
    trips += o.trips;
    untimed_trips += o.untimed_trips;
    return *this;
  }
};

/// A paged backend: see the file comment.
class PagedAttentionBackend {
 public:
  virtual ~PagedAttentionBackend() = default;
  /// The backend's name ("paged-cpu", "paged-gpu"), reported for every step it ran.
  virtual const std::string &name() const = 0;
  /// Where the pages live and the steps run: "cpu" or "gpu".
  virtual const std::string &device() const = 0;
  /// Ok when sequences of this configuration (q/k/v `dtype`, pages of `kv_dtype`, N query
  /// heads, K kv heads, head dim H) can be served; otherwise FAILED_PRECONDITION with the
  /// reason, returned by CreateSequence before anything is stored. Default: everything.
  virtual Status SupportsSequence(kernels::DType dtype, kernels::DType kv_dtype, int64_t num_heads,
                                  int64_t num_kv_heads, int64_t head_dim) const {
    (void)dtype, (void)kv_dtype, (void)num_heads, (void)num_kv_heads, (void)head_dim;
    return Status::Ok();
  }
  /// True when items may carry CUDA IPC tensors (PagedQuery::device, PagedAppendItem::device:
  /// device addresses on the backend's GPU). Default false: the step executor refuses such
  /// steps with FAILED_PRECONDITION before they reach the backend.
  virtual bool ServesDeviceIo() const { return false; }
  /// Writes k, v ((T, K, H) of `src_dtype`) at tokens [start, start + T) of the
  /// layer. FP8 pages add their saturated element count to *saturations.
  virtual Status Append(const PagedLayerView &layer, int64_t start, int64_t tokens, const void *k,
                        const void *v, kernels::DType src_dtype, int64_t *saturations) = 0;
  /// Copies slots [0, tokens) of page src to page dst (copy-on-write).
  virtual Status CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                          int64_t tokens) = 0;
  /// Computes o ((T, N, H) of q.dtype) over the layer's cache.
  virtual Status Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) = 0;
  /// Appends for several (sequence, layer)s in one launch (continuous batching, DESIGN.md §8):
  /// `items[0..n)` are distinct (sequence, layer)s of one sub-pool. Each item's saturations
  /// are added to its own `saturations`. All-or-nothing per call: on error the caller rolls
  /// every item back. `times` (may be null) gets the launch's time added. Default: Append for
  /// each item in order, timed on the host.
  virtual Status AppendBatch(PagedAppendItem *items, size_t n, LaunchTimes *times) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      PagedAppendItem &a = items[i];
      ATTN_RETURN_IF_ERROR(
          Append(a.layer, a.start, a.tokens, a.k, a.v, a.src_dtype, &a.saturations));
    }
    AddHostTime(t0, times);
    return Status::Ok();
  }
  /// Attends several (sequence, layer)s in one launch: `items[0..n)` are distinct
  /// (sequence, layer)s of one sub-pool whose queries share dtype, num_heads and scale (the
  /// caller groups them); q lengths may differ (decode T=1 next to a short prefill). A GPU
  /// implementation runs one paged launch over all of them (block tables, kv_lengths, q
  /// offsets). Items of 0 query tokens are skipped; an item stopped by its `stop` is not an
  /// error (PagedAttendItem). `times` (may be null) gets the launch's time added. Default:
  /// Attend for each item in order (never stopping one), timed on the host.
  virtual Status AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      if (items[i].query.tokens == 0) continue;  // append-only step
      ATTN_RETURN_IF_ERROR(Attend(items[i].layer, items[i].query, items[i].o));
    }
    AddHostTime(t0, times);
    return Status::Ok();
  }

  /// The steps of one batch: appends[i] then attends[i] for i in [0, n) (the same (sequence,
  /// layer)s, same order; each attention reads its own step's new keys), with AppendBatch's and
  /// AttendBatch's rules. All-or-nothing: on error the caller rolls every step back. A GPU
  /// implementation does both in one round trip (one upload, one download, one sync).
  /// Default: AppendBatch, then AttendBatch when it succeeded.
  virtual Status AppendAttendBatch(PagedAppendItem *appends, const PagedAttendItem *attends,
                                   size_t n, LaunchTimes *times) {
    ATTN_RETURN_IF_ERROR(AppendBatch(appends, n, times));
    return AttendBatch(attends, n, times);
  }

 protected:
  /// Adds the host wall time since `t0` to times->kernel_ns (times may be null).
  static void AddHostTime(std::chrono::steady_clock::time_point t0, LaunchTimes *times) {
    if (times == nullptr) return;
    times->kernel_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  }
};

}  // namespace attn
