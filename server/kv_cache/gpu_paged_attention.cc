#include "kv_cache/gpu_paged_attention.h"

#include <algorithm>
#include <cstring>

#include "attn/kernels/fused_attention.h"
#include "attn/kernels/paged_decode.h"
#include "attn/kernels/paged_kv_cpu.h"
#include "kv_cache/attend_split.h"

namespace attn {
namespace {

using kernels::DType;

/// Offsets of 256-byte aligned segments in one staging buffer.
struct Segments {
  uint64_t total = 0;
  uint64_t Add(uint64_t bytes) {
    const uint64_t at = total;
    total += AlignSegment(bytes);
    return at;
  }
};

/// PagedAttendItems as the parallel arrays AttendMany takes.
struct AttendArrays {
  AttendArrays(const PagedAttendItem *items, size_t n) : layers(n), queries(n), outs(n) {
    for (size_t i = 0; i < n; ++i) {
      layers[i] = items[i].layer;
      queries[i] = items[i].query;
      outs[i] = items[i].o;
    }
  }
  std::vector<PagedLayerView> layers;
  std::vector<PagedQuery> queries;
  std::vector<void *> outs;
};

bool SamePool(const kernels::PagedKvPool &a, const kernels::PagedKvPool &b) {
  return a.k_pages == b.k_pages && a.v_pages == b.v_pages && a.page_tokens == b.page_tokens &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim && a.kv_dtype == b.kv_dtype;
}

}  // namespace

/// One stream with its timing events and pinned staging buffer; a call holds a lane's mutex
/// from packing its inputs until its outputs are copied out.
struct GpuPagedAttention::Lane {
  std::mutex mu;
  cudaStream_t stream = nullptr;
  cudaEvent_t events[4] = {nullptr, nullptr, nullptr, nullptr};
  char *pinned = nullptr;
  uint64_t pinned_bytes = 0;
};

/// Where one AppendBatch's inputs sit in its region of the staging buffer (offsets from the
/// region's start; the whole region is uploaded, saturation counters included as zeros).
struct GpuPagedAttention::AppendJob {
  PagedAppendItem *items = nullptr;
  int64_t B = 0, K = 0, row_bytes = 0, max_new = 1, max_blocks = 1, launches = 0;
  bool fp8 = false;
  DType src = DType::kBFloat16;
  uint64_t at_k = 0, at_v = 0, at_bt = 0, at_len = 0, at_off = 0, at_ks = 0, at_vs = 0,
           at_sat = 0, bytes = 0;
};

/// Where one attention call's inputs and outputs sit in its region: [0, upload) is uploaded;
/// o and the split-KV workspace follow on the device only; o comes back over q.
struct GpuPagedAttention::AttendJob {
  const PagedLayerView *layers = nullptr;
  const PagedQuery *queries = nullptr;
  void *const *outs = nullptr;
  int64_t count = 0, K = 0, max_blocks = 1, row_bytes = 0;
  bool fp8 = false;
  AttendSplit split;
  kernels::PagedDecodePlan plan;   // when split.decode_entries > 0
  kernels::FusedPagedPlan pplan;   // when split.prefill_entries > 0
  uint64_t qo_bytes = 0, at_q = 0, at_bt = 0, at_len = 0, at_off = 0, at_ks = 0, at_vs = 0,
           at_pbt = 0, at_plen = 0, at_poff = 0, upload = 0, at_o = 0, at_ws = 0, bytes = 0;
};

GpuPagedAttention::GpuPagedAttention(int device, DevicePool *pool)
    : device_(device), pool_(pool) {}

StatusOr<std::unique_ptr<GpuPagedAttention>> GpuPagedAttention::Create(int device,
                                                                       DevicePool *pool,
                                                                       int lanes) {
  std::unique_ptr<GpuPagedAttention> g(new GpuPagedAttention(device, pool));
  if (cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("GPU paged attention: cannot use device " + std::to_string(device));
  }
  for (int i = 0; i < std::max(1, lanes); ++i) {
    auto lane = std::make_unique<Lane>();
    if (cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking) != cudaSuccess) {
      (void)cudaGetLastError();
      lane->stream = nullptr;
      return Internal("GPU paged attention: cannot create a stream on device " +
                      std::to_string(device));
    }
    g->lanes_.push_back(std::move(lane));
    Lane &l = *g->lanes_.back();
    for (cudaEvent_t &e : l.events) {
      if (cudaEventCreate(&e) != cudaSuccess) {
        (void)cudaGetLastError();
        e = nullptr;
        return Internal("GPU paged attention: cannot create a timing event on device " +
                        std::to_string(device));
      }
    }
    ATTN_RETURN_IF_ERROR(ReservePinned(&l, 1u << 20));
  }
  return g;
}

