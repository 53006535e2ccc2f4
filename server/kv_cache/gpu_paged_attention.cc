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

bool SamePool(const kernels::PagedKvPool &a, const kernels::PagedKvPool &b) {
  return a.k_pages == b.k_pages && a.v_pages == b.v_pages && a.page_tokens == b.page_tokens &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim && a.kv_dtype == b.kv_dtype;
}

}  // namespace

StatusOr<std::unique_ptr<GpuPagedAttention>> GpuPagedAttention::Create(int device,
                                                                       DevicePool *pool) {
  std::unique_ptr<GpuPagedAttention> g(new GpuPagedAttention(device, pool));
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&g->stream_, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("GPU paged attention: cannot create a stream on device " +
                    std::to_string(device));
  }
  for (cudaEvent_t &e : g->events_) {
    if (cudaEventCreate(&e) != cudaSuccess) {
      (void)cudaGetLastError();
      e = nullptr;
      return Internal("GPU paged attention: cannot create a timing event on device " +
                      std::to_string(device));
    }
  }
  ATTN_RETURN_IF_ERROR(g->ReservePinned(4u << 20));
  return g;
}

GpuPagedAttention::~GpuPagedAttention() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : events_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
}

Status GpuPagedAttention::Check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  faulted_ = true;
  fault_ = std::string(what) + ": " + cudaGetErrorString(err);
  return Internal("CUDA error in GPU paged attention, " + fault_);
}

Status GpuPagedAttention::LaunchFailed(const Status &s) {
  // A rejected launch (INVALID_ARGUMENT) leaves the device healthy: wait for the copies already
  // enqueued so the caller's buffers can go back; INTERNAL is a device fault.
  (void)cudaStreamSynchronize(stream_);
  if (s.code() == StatusCode::kInternal) {
    faulted_ = true;
    fault_ = s.message();
  }
  return s;
}

Status GpuPagedAttention::Mark(int i) {
  return Check(cudaEventRecord(events_[i], stream_), "cudaEventRecord");
}

void GpuPagedAttention::AddEventTimes(LaunchTimes *times) {
  if (times == nullptr) return;
  float ms[3] = {0.f, 0.f, 0.f};
  for (int i = 0; i < 3; ++i) {
    if (cudaEventElapsedTime(&ms[i], events_[i], events_[i + 1]) != cudaSuccess) {
      (void)cudaGetLastError();  // timing only: never fails the call
      ms[i] = 0.f;
    }
  }
  times->h2d_ns += static_cast<int64_t>(ms[0] * 1e6);
  times->kernel_ns += static_cast<int64_t>(ms[1] * 1e6);
  times->d2h_ns += static_cast<int64_t>(ms[2] * 1e6);
}

