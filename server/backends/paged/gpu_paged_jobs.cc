#include "backends/paged/gpu_paged_jobs.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

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

/// Block-table strides are rounded up to a multiple of this many blocks (512 tokens with
/// 16-token pages; the rows are zero-filled past each table), and the decode plan's
/// max_kv_len to a multiple of kKvLenQuantum keys, so that a sequence's consecutive decode
/// steps keep one layout and one CUDA graph key (gpu_paged_graph_key.h) for hundreds of
/// steps instead of changing with every page or token. max_kv_len only bounds the lengths the
/// kernels read from the uploaded kv_lengths (decode_params.h), and the split is chosen from
/// ceil(max_kv_len / 64) tiles, so rounding it to 64 leaves every plan as it was.
constexpr int64_t kBlockQuantum = 32;
constexpr int64_t kKvLenQuantum = 64;

int64_t RoundUp(int64_t n, int64_t q) { return (n + q - 1) / q * q; }

bool SamePool(const kernels::PagedKvPool &a, const kernels::PagedKvPool &b) {
  return a.k_pages == b.k_pages && a.v_pages == b.v_pages && a.page_tokens == b.page_tokens &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim && a.kv_dtype == b.kv_dtype;
}

}  // namespace

Status LayoutAppend(PagedAppendItem *items, size_t n, PagedAppendJob *job) {
  const kernels::PagedKvPool &pool = items[0].layer.pool;
  PagedAppendJob &j = *job;
  j.items = items;
  j.src = items[0].src_dtype;
  j.fp8 = pool.kv_dtype == DType::kFloat8E4M3;
  j.K = pool.num_kv_heads;
  j.row_bytes = j.K * pool.head_dim * kernels::DTypeSize(j.src);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const PagedAppendItem &a = items[i];
    if (!SamePool(a.layer.pool, pool) || a.src_dtype != j.src) {
      return InvalidArgument(
          "GPU paged append: the items of one launch must share the KV "
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
  j.max_blocks = RoundUp(j.max_blocks, kBlockQuantum);
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

void PackAppend(const PagedAppendJob &j, char *h) {
  auto *bt = reinterpret_cast<int32_t *>(h + j.at_bt);
  auto *len = reinterpret_cast<int32_t *>(h + j.at_len);
  auto *off = reinterpret_cast<int64_t *>(h + j.at_off);
  off[0] = 0;
  for (int64_t b = 0; b < j.B; ++b) {
    const PagedAppendItem &a = j.items[b];
    const uint64_t at = static_cast<uint64_t>(off[b] * j.row_bytes);
    // k/v in a CUDA IPC region are device addresses: copied on the device (gpu_paged_device_io).
    if (a.device == nullptr || !a.device->k) {
      std::memcpy(h + j.at_k + at, a.k, static_cast<size_t>(a.tokens * j.row_bytes));
    }
    if (a.device == nullptr || !a.device->v) {
      std::memcpy(h + j.at_v + at, a.v, static_cast<size_t>(a.tokens * j.row_bytes));
    }
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

Status LaunchAppend(const PagedAppendJob &j, char *d, cudaStream_t stream) {
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

void FinishAppend(const PagedAppendJob &j, const char *h) {
  if (!j.fp8) return;
  for (int64_t l = 0; l < j.launches; ++l) {
    unsigned long long sat = 0;
    std::memcpy(&sat, h + j.at_sat + static_cast<uint64_t>(l) * 8, 8);
    j.items[l].saturations += static_cast<int64_t>(sat);
  }
}

bool FoldableAppend(const PagedAppendItem *appends, const PagedAttendItem *attends, size_t n) {
  if (n == 0) return false;
  std::vector<const int32_t *> tables;
  tables.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const PagedAppendItem &a = appends[i];
    const PagedAttendItem &t = attends[i];
    // CUDA IPC k/v (device addresses) keep the separate append: CopyDeviceInputs copies
    // them into the append's region, not into the folded rows.
    if (a.device != nullptr) return false;
    if (a.layer.pool.kv_dtype != t.query.dtype || a.src_dtype != t.query.dtype ||
        a.layer.pool.kv_dtype == DType::kFloat8E4M3 ||
        !SamePool(a.layer.pool, t.layer.pool) || a.layer.block_table != t.layer.block_table) {
      return false;
    }
    if (t.query.tokens < 1 || t.query.tokens > kernels::kPagedDecodeMaxQueryLen ||
        a.tokens != t.query.tokens || a.start + a.tokens != t.layer.kv_len) {
      return false;
    }
    tables.push_back(t.layer.block_table);
  }
  std::sort(tables.begin(), tables.end());
  return std::adjacent_find(tables.begin(), tables.end()) == tables.end();
}

Status LayoutAttend(DecodePlanCache &plans, const PagedLayerView *layers, const PagedQuery *queries,
                    void *const *outs, int64_t count, PagedAttendJob *job,
                    const PagedAppendItem *appends) {
  PagedAttendJob &j = *job;
  j.layers = layers;
  j.queries = queries;
  j.outs = outs;
  j.appends = appends;
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
      return InvalidArgument(
          "GPU paged attention: the steps of one launch must share the KV "
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
  j.max_blocks = RoundUp(j.max_blocks, kBlockQuantum);
  j.split = SplitAttendSteps(tokens.data(), kv_lens.data(), count, prefill_ok, kChunk);
  const int64_t rows = j.split.decode_entries, prows = j.split.prefill_entries;
  if (rows > 0) {
    kernels::PagedDecodeShape shape;
    shape.source = kernels::KvSource::kPaged;
    shape.dtype = q0.dtype;
    shape.kv_dtype = pool.kv_dtype;
    shape.batch = rows;
    shape.max_q_len = j.split.decode_max_q;
    shape.max_kv_len = RoundUp(j.split.decode_max_kv, kKvLenQuantum);
    shape.num_heads = N;
    shape.num_kv_heads = j.K;
    shape.head_dim = H;
    shape.page_tokens = pool.page_tokens;
    shape.scale = q0.scale;
    StatusOr<kernels::PagedDecodePlan> plan = plans.Get(shape);
    if (!plan.ok()) return plan.status();
    j.plan = *plan;
  }
  if (prows > 0) {
    pshape.batch = prows;
    pshape.max_q_len = j.split.prefill_max_q;
    pshape.max_kv_len = j.split.prefill_max_kv;
    pshape.total_q = j.split.prefill_rows;
    StatusOr<kernels::FusedPagedPlan> pplan = kernels::FusedPagedPlanFor(pshape, plans.device());
    if (!pplan.ok()) return pplan.status();
    j.pplan = *pplan;
  }

  if (appends != nullptr && (prows > 0 || rows != count)) {
    return InvalidArgument("GPU paged attention: a folded append needs one decode entry per step");
  }
  j.row_bytes = N * H * esize;
  j.kv_row_bytes = j.K * H * esize;
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
  const uint64_t new_bytes = appends != nullptr ? static_cast<uint64_t>(total_q * j.kv_row_bytes) : 0;
  j.at_nk = seg.Add(new_bytes);
  j.at_nv = seg.Add(new_bytes);
  // The workspace starts with the decode's arrival counters: uploaded as zeros (the region is
  // reused by other layouts between calls), the partials after them on the device only.
  j.at_ws = seg.Add(rows > 0 ? j.plan.workspace_bytes : 0);
  j.upload = j.at_ws + AlignSegment(rows > 0 ? j.plan.counter_bytes : 0);
  j.at_o = seg.Add(j.qo_bytes);
  j.bytes = seg.total;
  return Status::Ok();
}

void PackAttend(const PagedAttendJob &j, char *h) {
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
  if (j.split.decode_entries > 0) {
    off[0] = 0;
    std::memset(h + j.at_ws, 0, static_cast<size_t>(j.plan.counter_bytes));
  }
  if (j.split.prefill_entries > 0) poff[0] = 0;
  for (int64_t i = 0; i < j.count; ++i) {
    const PagedLayerView &L = j.layers[i];
    const AttendSplit::Item &it = j.split.items[i];
    const int64_t T = j.queries[i].tokens;
    if (j.queries[i].device == nullptr || !j.queries[i].device->q) {  // else a device copy
      std::memcpy(h + j.at_q + static_cast<uint64_t>(it.q_row * j.row_bytes), j.queries[i].q,
                  static_cast<size_t>(T * j.row_bytes));
    }
    if (it.prefill) {
      // One sequence of the fused launch: its T rows are the last T of kv_len keys.
      const int64_t p = it.entry;
      std::memcpy(pbt + p * mb, L.block_table, static_cast<size_t>(L.num_blocks) * 4);
      std::fill(pbt + p * mb + L.num_blocks, pbt + (p + 1) * mb, 0);
      plen[p] = static_cast<int32_t>(L.kv_len);
      poff[p + 1] = poff[p] + T;
      continue;
    }
    if (j.appends != nullptr) {  // folded append: the step's new rows at its q rows
      const uint64_t at = static_cast<uint64_t>(it.q_row * j.kv_row_bytes);
      const size_t bytes = static_cast<size_t>(T * j.kv_row_bytes);
      std::memcpy(h + j.at_nk + at, j.appends[i].k, bytes);
      std::memcpy(h + j.at_nv + at, j.appends[i].v, bytes);
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

Status LaunchAttend(const PagedAttendJob &j, char *d, cudaStream_t stream, void *o_host) {
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
    dq.o = o_host != nullptr && j.split.prefill_entries == 0 ? o_host : d + j.at_o;
    if (j.appends != nullptr) {
      dq.new_k = d + j.at_nk;
      dq.new_v = d + j.at_nv;
    }
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

void FinishAttend(const PagedAttendJob &j, const char *h) {
  for (int64_t i = 0; i < j.count; ++i) {
    const uint64_t bytes = static_cast<uint64_t>(j.queries[i].tokens * j.row_bytes);
    std::memcpy(j.outs[i], h + j.at_q + static_cast<uint64_t>(j.split.items[i].q_row * j.row_bytes),
                bytes);
  }
}

}  // namespace attn