GpuPagedAttention::~GpuPagedAttention() {
  for (auto &lane : lanes_) {
    if (lane->stream != nullptr) {
      (void)cudaStreamSynchronize(lane->stream);
      (void)cudaStreamDestroy(lane->stream);
    }
    for (cudaEvent_t e : lane->events) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (lane->pinned != nullptr) (void)cudaFreeHost(lane->pinned);
  }
}

Status GpuPagedAttention::Faulted() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (!faulted_) return Status::Ok();
  return Internal("GPU paged attention is faulted: " + fault_);
}

void GpuPagedAttention::SetFault(const std::string &what) {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (faulted_) return;  // keep the first cause
  faulted_ = true;
  fault_ = what;
}

Status GpuPagedAttention::Check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  const std::string cause = std::string(what) + ": " + cudaGetErrorString(err);
  SetFault(cause);
  return Internal("CUDA error in GPU paged attention, " + cause);
}

Status GpuPagedAttention::LaunchFailed(Lane *lane, const Status &s) {
  // A rejected launch (INVALID_ARGUMENT) leaves the device healthy: wait for the copies already
  // enqueued so the caller's buffers can go back; INTERNAL is a device fault.
  (void)cudaStreamSynchronize(lane->stream);
  if (s.code() == StatusCode::kInternal) SetFault(s.message());
  return s;
}

std::unique_lock<std::mutex> GpuPagedAttention::AcquireLane(Lane **out) {
  const size_t n = lanes_.size();
  const size_t start = next_lane_.fetch_add(1, std::memory_order_relaxed) % n;
  for (size_t k = 0; k < n; ++k) {
    Lane *l = lanes_[(start + k) % n].get();
    std::unique_lock<std::mutex> lock(l->mu, std::try_to_lock);
    if (lock.owns_lock()) {
      *out = l;
      return lock;
    }
  }
  *out = lanes_[start].get();
  return std::unique_lock<std::mutex>((*out)->mu);
}

void GpuPagedAttention::AddEventTimes(Lane *lane, LaunchTimes *times) {
  if (times == nullptr) return;
  float ms[3] = {0.f, 0.f, 0.f};
  for (int i = 0; i < 3; ++i) {
    if (cudaEventElapsedTime(&ms[i], lane->events[i], lane->events[i + 1]) != cudaSuccess) {
      (void)cudaGetLastError();  // timing only: never fails the call
      ms[i] = 0.f;
    }
  }
  times->h2d_ns += static_cast<int64_t>(ms[0] * 1e6);
  times->kernel_ns += static_cast<int64_t>(ms[1] * 1e6);
  times->d2h_ns += static_cast<int64_t>(ms[2] * 1e6);
}