Status GpuPagedAttention::ReservePinned(uint64_t bytes) {
  if (bytes <= pinned_bytes_) return Status::Ok();
  uint64_t want = std::max<uint64_t>(pinned_bytes_ * 2, 1u << 20);
  while (want < bytes) want *= 2;
  if (pinned_ != nullptr) (void)cudaFreeHost(pinned_);
  pinned_ = nullptr;
  pinned_bytes_ = 0;
  void *p = nullptr;
  if (cudaHostAlloc(&p, want, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return ResourceExhausted("GPU paged attention: cannot pin " + std::to_string(want) +
                             " bytes of host staging memory");
  }
  pinned_ = static_cast<char *>(p);
  pinned_bytes_ = want;
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

Status GpuPagedAttention::AppendBatch(PagedAppendItem *items, size_t n, LaunchTimes *times) {
  if (n == 0) return Status::Ok();
  const kernels::PagedKvPool &pool = items[0].layer.pool;
  const DType src = items[0].src_dtype;
  const bool fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  const int64_t K = pool.num_kv_heads;
  const int64_t row_bytes = K * pool.head_dim * kernels::DTypeSize(src);
  int64_t total = 0, max_new = 1, max_blocks = 1;
  for (size_t i = 0; i < n; ++i) {
    const PagedAppendItem &a = items[i];
    if (!SamePool(a.layer.pool, pool) || a.src_dtype != src) {
      return InvalidArgument("GPU paged append: the items of one launch must share the KV "
                             "layout class and the source dtype");
    }
    if (a.tokens < 0 || a.start < 0) {
      return InvalidArgument("GPU paged append: negative start or token count");
    }
    total += a.tokens;
    max_new = std::max(max_new, a.tokens);
    max_blocks = std::max(max_blocks, a.layer.num_blocks);
  }
  if (total == 0) return Status::Ok();
  const int64_t B = static_cast<int64_t>(n);
  // FP8 pools count saturations per item, so each item is its own launch (one counter each);
  // 16-bit pools append every item in one launch.
  const int64_t launches = fp8 ? B : 1;
  Segments seg;
  const uint64_t at_k = seg.Add(static_cast<uint64_t>(total * row_bytes));
  const uint64_t at_v = seg.Add(static_cast<uint64_t>(total * row_bytes));
  const uint64_t at_bt = seg.Add(static_cast<uint64_t>(B * max_blocks) * 4);
  const uint64_t at_len = seg.Add(static_cast<uint64_t>(B) * 4);
  const uint64_t at_off = seg.Add(static_cast<uint64_t>(B + 1) * 8);
  const uint64_t at_ks = seg.Add(fp8 ? static_cast<uint64_t>(B * K) * 4 : 0);
  const uint64_t at_vs = seg.Add(fp8 ? static_cast<uint64_t>(B * K) * 4 : 0);
  const uint64_t at_sat = seg.Add(static_cast<uint64_t>(launches) * 8);

  std::lock_guard<std::mutex> lock(mu_);
  if (faulted_) return Internal("GPU paged attention is faulted: " + fault_);
  ATTN_RETURN_IF_ERROR(ReservePinned(seg.total));
  StatusOr<DeviceAllocation> dev = pool_->Allocate(seg.total);
  if (!dev.ok()) return dev.status();
  char *h = pinned_;
  char *d = static_cast<char *>(dev->data());
  auto *bt = reinterpret_cast<int32_t *>(h + at_bt);
  auto *len = reinterpret_cast<int32_t *>(h + at_len);
  auto *off = reinterpret_cast<int64_t *>(h + at_off);
  off[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    const PagedAppendItem &a = items[b];
    const uint64_t at = static_cast<uint64_t>(off[b] * row_bytes);
    std::memcpy(h + at_k + at, a.k, static_cast<size_t>(a.tokens * row_bytes));
    std::memcpy(h + at_v + at, a.v, static_cast<size_t>(a.tokens * row_bytes));
    std::memcpy(bt + b * max_blocks, a.layer.block_table,
                static_cast<size_t>(a.layer.num_blocks) * 4);
    std::fill(bt + b * max_blocks + a.layer.num_blocks, bt + (b + 1) * max_blocks, 0);
    len[b] = static_cast<int32_t>(a.start + a.tokens);
    off[b + 1] = off[b] + a.tokens;
    if (fp8) {
      std::memcpy(h + at_ks + static_cast<uint64_t>(b * K) * 4, a.layer.k_scales,
                  static_cast<size_t>(K) * 4);
      std::memcpy(h + at_vs + static_cast<uint64_t>(b * K) * 4, a.layer.v_scales,
                  static_cast<size_t>(K) * 4);
    }
  }
  std::memset(h + at_sat, 0, static_cast<size_t>(launches) * 8);

  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  ATTN_RETURN_IF_ERROR(Mark(0));
  ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(d, h, seg.total, cudaMemcpyHostToDevice, stream_),
                             "cudaMemcpyAsync H2D (append)"));
  ATTN_RETURN_IF_ERROR(Mark(1));
  for (int64_t l = 0; l < launches; ++l) {
    // Launch l covers items [first, first + count).
    const int64_t first = fp8 ? l : 0, count = fp8 ? 1 : B;
    kernels::PagedBatch batch;
    batch.batch = count;
    batch.block_tables = reinterpret_cast<const int32_t *>(d + at_bt) + first * max_blocks;
    batch.block_table_stride = max_blocks;
    batch.kv_lengths = reinterpret_cast<const int32_t *>(d + at_len) + first;
    batch.k_scales = fp8 ? reinterpret_cast<const float *>(d + at_ks) + first * K : nullptr;
    batch.v_scales = fp8 ? reinterpret_cast<const float *>(d + at_vs) + first * K : nullptr;
    // Offsets are relative to the k/v pointers: shift the pointers, keep the prefix sums.
    kernels::AppendRows rows;
    rows.dtype = src;
    rows.k = d + at_k;
    rows.v = d + at_v;
    rows.new_offsets = reinterpret_cast<const int64_t *>(d + at_off) + first;
    rows.max_new_tokens = fp8 ? std::max<int64_t>(items[first].tokens, 1) : max_new;
    rows.saturations = reinterpret_cast<unsigned long long *>(d + at_sat) + l;
    if (fp8 && items[first].tokens == 0) continue;
    Status s = kernels::PagedAppendRun(pool, batch, rows, stream_);
    if (!s.ok()) return LaunchFailed(s);
  }
  ATTN_RETURN_IF_ERROR(Mark(2));
  ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h + at_sat, d + at_sat,
                                             static_cast<size_t>(launches) * 8,
                                             cudaMemcpyDeviceToHost, stream_),
                             "cudaMemcpyAsync D2H (append)"));
  ATTN_RETURN_IF_ERROR(Mark(3));
  ATTN_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "append"));
  AddEventTimes(times);
  for (int64_t l = 0; l < launches; ++l) {
    unsigned long long sat = 0;
    std::memcpy(&sat, h + at_sat + static_cast<uint64_t>(l) * 8, 8);
    if (fp8) items[l].saturations += static_cast<int64_t>(sat);
  }
  return Status::Ok();
}

