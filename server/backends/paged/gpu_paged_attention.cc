#include "backends/paged/gpu_paged_attention.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <vector>

#include "attn/kernels/paged_decode.h"
#include "attn/kernels/paged_kv_cpu.h"
#include "backends/paged/gpu_paged_device_io.h"
#include "backends/paged/gpu_paged_graph_key.h"
#include "backends/paged/gpu_paged_jobs.h"

namespace attn {
namespace {

using kernels::DType;

/// PagedAttendItems as the parallel arrays AttendMany takes, without the items of 0 query
/// tokens (append-only steps: nothing to attend).
struct AttendArrays {
  AttendArrays(const PagedAttendItem *items, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (items[i].query.tokens == 0) continue;
      layers.push_back(items[i].layer);
      queries.push_back(items[i].query);
      outs.push_back(items[i].o);
    }
  }
  int64_t count() const { return static_cast<int64_t>(layers.size()); }
  std::vector<PagedLayerView> layers;
  std::vector<PagedQuery> queries;
  std::vector<void *> outs;
};

}  // namespace

/// One call's round trip on a lane: the append's region first, the attention's after it (both
/// 256-byte aligned) in the lane's staging and in the device block `d`; one upload of both, the
/// appends' launches then the attention's (each step's attention reads its own new keys), the
/// saturation counters and the outputs back (the output over q in staging; a decode-only call's
/// kernel writes it there itself, through the mapped pinned staging), one sync.
struct GpuPagedAttention::PackedTrip final : RoundTrip {
  PagedAppendJob *a = nullptr;
  PagedAttendJob *t = nullptr;
  char *d = nullptr;
  uint64_t t_at = 0, host_bytes = 0;
  bool in_scratch = false;  // d is the lane's scratch: the trip may run as a graph
  // A decode-only call without CUDA IPC outputs: the kernel writes o into the staging over q
  // (mapped pinned memory), so the trip has no download of o.
  bool o_to_host = false;
  void *OHost(Lane &lane) const {
    return o_to_host ? lane.staging_on_device() + t_at + t->at_q : nullptr;
  }

  bool GraphKey(Lane &lane, std::string *key) override {
    if (!in_scratch || HasDeviceIo(a, t)) return false;  // CUDA IPC copies: never in a graph
    GraphKeyWriter w(key);
    w.Put(lane.staging()).Put(d).Put(host_bytes).Put(t_at).Put(o_to_host);
    if (a != nullptr) PutAppendGraphKey(*a, w);
    return t == nullptr || PutAttendGraphKey(*t, w);
  }

  void Pack(Lane &lane) override {
    if (a != nullptr) PackAppend(*a, lane.staging());
    if (t != nullptr) PackAttend(*t, lane.staging() + t_at);
  }
  Status Upload(Lane &lane) override {
    ATTN_RETURN_IF_ERROR(lane.Check(
        cudaMemcpyAsync(d, lane.staging(), host_bytes, cudaMemcpyHostToDevice, lane.stream()),
        "cudaMemcpyAsync H2D"));
    // Inputs in CUDA IPC regions over their (unpacked) rows, after the client's event.
    return CopyDeviceInputs(a, d, t, d + t_at, lane);
  }
  Status Launch(Lane &lane) override {
    if (a != nullptr) ATTN_RETURN_IF_ERROR(LaunchAppend(*a, d, lane.stream()));
    if (t != nullptr) {
      ATTN_RETURN_IF_ERROR(LaunchAttend(*t, d + t_at, lane.stream(), OHost(lane)));
    }
    return Status::Ok();
  }
  Status Download(Lane &lane) override {
    char *h = lane.staging();
    if (t != nullptr) ATTN_RETURN_IF_ERROR(CopyDeviceOutputs(*t, d + t_at, lane));
    if (a != nullptr) {
      ATTN_RETURN_IF_ERROR(lane.Check(
          cudaMemcpyAsync(h + a->at_sat, d + a->at_sat, static_cast<size_t>(a->launches) * 8,
                          cudaMemcpyDeviceToHost, lane.stream()),
          "cudaMemcpyAsync D2H (append)"));
    }
    if (t != nullptr && !o_to_host) {
      // The output comes back into the pinned buffer over q (already uploaded, stream-ordered).
      ATTN_RETURN_IF_ERROR(
          lane.Check(cudaMemcpyAsync(h + t_at + t->at_q, d + t_at + t->at_o, t->qo_bytes,
                                     cudaMemcpyDeviceToHost, lane.stream()),
                     "cudaMemcpyAsync D2H (attention)"));
    }
    return Status::Ok();
  }
  void Finish(Lane &lane) override {
    if (a != nullptr) FinishAppend(*a, lane.staging());
    if (t != nullptr) FinishAttend(*t, lane.staging() + t_at);
  }
};