Status GpuPagedAttention::ReservePinned(Lane *lane, uint64_t bytes) {
  if (bytes <= lane->pinned_bytes) return Status::Ok();
  uint64_t want = std::max<uint64_t>(lane->pinned_bytes * 2, 1u << 20);
  while (want < bytes) want *= 2;
  if (lane->pinned != nullptr) (void)cudaFreeHost(lane->pinned);
  lane->pinned = nullptr;
  lane->pinned_bytes = 0;
  void *p = nullptr;
  if (cudaHostAlloc(&p, want, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return ResourceExhausted("GPU paged attention: cannot pin " + std::to_string(want) +
                             " bytes of host staging memory");
  }
  lane->pinned = static_cast<char *>(p);
  lane->pinned_bytes = want;
  return Status::Ok();
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

Status GpuPagedAttention::LayoutAppend(PagedAppendItem *items, size_t n, AppendJob *job) const {
  const kernels::PagedKvPool &pool = items[0].layer.pool;
  AppendJob &j = *job;
  j.items = items;
  j.src = items[0].src_dtype;
  j.fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  j.K = pool.num_kv_heads;
  j.row_bytes = j.K * pool.head_dim * kernels::DTypeSize(j.src);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const PagedAppendItem &a = items[i];
    if (!SamePool(a.layer.pool, pool) || a.src_dtype != j.src) {
      return InvalidArgument("GPU paged append: the items of one launch must share the KV "
                             "layout class and the source dtype");
    }
    if (a.tokens < 0 || a.start < 0) {
      return InvalidArgument("GPU paged append: negative start or token count");
    }
    total += a.tokens;
    j.max_new = std::max(j.max_new, a.tokens);
    j.max_blocks = std::max(j.max_blocks, a.layer.num_blocks);
  }
  if (total == 0) return Status::Ok();  // nothing to append: j.B stays 0
  j.B = static_cast<int64_t>(n);
  // FP8 pools count saturations per item, so each item is its own launch (one counter each);
  // 16-bit pools append every item in one launch.
  j.launches = j.fp8 ? j.B : 1;
  Segments seg;
  j.at_k = seg.Add(static_cast<uint64_t>(total * j.row_bytes));
  j.at_v = seg.Add(static_cast<uint64_t>(total * j.row_bytes));
  j.at_bt = seg.Add(static_cast<uint64_t>(j.B * j.max_blocks) * 4);
  j.at_len = seg.Add(static_cast<uint64_t>(j.B) * 4);
  j.at_off = seg.Add(static_cast<uint64_t>(j.B + 1) * 8);
  j.at_ks = seg.Add(j.fp8 ? static_cast<uint64_t>(j.B * j.K) * 4 : 0);
  j.at_vs = seg.Add(j.fp8 ? static_cast<uint64_t>(j.B * j.K) * 4 : 0);
  j.at_sat = seg.Add(static_cast<uint64_t>(j.launches) * 8);
  j.bytes = seg.total;
  return Status::Ok();
}

void GpuPagedAttention::PackAppend(const AppendJob &j, char *h) {
  auto *bt = reinterpret_cast<int32_t *>(h + j.at_bt);
  auto *len = reinterpret_cast<int32_t *>(h + j.at_len);
  auto *off = reinterpret_cast<int64_t *>(h + j.at_off);
  off[0] = 0;
  for (int64_t b = 0; b < j.B; ++b) {
    const PagedAppendItem &a = j.items[b];
    const uint64_t at = static_cast<uint64_t>(off[b] * j.row_bytes);
    std::memcpy(h + j.at_k + at, a.k, static_cast<size_t>(a.tokens * j.row_bytes));
    std::memcpy(h + j.at_v + at, a.v, static_cast<size_t>(a.tokens * j.row_bytes));
    std::memcpy(bt + b * j.max_blocks, a.layer.block_table,
                static_cast<size_t>(a.layer.num_blocks) * 4);
    std::fill(bt + b * j.max_blocks + a.layer.num_blocks, bt + (b + 1) * j.max_blocks, 0);
    len[b] = static_cast<int32_t>(a.start + a.tokens);
    off[b + 1] = off[b] + a.tokens;
    if (j.fp8) {
      std::memcpy(h + j.at_ks + static_cast<uint64_t>(b * j.K) * 4, a.layer.k_scales,
                  static_cast<size_t>(j.K) * 4);
      std::memcpy(h + j.at_vs + static_cast<uint64_t>(b * j.K) * 4, a.layer.v_scales,
                  static_cast<size_t>(j.K) * 4);
    }
  }
  std::memset(h + j.at_sat, 0, static_cast<size_t>(j.launches) * 8);
}

Status GpuPagedAttention::LaunchAppend(const AppendJob &j, char *d, cudaStream_t stream) {
  const kernels::PagedKvPool &pool = j.items[0].layer.pool;
  for (int64_t l = 0; l < j.launches; ++l) {
    // Launch l covers items [first, first + count).
    const int64_t first = j.fp8 ? l : 0, count = j.fp8 ? 1 : j.B;
    if (j.fp8 && j.items[first].tokens == 0) continue;
    kernels::PagedBatch batch;
    batch.batch = count;
    batch.block_tables = reinterpret_cast<const int32_t *>(d + j.at_bt) + first * j.max_blocks;
    batch.block_table_stride = j.max_blocks;
    batch.kv_lengths = reinterpret_cast<const int32_t *>(d + j.at_len) + first;
    batch.k_scales = j.fp8 ? reinterpret_cast<const float *>(d + j.at_ks) + first * j.K : nullptr;
    batch.v_scales = j.fp8 ? reinterpret_cast<const float *>(d + j.at_vs) + first * j.K : nullptr;
    // Offsets are relative to the k/v pointers: shift the pointers, keep the prefix sums.
    kernels::AppendRows rows;
    rows.dtype = j.src;
    rows.k = d + j.at_k;
    rows.v = d + j.at_v;
    rows.new_offsets = reinterpret_cast<const int64_t *>(d + j.at_off) + first;
    rows.max_new_tokens = j.fp8 ? std::max<int64_t>(j.items[first].tokens, 1) : j.max_new;
    rows.saturations = reinterpret_cast<unsigned long long *>(d + j.at_sat) + l;
    ATTN_RETURN_IF_ERROR(kernels::PagedAppendRun(pool, batch, rows, stream));
  }
  return Status::Ok();
}

void GpuPagedAttention::FinishAppend(const AppendJob &j, const char *h) {
  if (!j.fp8) return;
  for (int64_t l = 0; l < j.launches; ++l) {
    unsigned long long sat = 0;
    std::memcpy(&sat, h + j.at_sat + static_cast<uint64_t>(l) * 8, 8);
    j.items[l].saturations += static_cast<int64_t>(sat);
  }
}

Status GpuPagedAttention::LayoutAttend(const PagedLayerView *layers, const PagedQuery *queries,
                                       void *const *outs, int64_t count, AttendJob *job) const {
  AttendJob &j = *job;
  j.layers = layers;
  j.queries = queries;
  j.outs = outs;
  j.count = count;
  const kernels::PagedKvPool &pool = layers[0].pool;
  const PagedQuery &q0 = queries[0];
  const int64_t N = q0.num_heads, H = pool.head_dim;
  j.K = pool.num_kv_heads;
  j.fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  const int64_t esize = kernels::DTypeSize(q0.dtype);
  constexpr int64_t kChunk = kernels::kPagedDecodeMaxQueryLen;

  // Steps longer than kChunk query tokens run in one fused paged launch when the kernel takes
  // this layout class (16-bit pages, head dim 64/128); the others (and all of them with FP8
  // pages) run in one decode launch, cut into chunks of at most kChunk rows (AttendSplit).
  kernels::FusedPagedShape pshape;
  pshape.dtype = q0.dtype;
  pshape.kv_dtype = pool.kv_dtype;
  pshape.num_heads = N;
  pshape.num_kv_heads = j.K;
  pshape.head_dim = H;
  pshape.page_tokens = pool.page_tokens;
  pshape.scale = q0.scale;  // mask: bottom-right causal (the default)
  const bool prefill_ok = kernels::FusedPagedSupports(pshape).ok();
  std::vector<int64_t> tokens(static_cast<size_t>(count)), kv_lens(static_cast<size_t>(count));
  int64_t total_q = 0;
  for (int64_t i = 0; i < count; ++i) {
    const PagedQuery &qi = queries[i];
    if (!SamePool(layers[i].pool, pool) || qi.dtype != q0.dtype || qi.num_heads != N ||
        qi.scale != q0.scale) {
      return InvalidArgument("GPU paged attention: the steps of one launch must share the KV "
                             "layout class, dtype, query heads and scale");
    }
    if (qi.tokens < 1 || qi.tokens > layers[i].kv_len) {
      return InvalidArgument("GPU paged attention: " + std::to_string(qi.tokens) +
                             " query tokens over " + std::to_string(layers[i].kv_len) + " keys");
    }
    tokens[i] = qi.tokens;
    kv_lens[i] = layers[i].kv_len;
    total_q += qi.tokens;
    j.max_blocks = std::max(j.max_blocks, layers[i].num_blocks);
  }
  j.split = SplitAttendSteps(tokens.data(), kv_lens.data(), count, prefill_ok, kChunk);
  const int64_t rows = j.split.decode_entries, prows = j.split.prefill_entries;
  if (rows > 0) {
    kernels::PagedDecodeShape shape;
    shape.source = kernels::KvSource::kPaged;
    shape.dtype = q0.dtype;
    shape.kv_dtype = pool.kv_dtype;
    shape.batch = rows;
    shape.max_q_len = j.split.decode_max_q;
    shape.max_kv_len = j.split.decode_max_kv;
    shape.num_heads = N;
    shape.num_kv_heads = j.K;
    shape.head_dim = H;
    shape.page_tokens = pool.page_tokens;
    shape.scale = q0.scale;
    StatusOr<kernels::PagedDecodePlan> plan = kernels::PagedDecodePlanFor(shape, device_);
    if (!plan.ok()) return plan.status();
    j.plan = *plan;
  }
  if (prows > 0) {
    pshape.batch = prows;
    pshape.max_q_len = j.split.prefill_max_q;
    pshape.max_kv_len = j.split.prefill_max_kv;
    pshape.total_q = j.split.prefill_rows;
    StatusOr<kernels::FusedPagedPlan> pplan = kernels::FusedPagedPlanFor(pshape, device_);
    if (!pplan.ok()) return pplan.status();
    j.pplan = *pplan;
  }

  j.row_bytes = N * H * esize;
  j.qo_bytes = static_cast<uint64_t>(total_q * j.row_bytes);
  Segments seg;
  j.at_q = seg.Add(j.qo_bytes);
  j.at_bt = seg.Add(static_cast<uint64_t>(rows * j.max_blocks) * 4);
  j.at_len = seg.Add(static_cast<uint64_t>(rows) * 4);
  j.at_off = seg.Add(static_cast<uint64_t>(rows + 1) * 8);
  j.at_ks = seg.Add(j.fp8 ? static_cast<uint64_t>(rows * j.K) * 4 : 0);
  j.at_vs = seg.Add(j.fp8 ? static_cast<uint64_t>(rows * j.K) * 4 : 0);
  j.at_pbt = seg.Add(static_cast<uint64_t>(prows * j.max_blocks) * 4);
  j.at_plen = seg.Add(static_cast<uint64_t>(prows) * 4);
  j.at_poff = seg.Add(prows > 0 ? static_cast<uint64_t>(prows + 1) * 8 : 0);
  j.upload = seg.total;
  j.at_o = seg.Add(j.qo_bytes);
  j.at_ws = seg.Add(rows > 0 ? j.plan.workspace_bytes : 0);
  j.bytes = seg.total;
  return Status::Ok();
}

void GpuPagedAttention::PackAttend(const AttendJob &j, char *h) {
  constexpr int64_t kChunk = kernels::kPagedDecodeMaxQueryLen;
  auto *bt = reinterpret_cast<int32_t *>(h + j.at_bt);
  auto *len = reinterpret_cast<int32_t *>(h + j.at_len);
  auto *off = reinterpret_cast<int64_t *>(h + j.at_off);
  auto *ks = reinterpret_cast<float *>(h + j.at_ks);
  auto *vs = reinterpret_cast<float *>(h + j.at_vs);
  auto *pbt = reinterpret_cast<int32_t *>(h + j.at_pbt);
  auto *plen = reinterpret_cast<int32_t *>(h + j.at_plen);
  auto *poff = reinterpret_cast<int64_t *>(h + j.at_poff);
  const int64_t mb = j.max_blocks;
  if (j.split.decode_entries > 0) off[0] = 0;
  if (j.split.prefill_entries > 0) poff[0] = 0;
  for (int64_t i = 0; i < j.count; ++i) {
    const PagedLayerView &L = j.layers[i];
    const AttendSplit::Item &it = j.split.items[i];
    const int64_t T = j.queries[i].tokens;
    std::memcpy(h + j.at_q + static_cast<uint64_t>(it.q_row * j.row_bytes), j.queries[i].q,
                static_cast<size_t>(T * j.row_bytes));
    if (it.prefill) {
      // One sequence of the fused launch: its T rows are the last T of kv_len keys.
      const int64_t p = it.entry;
      std::memcpy(pbt + p * mb, L.block_table, static_cast<size_t>(L.num_blocks) * 4);
      std::fill(pbt + p * mb + L.num_blocks, pbt + (p + 1) * mb, 0);
      plen[p] = static_cast<int32_t>(L.kv_len);
      poff[p + 1] = poff[p] + T;
      continue;
    }
    int64_t r = it.entry;
    for (int64_t r0 = 0; r0 < T; r0 += kChunk, ++r) {
      const int64_t r1 = std::min(T, r0 + kChunk);
      std::memcpy(bt + r * mb, L.block_table, static_cast<size_t>(L.num_blocks) * 4);
      std::fill(bt + r * mb + L.num_blocks, bt + (r + 1) * mb, 0);
      len[r] = static_cast<int32_t>(L.kv_len - T + r1);
      off[r + 1] = it.q_row + r1;
      if (j.fp8) {
        std::memcpy(ks + r * j.K, L.k_scales, static_cast<size_t>(j.K) * 4);
        std::memcpy(vs + r * j.K, L.v_scales, static_cast<size_t>(j.K) * 4);
      }
    }
  }
}

Status GpuPagedAttention::LaunchAttend(const AttendJob &j, char *d, cudaStream_t stream) {
  const kernels::PagedKvPool &pool = j.layers[0].pool;
  if (j.split.decode_entries > 0) {
    // Decode rows are the first split.decode_rows rows of q/o.
    kernels::PagedBatch batch;
    batch.batch = j.split.decode_entries;
    batch.block_tables = reinterpret_cast<const int32_t *>(d + j.at_bt);
    batch.block_table_stride = j.max_blocks;
    batch.kv_lengths = reinterpret_cast<const int32_t *>(d + j.at_len);
    batch.k_scales = j.fp8 ? reinterpret_cast<const float *>(d + j.at_ks) : nullptr;
    batch.v_scales = j.fp8 ? reinterpret_cast<const float *>(d + j.at_vs) : nullptr;
    kernels::DecodeQueries dq;
    dq.q = d + j.at_q;
    dq.q_offsets = reinterpret_cast<const int64_t *>(d + j.at_off);
    dq.o = d + j.at_o;
    ATTN_RETURN_IF_ERROR(kernels::PagedDecodeRun(
        j.plan, pool, batch, dq, j.plan.workspace_bytes > 0 ? d + j.at_ws : nullptr, stream));
  }
  if (j.split.prefill_entries > 0) {
    // Prefill rows follow the decode rows (row_bytes is a multiple of 128: aligned).
    const uint64_t at_rows = static_cast<uint64_t>(j.split.decode_rows * j.row_bytes);
    kernels::PagedBatch batch;
    batch.batch = j.split.prefill_entries;
    batch.block_tables = reinterpret_cast<const int32_t *>(d + j.at_pbt);
    batch.block_table_stride = j.max_blocks;
    batch.kv_lengths = reinterpret_cast<const int32_t *>(d + j.at_plen);
    kernels::FusedPagedQueries fq;
    fq.q = d + j.at_q + at_rows;
    fq.q_offsets = reinterpret_cast<const int64_t *>(d + j.at_poff);
    fq.o = d + j.at_o + at_rows;
    ATTN_RETURN_IF_ERROR(kernels::FusedPagedRun(j.pplan, pool, batch, fq, stream));
  }
  return Status::Ok();
}

void GpuPagedAttention::FinishAttend(const AttendJob &j, const char *h) {
  for (int64_t i = 0; i < j.count; ++i) {
    const uint64_t bytes = static_cast<uint64_t>(j.queries[i].tokens * j.row_bytes);
    std::memcpy(j.outs[i], h + j.at_q + static_cast<uint64_t>(j.split.items[i].q_row * j.row_bytes),
                bytes);
  }
}

Status GpuPagedAttention::Run(AppendJob *a, AttendJob *t, LaunchTimes *times) {
  if (a != nullptr && a->B == 0) a = nullptr;  // nothing to append
  if (a == nullptr && t == nullptr) return Status::Ok();
  // The append's region first, the attention's after it (both 256-byte aligned).
  const uint64_t t_at = a != nullptr ? a->bytes : 0;
  const uint64_t host_bytes = t_at + (t != nullptr ? t->upload : 0);
  const uint64_t device_bytes = t_at + (t != nullptr ? t->bytes : 0);
  ATTN_RETURN_IF_ERROR(Faulted());
  Lane *lane = nullptr;
  std::unique_lock<std::mutex> lock = AcquireLane(&lane);
  ATTN_RETURN_IF_ERROR(ReservePinned(lane, host_bytes));
  StatusOr<DeviceAllocation> dev = pool_->Allocate(device_bytes);
  if (!dev.ok()) return dev.status();
  char *h = lane->pinned;
  char *d = static_cast<char *>(dev->data());
  if (a != nullptr) PackAppend(*a, h);
  if (t != nullptr) PackAttend(*t, h + t_at);

  cudaStream_t stream = lane->stream;
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  ATTN_RETURN_IF_ERROR(Check(cudaEventRecord(lane->events[0], stream), "cudaEventRecord"));
  ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(d, h, host_bytes, cudaMemcpyHostToDevice, stream),
                             "cudaMemcpyAsync H2D"));
  ATTN_RETURN_IF_ERROR(Check(cudaEventRecord(lane->events[1], stream), "cudaEventRecord"));
  // Appends first: each step's attention reads its own new keys (stream order).
  if (a != nullptr) {
    Status s = LaunchAppend(*a, d, stream);
    if (!s.ok()) return LaunchFailed(lane, s);
  }
  if (t != nullptr) {
    Status s = LaunchAttend(*t, d + t_at, stream);
    if (!s.ok()) return LaunchFailed(lane, s);
  }
  ATTN_RETURN_IF_ERROR(Check(cudaEventRecord(lane->events[2], stream), "cudaEventRecord"));
  if (a != nullptr) {
    ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h + a->at_sat, d + a->at_sat,
                                               static_cast<size_t>(a->launches) * 8,
                                               cudaMemcpyDeviceToHost, stream),
                               "cudaMemcpyAsync D2H (append)"));
  }
  if (t != nullptr) {
    // The output comes back into the pinned buffer over q (already uploaded, stream-ordered).
    ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h + t_at + t->at_q, d + t_at + t->at_o,
                                               t->qo_bytes, cudaMemcpyDeviceToHost, stream),
                               "cudaMemcpyAsync D2H (attention)"));
  }
  ATTN_RETURN_IF_ERROR(Check(cudaEventRecord(lane->events[3], stream), "cudaEventRecord"));
  ATTN_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  AddEventTimes(lane, times);
  if (a != nullptr) FinishAppend(*a, h);
  if (t != nullptr) FinishAttend(*t, h + t_at);
  return Status::Ok();
}