Status GpuPagedAttention::CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                                   int64_t tokens) {
  (void)tokens;  // whole pages are copied: slots past `tokens` are garbage either way
  std::lock_guard<std::mutex> lock(mu_);
  if (faulted_) return Internal("GPU paged attention is faulted: " + fault_);
  const uint64_t page_bytes = static_cast<uint64_t>(kernels::PageBytes(pool));
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  for (void *arr : {pool.k_pages, pool.v_pages}) {
    char *base = static_cast<char *>(arr);
    ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(base + static_cast<uint64_t>(dst) * page_bytes,
                                               base + static_cast<uint64_t>(src) * page_bytes,
                                               page_bytes, cudaMemcpyDeviceToDevice, stream_),
                               "cudaMemcpyAsync (copy-on-write page)"));
  }
  return Check(cudaStreamSynchronize(stream_), "copy-on-write page");
}

Status GpuPagedAttention::Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) {
  void *outs[1] = {o};
  return AttendMany(&layer, &q, outs, 1);
}

Status GpuPagedAttention::AttendBatch(const PagedAttendItem *items, size_t n,
                                      LaunchTimes *times) {
  std::vector<PagedLayerView> layers(n);
  std::vector<PagedQuery> queries(n);
  std::vector<void *> outs(n);
  for (size_t i = 0; i < n; ++i) {
    layers[i] = items[i].layer;
    queries[i] = items[i].query;
    outs[i] = items[i].o;
  }
  return AttendMany(layers.data(), queries.data(), outs.data(), static_cast<int64_t>(n), times);
}