GpuPagedAttention::GpuPagedAttention(int device, DevicePool *pool)
    : device_(device),
      pool_(pool),
      plans_(device),
      lanes_("CUDA error in GPU paged attention, ", "GPU paged attention is faulted: ") {}

StatusOr<std::unique_ptr<GpuPagedAttention>> GpuPagedAttention::Create(int device, DevicePool *pool,
                                                                       int lanes, bool graphs,
                                                                       int timing_every) {
  std::unique_ptr<GpuPagedAttention> g(new GpuPagedAttention(device, pool));
  ATTN_RETURN_IF_ERROR(
      g->lanes_.Add(lanes, device, 1u << 20, /*growable=*/true, "GPU paged attention"));
  g->lanes_.SetGraphs(graphs);
  g->lanes_.SetTimingEvery(timing_every);
  return g;
}

GraphCounts GpuPagedAttention::graph_counts() { return lanes_.SumGraphCounts(); }

GpuPagedAttention::~GpuPagedAttention() {
  const GraphCounts c = lanes_.SumGraphCounts();
  if (c.replays + c.captures > 0) {
    spdlog::info("GPU paged attention: {} calls replayed a CUDA graph, {} captured one ({} "
                 "evicted, {} dropped when a lane buffer grew)",
                 c.replays, c.captures, c.evictions, c.dropped);
  }
  if (plans_.hits() + plans_.misses() > 0) {
    spdlog::info("GPU paged attention: decode plans: {} reused, {} made", plans_.hits(),
                 plans_.misses());
  }
}

Status GpuPagedAttention::SupportsSequence(DType dtype, DType kv_dtype, int64_t num_heads,
                                           int64_t num_kv_heads, int64_t head_dim) const {
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return FailedPrecondition(std::string("the GPU KV cache serves float16 and bfloat16 "
                                          "sequences, not ") +
                              kernels::DTypeName(dtype) +
                              " (start the server with --kv-device=cpu for other dtypes)");
  }
  kernels::PagedDecodeShape s;
  s.dtype = dtype;
  s.kv_dtype = kv_dtype;
  s.batch = 1;
  s.max_q_len = 1;
  s.max_kv_len = 1;
  s.num_heads = num_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.page_tokens = 16;
  s.scale = 1.f;
  Status st = kernels::PagedDecodeSupports(s);
  if (!st.ok()) {
    return FailedPrecondition("the GPU KV cache cannot serve this sequence: " + st.message());
  }
  return Status::Ok();
}

Status GpuPagedAttention::Append(const PagedLayerView &layer, int64_t start, int64_t tokens,
                                 const void *k, const void *v, DType src_dtype,
                                 int64_t *saturations) {
  PagedAppendItem item;
  item.layer = layer;
  item.start = start;
  item.tokens = tokens;
  item.k = k;
  item.v = v;
  item.src_dtype = src_dtype;
  ATTN_RETURN_IF_ERROR(AppendBatch(&item, 1, nullptr));
  if (saturations != nullptr) *saturations += item.saturations;
  return Status::Ok();
}

Status GpuPagedAttention::Run(PagedAppendJob *a, PagedAttendJob *t, LaunchTimes *times) {
  if (a != nullptr && a->B == 0) a = nullptr;  // nothing to append
  if (a == nullptr && t == nullptr) return Status::Ok();
  PackedTrip trip;
  trip.a = a;
  trip.t = t;
  trip.t_at = a != nullptr ? a->bytes : 0;
  trip.host_bytes = trip.t_at + (t != nullptr ? t->upload : 0);
  const uint64_t device_bytes = trip.t_at + (t != nullptr ? t->bytes : 0);
  ATTN_RETURN_IF_ERROR(lanes_.latch().Faulted());
  LaneLease lease = lanes_.Acquire();
  ATTN_RETURN_IF_ERROR(lease.lane->ReserveStaging(trip.host_bytes));
  // Small trips without prefill steps (decode steps, appends) run in the lane's scratch so that
  // their CUDA graph can be replayed; the others in a buffer of their own from the pool.
  DeviceAllocation own;
  if (lease.lane->graphs() && device_bytes <= kGraphMaxBytes &&
      (t == nullptr || t->split.prefill_entries == 0) &&
      lease.lane->ReserveScratch(pool_, device_bytes).ok()) {
    trip.d = lease.lane->scratch();
    trip.in_scratch = true;
  } else {
    StatusOr<DeviceAllocation> dev = pool_->Allocate(device_bytes);
    if (!dev.ok()) return dev.status();
    own = std::move(*dev);
    trip.d = static_cast<char *>(own.data());
  }
  trip.o_to_host = t != nullptr && t->split.prefill_entries == 0 && !HasDeviceIo(a, t) &&
                   lease.lane->staging_on_device() != nullptr;
  LaneTimes lt;
  ATTN_RETURN_IF_ERROR(lease.lane->Run(trip, times != nullptr ? &lt : nullptr));
  if (times != nullptr) {
    times->h2d_ns += static_cast<int64_t>(lt.h2d_ms * 1e6);
    times->kernel_ns += static_cast<int64_t>(lt.kernel_ms * 1e6);
    times->d2h_ns += static_cast<int64_t>(lt.d2h_ms * 1e6);
    times->pack_ns += lt.pack_ns;
    times->enqueue_ns += lt.enqueue_ns;
    times->wait_ns += lt.wait_ns;
    times->finish_ns += lt.finish_ns;
    times->capture_ns += lt.capture_ns;
    times->graph_launch_ns += lt.graph_launch_ns;
    times->trips += 1;
    times->untimed_trips += lt.timed ? 0 : 1;
  }
  return Status::Ok();
}