Status GpuPagedAttention::AppendBatch(PagedAppendItem *items, size_t n, LaunchTimes *times) {
  if (n == 0) return Status::Ok();
  AppendJob a;
  ATTN_RETURN_IF_ERROR(LayoutAppend(items, n, &a));
  return Run(&a, nullptr, times);
}

Status GpuPagedAttention::AppendAttendBatch(PagedAppendItem *appends,
                                            const PagedAttendItem *attends, size_t n,
                                            LaunchTimes *times) {
  if (n == 0) return Status::Ok();
  const AttendArrays arrays(attends, n);
  AppendJob a;
  ATTN_RETURN_IF_ERROR(LayoutAppend(appends, n, &a));
  AttendJob t;
  ATTN_RETURN_IF_ERROR(LayoutAttend(arrays.layers.data(), arrays.queries.data(),
                                    arrays.outs.data(), static_cast<int64_t>(n), &t));
  return Run(&a, &t, times);
}

Status GpuPagedAttention::CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                                   int64_t tokens) {
  (void)tokens;  // whole pages are copied: slots past `tokens` are garbage either way
  ATTN_RETURN_IF_ERROR(Faulted());
  Lane *lane = nullptr;
  std::unique_lock<std::mutex> lock = AcquireLane(&lane);
  const uint64_t page_bytes = static_cast<uint64_t>(kernels::PageBytes(pool));
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  for (void *arr : {pool.k_pages, pool.v_pages}) {
    char *base = static_cast<char *>(arr);
    ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(base + static_cast<uint64_t>(dst) * page_bytes,
                                               base + static_cast<uint64_t>(src) * page_bytes,
                                               page_bytes, cudaMemcpyDeviceToDevice,
                                               lane->stream),
                               "cudaMemcpyAsync (copy-on-write page)"));
  }
  return Check(cudaStreamSynchronize(lane->stream), "copy-on-write page");
}

Status GpuPagedAttention::Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) {
  void *outs[1] = {o};
  return AttendMany(&layer, &q, outs, 1);
}

Status GpuPagedAttention::AttendBatch(const PagedAttendItem *items, size_t n,
                                      LaunchTimes *times) {
  const AttendArrays arrays(items, n);
  return AttendMany(arrays.layers.data(), arrays.queries.data(), arrays.outs.data(),
                    static_cast<int64_t>(n), times);
}

Status GpuPagedAttention::AttendMany(const PagedLayerView *layers, const PagedQuery *queries,
                                     void *const *outs, int64_t count, LaunchTimes *times) {
  if (count <= 0) return Status::Ok();
  AttendJob t;
  ATTN_RETURN_IF_ERROR(LayoutAttend(layers, queries, outs, count, &t));
  return Run(nullptr, &t, times);
}

}  // namespace attn
