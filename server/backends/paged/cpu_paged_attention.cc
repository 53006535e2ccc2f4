#include "backends/paged/cpu_paged_attention.h"

#include <chrono>
#include <mutex>
#include <vector>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/paged_kv_cpu.h"

namespace attn {

using kernels::DType;

Status CpuPagedAttention::Append(const PagedLayerView &layer, int64_t start, int64_t tokens,
                                 const void *k, const void *v, DType src_dtype,
                                 int64_t *saturations) {
  return kernels::PagedAppendCpu(layer.pool, layer.block_table, layer.num_blocks, start, tokens, k,
                                 v, src_dtype, layer.k_scales, layer.v_scales, saturations);
}

Status CpuPagedAttention::CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                                   int64_t tokens) {
  return kernels::PagedCopyPageCpu(pool, src, dst, tokens);
}

namespace {

/// Multiply-adds (query rows x heads x keys x head dim) below which a step runs on the calling
/// thread: CpuAttention starts its worker threads per call, and a decode step of a small model
/// over a short history costs less than starting one (~50-100 us on an idle host, milliseconds on
/// a loaded one: measured 2.7 ms per N4 K1 H64 step over 16 keys on a busy 2-core machine).
/// 2^20 multiply-adds take ~0.5-1 ms in the float64 reference loop.
constexpr int64_t kOneThreadWork = int64_t{1} << 20;

}  // namespace

Status CpuPagedAttention::Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) {
  return AttendStoppable(layer, q, o, nullptr, nullptr);
}

Status CpuPagedAttention::AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    const PagedAttendItem &it = items[i];
    if (it.query.tokens == 0) continue;  // append-only step
    Status why;
    Status s = AttendStoppable(it.layer, it.query, it.o, it.stop, &why);
    if (!why.ok() && it.stopped != nullptr) {
      *it.stopped = why;  // this step alone stops; the others go on
      continue;
    }
    ATTN_RETURN_IF_ERROR(s);
  }
  AddHostTime(t0, times);
  return Status::Ok();
}

Status CpuPagedAttention::AttendStoppable(const PagedLayerView &layer, const PagedQuery &q,
                                          void *o, const std::function<Status()> *stop,
                                          Status *why) {
  // Per-thread scratch: grows to the largest sequence seen, never shrinks
  // (allocation-light).
  thread_local std::vector<char> k_buf, v_buf, q_buf, o_buf;
  const int64_t K = layer.pool.num_kv_heads;
  const int64_t H = layer.pool.head_dim;
  const bool same = layer.pool.kv_dtype == q.dtype;
  const DType compute = same ? q.dtype : DType::kFloat32;
  const size_t kv_bytes = static_cast<size_t>(layer.kv_len * K * H * kernels::DTypeSize(compute));
  if (k_buf.size() < kv_bytes) {
    k_buf.resize(kv_bytes);
    v_buf.resize(kv_bytes);
  }
  ATTN_RETURN_IF_ERROR(kernels::PagedGatherCpu(layer.pool, layer.block_table, layer.num_blocks,
                                               layer.kv_len, layer.k_scales, layer.v_scales,
                                               compute, k_buf.data(), v_buf.data()));
  kernels::AttentionShape s;
  s.layout = kernels::Layout::kPadded;
  s.dtype = compute;
  s.batch = 1;
  s.max_q_len = q.tokens;
  s.max_kv_len = layer.kv_len;
  s.num_heads = q.num_heads;
  s.num_kv_heads = K;
  s.head_dim = H;
  s.mask.causal = kernels::CausalAlignment::kBottomRight;
  s.scale = q.scale;
  const bool small = q.tokens * q.num_heads * layer.kv_len * H < kOneThreadWork;
  const int threads = small ? 1 : cpu_threads_;
  // Asked only for work long enough to be polled (a decode step never is): the computation's
  // threads poll at once, and the first non-OK answer is kept. One captured pointer, so the
  // StopCheck holds no heap copy.
  struct Asked {
    const std::function<Status()> *stop;
    Status *why;
    std::mutex mu;
  } asked{stop, why, {}};
  kernels::StopCheck should_stop;
  if (!small && stop != nullptr && *stop && why != nullptr) {
    should_stop = [a = &asked]() {
      Status w = (*a->stop)();
      if (w.ok()) return false;
      std::lock_guard<std::mutex> lock(a->mu);
      if (a->why->ok()) *a->why = std::move(w);
      return true;
    };
  }
  kernels::AttentionTensors t;
  t.k = k_buf.data();
  t.v = v_buf.data();
  if (same) {
    t.q = q.q;
    t.o = o;
    return kernels::CpuAttention(s, t, threads, should_stop);
  }
  const int64_t n = q.tokens * q.num_heads * H;
  q_buf.resize(static_cast<size_t>(n) * sizeof(float));
  o_buf.resize(static_cast<size_t>(n) * sizeof(float));
  float *qf = reinterpret_cast<float *>(q_buf.data());
  for (int64_t i = 0; i < n; ++i) qf[i] = kernels::LoadAsFloat(q.q, q.dtype, i);
  t.q = qf;
  t.o = o_buf.data();
  ATTN_RETURN_IF_ERROR(kernels::CpuAttention(s, t, threads, should_stop));
  const float *of = reinterpret_cast<const float *>(o_buf.data());
  for (int64_t i = 0; i < n; ++i) kernels::StoreFromFloat(o, q.dtype, i, of[i]);
  return Status::Ok();
}

}  // namespace attn