Status GpuPagedAttention::AppendBatch(PagedAppendItem *items, size_t n, LaunchTimes *times) {
  if (n == 0) return Status::Ok();
  PagedAppendJob a;
  ATTN_RETURN_IF_ERROR(LayoutAppend(items, n, &a));
  return Run(&a, nullptr, times);
}

Status GpuPagedAttention::AppendAttendBatch(PagedAppendItem *appends,
                                            const PagedAttendItem *attends, size_t n,
                                            LaunchTimes *times) {
  if (n == 0) return Status::Ok();
  const AttendArrays arrays(attends, n);
  PagedAppendJob a;
  ATTN_RETURN_IF_ERROR(LayoutAppend(appends, n, &a));
  if (arrays.count() == 0) return Run(&a, nullptr, times);  // append-only steps
  PagedAttendJob t;
  if (static_cast<size_t>(arrays.count()) == n && FoldableAppend(appends, attends, n)) {
    // One decode launch appends and attends (16-bit decode steps: the common case).
    ATTN_RETURN_IF_ERROR(LayoutAttend(plans_, arrays.layers.data(), arrays.queries.data(),
                                      arrays.outs.data(), arrays.count(), &t, appends));
    return Run(nullptr, &t, times);
  }
  ATTN_RETURN_IF_ERROR(LayoutAttend(plans_, arrays.layers.data(), arrays.queries.data(),
                                    arrays.outs.data(), arrays.count(), &t));
  return Run(&a, &t, times);
}

Status GpuPagedAttention::CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                                   int64_t tokens) {
  (void)tokens;  // whole pages are copied: slots past `tokens` are garbage either way
  ATTN_RETURN_IF_ERROR(lanes_.latch().Faulted());
  LaneLease lease = lanes_.Acquire();
  Lane &lane = *lease.lane;
  const uint64_t page_bytes = static_cast<uint64_t>(kernels::PageBytes(pool));
  ATTN_RETURN_IF_ERROR(lane.Check(cudaSetDevice(device_), "cudaSetDevice"));
  for (void *arr : {pool.k_pages, pool.v_pages}) {
    char *base = static_cast<char *>(arr);
    ATTN_RETURN_IF_ERROR(
        lane.Check(cudaMemcpyAsync(base + static_cast<uint64_t>(dst) * page_bytes,
                                   base + static_cast<uint64_t>(src) * page_bytes, page_bytes,
                                   cudaMemcpyDeviceToDevice, lane.stream()),
                   "cudaMemcpyAsync (copy-on-write page)"));
  }
  return lane.Check(cudaStreamSynchronize(lane.stream()), "copy-on-write page");
}

Status GpuPagedAttention::Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) {
  void *outs[1] = {o};
  return AttendMany(&layer, &q, outs, 1);
}

Status GpuPagedAttention::AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) {
  const AttendArrays arrays(items, n);
  return AttendMany(arrays.layers.data(), arrays.queries.data(), arrays.outs.data(),
                    arrays.count(), times);
}

Status GpuPagedAttention::AttendMany(const PagedLayerView *layers, const PagedQuery *queries,
                                     void *const *outs, int64_t count, LaunchTimes *times) {
  if (count <= 0) return Status::Ok();
  PagedAttendJob t;
  ATTN_RETURN_IF_ERROR(LayoutAttend(plans_, layers, queries, outs, count, &t));
  return Run(nullptr, &t, times);
}

}  // namespace attn