Status GpuPagedAttention::AttendMany(const PagedLayerView *layers, const PagedQuery *queries,
                                     void *const *outs, int64_t count, LaunchTimes *times) {
  if (count <= 0) return Status::Ok();
  const kernels::PagedKvPool &pool = layers[0].pool;
  const PagedQuery &q0 = queries[0];
  const int64_t N = q0.num_heads, K = pool.num_kv_heads, H = pool.head_dim;
  const bool fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  const int64_t esize = kernels::DTypeSize(q0.dtype);
  constexpr int64_t kChunk = kernels::kPagedDecodeMaxQueryLen;

  // Steps longer than kChunk query tokens run in one fused paged launch when the kernel takes
  // this layout class (16-bit pages, head dim 64/128); the others (and all of them with FP8
  // pages) run in one decode launch, cut into chunks of at most kChunk rows (AttendSplit).
  kernels::FusedPagedShape pshape;
  pshape.dtype = q0.dtype;
  pshape.kv_dtype = pool.kv_dtype;
  pshape.num_heads = N;
  pshape.num_kv_heads = K;
  pshape.head_dim = H;
  pshape.page_tokens = pool.page_tokens;
  pshape.scale = q0.scale;  // mask: bottom-right causal (the default)
  const bool prefill_ok = kernels::FusedPagedSupports(pshape).ok();
  std::vector<int64_t> tokens(static_cast<size_t>(count)), kv_lens(static_cast<size_t>(count));
  int64_t total_q = 0, max_blocks = 1;
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
    max_blocks = std::max(max_blocks, layers[i].num_blocks);
  }
  const AttendSplit split =
      SplitAttendSteps(tokens.data(), kv_lens.data(), count, prefill_ok, kChunk);
  const int64_t rows = split.decode_entries, prows = split.prefill_entries;

  std::lock_guard<std::mutex> lock(mu_);
  if (faulted_) return Internal("GPU paged attention is faulted: " + fault_);
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  StatusOr<kernels::PagedDecodePlan> plan = kernels::PagedDecodePlan{};
  if (rows > 0) {
    kernels::PagedDecodeShape shape;
    shape.source = kernels::KvSource::kPaged;
    shape.dtype = q0.dtype;
    shape.kv_dtype = pool.kv_dtype;
    shape.batch = rows;
    shape.max_q_len = split.decode_max_q;
    shape.max_kv_len = split.decode_max_kv;
    shape.num_heads = N;
    shape.num_kv_heads = K;
    shape.head_dim = H;
    shape.page_tokens = pool.page_tokens;
    shape.scale = q0.scale;
    plan = kernels::PagedDecodePlanFor(shape, device_);
    if (!plan.ok()) return plan.status();
  }
  StatusOr<kernels::FusedPagedPlan> pplan = kernels::FusedPagedPlan{};
  if (prows > 0) {
    pshape.batch = prows;
    pshape.max_q_len = split.prefill_max_q;
    pshape.max_kv_len = split.prefill_max_kv;
    pshape.total_q = split.prefill_rows;
    pplan = kernels::FusedPagedPlanFor(pshape, device_);
    if (!pplan.ok()) return pplan.status();
  }

  const uint64_t qo_bytes = static_cast<uint64_t>(total_q * N * H * esize);
  Segments seg;
  const uint64_t at_q = seg.Add(qo_bytes);
  const uint64_t at_bt = seg.Add(static_cast<uint64_t>(rows * max_blocks) * 4);
  const uint64_t at_len = seg.Add(static_cast<uint64_t>(rows) * 4);
  const uint64_t at_off = seg.Add(static_cast<uint64_t>(rows + 1) * 8);
  const uint64_t at_ks = seg.Add(fp8 ? static_cast<uint64_t>(rows * K) * 4 : 0);
  const uint64_t at_vs = seg.Add(fp8 ? static_cast<uint64_t>(rows * K) * 4 : 0);
  const uint64_t at_pbt = seg.Add(static_cast<uint64_t>(prows * max_blocks) * 4);
  const uint64_t at_plen = seg.Add(static_cast<uint64_t>(prows) * 4);
  const uint64_t at_poff = seg.Add(prows > 0 ? static_cast<uint64_t>(prows + 1) * 8 : 0);
  const uint64_t upload = seg.total;
  const uint64_t at_o = seg.Add(qo_bytes);
  const uint64_t at_ws = seg.Add(plan->workspace_bytes);
  ATTN_RETURN_IF_ERROR(ReservePinned(upload));
  StatusOr<DeviceAllocation> dev = pool_->Allocate(seg.total);
  if (!dev.ok()) return dev.status();
  char *h = pinned_;
  char *d = static_cast<char *>(dev->data());

  auto *bt = reinterpret_cast<int32_t *>(h + at_bt);
  auto *len = reinterpret_cast<int32_t *>(h + at_len);
  auto *off = reinterpret_cast<int64_t *>(h + at_off);
  auto *ks = reinterpret_cast<float *>(h + at_ks);
  auto *vs = reinterpret_cast<float *>(h + at_vs);
  auto *pbt = reinterpret_cast<int32_t *>(h + at_pbt);
  auto *plen = reinterpret_cast<int32_t *>(h + at_plen);
  auto *poff = reinterpret_cast<int64_t *>(h + at_poff);
  const int64_t row_bytes = N * H * esize;
  if (rows > 0) off[0] = 0;
  if (prows > 0) poff[0] = 0;
  for (int64_t i = 0; i < count; ++i) {
    const PagedLayerView &L = layers[i];
    const AttendSplit::Item &it = split.items[i];
    const int64_t T = queries[i].tokens;
    std::memcpy(h + at_q + static_cast<uint64_t>(it.q_row * row_bytes), queries[i].q,
                static_cast<size_t>(T * row_bytes));
    if (it.prefill) {
      // One sequence of the fused launch: its T rows are the last T of kv_len keys.
      const int64_t p = it.entry;
      std::memcpy(pbt + p * max_blocks, L.block_table, static_cast<size_t>(L.num_blocks) * 4);
      std::fill(pbt + p * max_blocks + L.num_blocks, pbt + (p + 1) * max_blocks, 0);
      plen[p] = static_cast<int32_t>(L.kv_len);
      poff[p + 1] = poff[p] + T;
      continue;
    }
    int64_t r = it.entry;
    for (int64_t r0 = 0; r0 < T; r0 += kChunk, ++r) {
      const int64_t r1 = std::min(T, r0 + kChunk);
      std::memcpy(bt + r * max_blocks, L.block_table, static_cast<size_t>(L.num_blocks) * 4);
      std::fill(bt + r * max_blocks + L.num_blocks, bt + (r + 1) * max_blocks, 0);
      len[r] = static_cast<int32_t>(L.kv_len - T + r1);
      off[r + 1] = it.q_row + r1;
      if (fp8) {
        std::memcpy(ks + r * K, L.k_scales, static_cast<size_t>(K) * 4);
        std::memcpy(vs + r * K, L.v_scales, static_cast<size_t>(K) * 4);
      }
    }
  }

  ATTN_RETURN_IF_ERROR(Mark(0));
  ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(d, h, upload, cudaMemcpyHostToDevice, stream_),
                             "cudaMemcpyAsync H2D (decode)"));
  ATTN_RETURN_IF_ERROR(Mark(1));
  if (rows > 0) {
    // Decode rows are the first split.decode_rows rows of q/o.
    kernels::PagedBatch batch;
    batch.batch = rows;
    batch.block_tables = reinterpret_cast<const int32_t *>(d + at_bt);
    batch.block_table_stride = max_blocks;
    batch.kv_lengths = reinterpret_cast<const int32_t *>(d + at_len);
    batch.k_scales = fp8 ? reinterpret_cast<const float *>(d + at_ks) : nullptr;
    batch.v_scales = fp8 ? reinterpret_cast<const float *>(d + at_vs) : nullptr;
    kernels::DecodeQueries dq;
    dq.q = d + at_q;
    dq.q_offsets = reinterpret_cast<const int64_t *>(d + at_off);
    dq.o = d + at_o;
    Status s = kernels::PagedDecodeRun(*plan, pool, batch, dq,
                                       plan->workspace_bytes > 0 ? d + at_ws : nullptr, stream_);
    if (!s.ok()) return LaunchFailed(s);
  }
  if (prows > 0) {
    // Prefill rows follow the decode rows (row_bytes is a multiple of 128: aligned).
    const uint64_t at_rows = static_cast<uint64_t>(split.decode_rows * row_bytes);
    kernels::PagedBatch batch;
    batch.batch = prows;
    batch.block_tables = reinterpret_cast<const int32_t *>(d + at_pbt);
    batch.block_table_stride = max_blocks;
    batch.kv_lengths = reinterpret_cast<const int32_t *>(d + at_plen);
    kernels::FusedPagedQueries fq;
    fq.q = d + at_q + at_rows;
    fq.q_offsets = reinterpret_cast<const int64_t *>(d + at_poff);
    fq.o = d + at_o + at_rows;
    Status s = kernels::FusedPagedRun(*pplan, pool, batch, fq, stream_);
    if (!s.ok()) return LaunchFailed(s);
  }
  ATTN_RETURN_IF_ERROR(Mark(2));
  // The output comes back into the pinned buffer over q (already uploaded, stream-ordered).
  ATTN_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h + at_q, d + at_o, qo_bytes, cudaMemcpyDeviceToHost,
                                             stream_),
                             "cudaMemcpyAsync D2H (decode)"));
  ATTN_RETURN_IF_ERROR(Mark(3));
  ATTN_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "decode"));
  AddEventTimes(times);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t bytes = static_cast<uint64_t>(queries[i].tokens * row_bytes);
    std::memcpy(outs[i], h + at_q + static_cast<uint64_t>(split.items[i].q_row * row_bytes),
                bytes);
  }
  return Status::Ok();
}

}  // namespace attn
