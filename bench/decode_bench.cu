// attn_decode_bench: split-KV decode over a paged KV cache, against a read-only streaming
// kernel (the bandwidth denominator) and the same kernel on contiguous K/V.
//
// Problem (DESIGN.md §10): B=32 sequences, N=32 query heads, K=8 kv heads, H=128, T=1, every
// S_b = S in {1k, 8k, 32k} (--sizes), K/V in bf16 (queries bf16) and FP8 E4M3 pages.
// For each (S, kv dtype):
//   1. K/V history drawn on the device (normal, bf16), written into a pool of 16-token pages
//      through the append kernel with a shuffled page assignment; the contiguous (B, S, K, H)
//      copy is gathered from the pool (FP8 included, so both read identical bytes);
//   2. correctness first: paged and contiguous outputs must be bit-identical, and sampled rows
//      must match a float64 reference on the host (bf16 tolerance 1e-2, per row 5e-2, lse 1e-3;
//      FP8 against the dequantised pool); NaN anywhere in o fails;
//   3. timing with CUDA events: warm-up, calibration to --target-ms per repeat, --reps
//      interleaved repeats (stream, paged, contiguous in turn), median; inputs rotate over
//      enough copies (queries, block tables / K/V sets) that L2 (its size is read from the
//      device) never holds a whole set.
// Bytes counted: K and V bytes read = 2·B·K·S·H·bytes(kv dtype) (queries, outputs, block
// tables and the split-KV workspace excluded). Fraction = K/V GB/s ÷ streaming GB/s.
//
// CUDA graphs (issue 6; after the decode table, --graph-sizes, --no-graph to skip): one paged
// bf16 decode batch (N=32 K=8 H=128 T=1, S=4096 for every sequence, B in {1, 8, 64}) enqueued
// directly (PagedDecodeRun: one decode kernel, which merges its own partitions when the plan
// splits S) vs captured once into a CUDA graph and replayed with cudaGraphLaunch. Checked first (the replay's
// output and lse are bit-identical to the direct launch's), then, interleaved (direct, graph,
// direct, ...) after a warm-up, --graph-iters samples each of:
//   wall:    host wall time of launch + cudaStreamSynchronize (median, p10, p90);
//   enqueue: host time of the launch call alone (PagedDecodeRun vs cudaGraphLaunch);
//   event:   CUDA-event time of one launch (events around it, then synchronise), median;
//   b2b:     CUDA-event time per launch of 50 back-to-back launches (median of 7 repeats).
// Every call reads the same K/V (B=1's 17 MB fit in L2, as a real decode step's might): these
// numbers are about launch overhead, not bandwidth.
// Output: JSON lines on stdout, one JSON document per --json-dir (decode-<device>-<date>.json),
// and a table printed last. Exit status 1 when a correctness check failed.
//
// Every memset goes on the benchmark's own (non-blocking) stream and is waited for: a legacy
// cudaMemset is not ordered with such a stream, and one of the split-KV workspace (its arrival
// counters) overlapping the first decode launch left rows unmerged (NaN from the 0xff fill of o:
// device call H4 found the B=32 table's forced-partition rows failing that way).
//
// Usage: attn_decode_bench [--sizes=1024,8192,32768] [--reps=7] [--target-ms=25] [--quick]
//          [--graph-sizes=1,8,64] [--graph-iters=400] [--no-graph] [--partitions=N]
// --partitions=N forces N KV partitions on the decode table's and the graph measurement's plans
// (A/B of the plan's choice).
//          [--json-dir=DIR]... [--command=STRING]
//        attn_decode_bench --prefill [--prefill-shapes=B:T:S,...] [--reps=7] [--target-ms=25]
//          [--quick] [--json-dir=DIR]... [--command=STRING]
// --prefill: paged prefill instead of decode (see RunPrefill below): N=32 K=8 H=128 bf16,
// 16-token pages, default shapes B in {1, 8} x (T, S) in {(1024, 1024), (4096, 4096),
// (512, 4096)}: the fused kernel through block tables vs the same kernel on contiguous K/V vs
// the previous 64-row chunked decode path; JSON prefill-<device>-<date>.json per --json-dir.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/kernels/fused_attention.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/paged_decode.h"

namespace {

using attn::Status;
using attn::StatusOr;
using namespace attn::kernels;  // NOLINT

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t _e = (expr);                                                        \
    if (_e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                  \
                   cudaGetErrorString(_e));                                               \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)
#define CHECK_OK(expr)                                                                     \
  do {                                                                                     \
    const Status _s = (expr);                                                              \
    if (!_s.ok()) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                   \
                   _s.ToString().c_str());                                                 \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

// ---- device helpers ---------------------------------------------------------------------------

__device__ __forceinline__ uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// out[i] = N(0,1) rounded to bf16 (Box-Muller on a counter hash).
__global__ void FillNormalBf16(uint16_t* out, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = SplitMix(seed ^ SplitMix(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(h >> 40) + 1.f) * (1.f / 16777217.f);
    const float u2 = static_cast<float>((h >> 16) & 0xffffff) * (1.f / 16777216.f);
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    __nv_bfloat16 b = __float2bfloat16_rn(z);
    out[i] = *reinterpret_cast<uint16_t*>(&b);
  }
}

/// Read-only streaming: every thread sums kUnroll independent 16-byte loads per step.
template <int kUnroll>
__global__ void StreamRead(const uint4* __restrict__ in, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(in + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(in + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // practically never: keeps the loads alive
}

/// Contiguous (B, S, K, H) copy of a paged pool: row (b, j, h) <- page bt[b][j/pt], slot j%pt.
__global__ void GatherPages(const uint8_t* pages, const int32_t* bt, int64_t bt_stride,
                            uint8_t* out, int64_t B, int64_t S, int64_t K, int64_t row_bytes,
                            int64_t pt) {
  const int64_t chunks = row_bytes / 16;
  const int64_t n = B * S * K * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % chunks;
    const int64_t h = (i / chunks) % K;
    const int64_t j = (i / (chunks * K)) % S;
    const int64_t b = i / (chunks * K * S);
    const int64_t page = bt[b * bt_stride + j / pt];
    const int64_t src = ((page * K + h) * pt + j % pt) * row_bytes + c * 16;
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(pages + src);
  }
}

// ---- options ----------------------------------------------------------------------------------

struct PrefillShape {
  int64_t B, T, S;
};

struct Options {
  std::vector<int64_t> sizes{1024, 8192, 32768};
  bool prefill = false;  ///< --prefill: the paged prefill benchmark instead of decode
  std::vector<PrefillShape> prefill_shapes{{1, 1024, 1024}, {1, 4096, 4096}, {1, 512, 4096},
                                           {8, 1024, 1024}, {8, 4096, 4096}, {8, 512, 4096}};
  int reps = 7;
  double target_ms = 25;
  bool quick = false;
  int64_t partitions = 0;                      ///< decode table: forced KV partitions (0: plan)
  std::vector<int64_t> graph_sizes{1, 8, 64};  ///< CUDA-graph measurement batches (empty: none)
  int graph_iters = 400;                       ///< samples per (B, mode) of the graph measurement
  std::vector<std::string> json_dirs;
  std::string command;
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = val("--sizes=")) {
      o.sizes.clear();
      std::stringstream ss(v);
      std::string t;
      while (std::getline(ss, t, ',')) o.sizes.push_back(std::stoll(t));
    } else if (const char* v = val("--reps=")) {
      o.reps = std::max(3, std::atoi(v));
    } else if (const char* v = val("--target-ms=")) {
      o.target_ms = std::atof(v);
    } else if (a == "--quick") {
      o.quick = true;
    } else if (const char* v = val("--graph-sizes=")) {
      o.graph_sizes.clear();
      std::stringstream ss(v);
      std::string t;
      while (std::getline(ss, t, ',')) o.graph_sizes.push_back(std::stoll(t));
    } else if (const char* v = val("--graph-iters=")) {
      o.graph_iters = std::max(20, std::atoi(v));
    } else if (a == "--no-graph") {
      o.graph_sizes.clear();
    } else if (const char* v = val("--partitions=")) {
      o.partitions = std::max(0, std::atoi(v));
    } else if (a == "--prefill") {
      o.prefill = true;
    } else if (const char* v = val("--prefill-shapes=")) {
      o.prefill_shapes.clear();
      std::stringstream ss(v);
      std::string t;
      while (std::getline(ss, t, ',')) {
        PrefillShape ps{0, 0, 0};
        if (std::sscanf(t.c_str(), "%ld:%ld:%ld", &ps.B, &ps.T, &ps.S) != 3 || ps.B < 1 ||
            ps.T < 1 || ps.S < ps.T) {
          std::fprintf(stderr, "bad --prefill-shapes entry %s (B:T:S, 1 <= T <= S)\n", t.c_str());
          std::exit(2);
        }
        o.prefill_shapes.push_back(ps);
      }
    } else if (const char* v = val("--json-dir=")) {
      o.json_dirs.push_back(v);
    } else if (const char* v = val("--command=")) {
      o.command = v;
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.quick) {
    o.reps = 3;
    o.target_ms = 8;
    o.graph_iters = std::min(o.graph_iters, 150);
  }
  return o;
}

std::string JsonStr(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

// ---- timing -----------------------------------------------------------------------------------

/// One implementation: `launch(i)` enqueues the i-th call (rotating inputs) on the stream.
struct Impl {
  std::string name;
  std::function<void(int64_t)> launch;
  int iters = 1;
  std::vector<double> reps_ms;
  double ms = 0;
};

double TimeIters(Impl& impl, int iters, int64_t& counter, cudaStream_t stream) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaEventRecord(e0, stream));
  for (int i = 0; i < iters; ++i) impl.launch(counter++);
  CHECK_CUDA(cudaEventRecord(e1, stream));
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return ms / iters;
}

/// Warm-up, calibration, then `reps` interleaved repeats; ms = median repeat.
void TimeAll(std::vector<Impl*>& impls, const Options& opt, cudaStream_t stream) {
  int64_t counter = 0;
  for (Impl* im : impls) {
    TimeIters(*im, 2, counter, stream);
    const double one = TimeIters(*im, 3, counter, stream);
    im->iters = static_cast<int>(std::min(2000.0, std::max(3.0, opt.target_ms / std::max(one, 1e-4))));
    im->reps_ms.clear();
  }
  CHECK_CUDA(cudaGetLastError());
  for (int r = 0; r < opt.reps; ++r)
    for (Impl* im : impls) im->reps_ms.push_back(TimeIters(*im, im->iters, counter, stream));
  for (Impl* im : impls) {
    std::vector<double> v = im->reps_ms;
    std::sort(v.begin(), v.end());
    im->ms = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
}

// ---- one problem ------------------------------------------------------------------------------

struct Result {
  int64_t S;
  std::string kv, impl;
  double ms, gbps, frac, kv_tokens_per_s, steps_per_s;
  std::string plan;
  bool check_ok;
  std::string check;
};

double E4M3(uint8_t c) {
  const int e = (c >> 3) & 0xf, m = c & 7;
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (c & 0x80) ? -mag : mag;
}

struct Problem {
  int64_t B = 32, N = 32, K = 8, H = 128, PT = 16;
};

/// Runs one (S, kv dtype): build, check, time. Appends results; returns false on a failed check.
bool RunOne(const Problem& pr, int64_t S, DType kv_dtype, const Options& opt, double stream_gbps,
            int64_t l2_bytes, cudaStream_t stream, std::vector<Result>* results,
            std::vector<std::string>* json) {
  const bool fp8 = kv_dtype == DType::kFloat8E4M3;
  const int64_t B = pr.B, N = pr.N, K = pr.K, H = pr.H, PT = pr.PT;
  const int kvb = fp8 ? 1 : 2;
  const int64_t kv_bytes = 2 * B * K * S * H * kvb;  // K and V bytes one decode reads
  // Sets of K/V (and queries): enough that L2 cannot hold one whole set.
  const int nsets = static_cast<int>(std::min<int64_t>(8, std::max<int64_t>(1, (3 * l2_bytes) / kv_bytes + 1)));
  const char* kv_name = fp8 ? "fp8_e4m3" : "bf16";
  std::fprintf(stderr, "[decode_bench] S=%lld kv=%s: %d set(s) of %.1f MB K/V\n",
               static_cast<long long>(S), kv_name, nsets, kv_bytes / 1e6);

  // Paged pool holding all sets, pages shuffled.
  const int64_t blocks = (S + PT - 1) / PT;
  const int64_t pages = blocks * B * nsets;
  const int64_t page_bytes = K * PT * H * kvb;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(42 + S);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> bt(static_cast<size_t>(nsets * B * blocks));
  for (size_t i = 0; i < bt.size(); ++i) bt[i] = order[i];

  void *d_kp, *d_vp, *d_bt, *d_len, *d_scales, *d_q, *d_qoff, *d_o, *d_o2, *d_lse, *d_lse2,
      *d_ws, *d_newoff, *d_sat, *d_rows_k, *d_rows_v, *d_ck, *d_cv;
  CHECK_CUDA(cudaMalloc(&d_kp, pages * page_bytes));
  CHECK_CUDA(cudaMalloc(&d_vp, pages * page_bytes));
  CHECK_CUDA(cudaMalloc(&d_bt, bt.size() * 4));
  CHECK_CUDA(cudaMemcpy(d_bt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(S));
  CHECK_CUDA(cudaMalloc(&d_len, B * 4));
  CHECK_CUDA(cudaMemcpy(d_len, lens.data(), B * 4, cudaMemcpyHostToDevice));
  // FP8 scales: the generator's |values| stay below 5.8 (Box-Muller on 24-bit uniforms):
  // 8 / 448 never saturates (the fill asserts a zero saturation count).
  std::vector<float> scales(static_cast<size_t>(B * K), fp8 ? 8.f / 448.f : 1.f);
  CHECK_CUDA(cudaMalloc(&d_scales, B * K * 4));
  CHECK_CUDA(cudaMemcpy(d_scales, scales.data(), B * K * 4, cudaMemcpyHostToDevice));
  std::vector<int64_t> off(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) off[b] = b * S;
  CHECK_CUDA(cudaMalloc(&d_newoff, (B + 1) * 8));
  CHECK_CUDA(cudaMemcpy(d_newoff, off.data(), (B + 1) * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_sat, 8));
  CHECK_CUDA(cudaMemsetAsync(d_sat, 0, 8, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const int64_t set_elems = B * S * K * H;
  CHECK_CUDA(cudaMalloc(&d_rows_k, set_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_rows_v, set_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_ck, set_elems * kvb * nsets));
  CHECK_CUDA(cudaMalloc(&d_cv, set_elems * kvb * nsets));

  PagedKvPool pool;
  pool.k_pages = d_kp;
  pool.v_pages = d_vp;
  pool.num_pages = pages;
  pool.page_tokens = static_cast<int32_t>(PT);
  pool.num_kv_heads = static_cast<int32_t>(K);
  pool.head_dim = static_cast<int32_t>(H);
  pool.kv_dtype = kv_dtype;
  std::vector<PagedBatch> batches(static_cast<size_t>(nsets));
  for (int s = 0; s < nsets; ++s) {
    PagedBatch& pb = batches[s];
    pb.batch = B;
    pb.block_tables = static_cast<const int32_t*>(d_bt) + s * B * blocks;
    pb.block_table_stride = blocks;
    pb.kv_lengths = static_cast<const int32_t*>(d_len);
    pb.k_scales = fp8 ? static_cast<const float*>(d_scales) : nullptr;
    pb.v_scales = fp8 ? static_cast<const float*>(d_scales) : nullptr;
    // Draw the set's K/V (bf16), append them into the pages, gather the contiguous copy.
    FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(d_rows_k), set_elems, 1000 + s);
    FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(d_rows_v), set_elems, 2000 + s);
    AppendRows rows;
    rows.dtype = DType::kBFloat16;
    rows.k = d_rows_k;
    rows.v = d_rows_v;
    rows.new_offsets = static_cast<const int64_t*>(d_newoff);
    rows.max_new_tokens = S;
    rows.saturations = static_cast<unsigned long long*>(d_sat);
    CHECK_OK(PagedAppendRun(pool, pb, rows, stream));
    GatherPages<<<2048, 256, 0, stream>>>(static_cast<const uint8_t*>(d_kp), pb.block_tables, blocks,
                                          static_cast<uint8_t*>(d_ck) + s * set_elems * kvb, B, S, K,
                                          H * kvb, PT);
    GatherPages<<<2048, 256, 0, stream>>>(static_cast<const uint8_t*>(d_vp), pb.block_tables, blocks,
                                          static_cast<uint8_t*>(d_cv) + s * set_elems * kvb, B, S, K,
                                          H * kvb, PT);
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaFree(d_rows_k));
  CHECK_CUDA(cudaFree(d_rows_v));
  unsigned long long sat = 0;
  CHECK_CUDA(cudaMemcpy(&sat, d_sat, 8, cudaMemcpyDeviceToHost));

  // Queries (one set per K/V set), outputs.
  const int64_t q_elems = B * N * H;
  CHECK_CUDA(cudaMalloc(&d_q, q_elems * 2 * nsets));
  FillNormalBf16<<<256, 256, 0, stream>>>(static_cast<uint16_t*>(d_q), q_elems * nsets, 77);
  std::vector<int64_t> qoff(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) qoff[b] = b;
  CHECK_CUDA(cudaMalloc(&d_qoff, (B + 1) * 8));
  CHECK_CUDA(cudaMemcpy(d_qoff, qoff.data(), (B + 1) * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_o, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_o2, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_lse, B * N * 4));
  CHECK_CUDA(cudaMalloc(&d_lse2, B * N * 4));

  PagedDecodeShape shape;
  shape.source = KvSource::kPaged;
  shape.dtype = DType::kBFloat16;
  shape.kv_dtype = kv_dtype;
  shape.batch = B;
  shape.max_q_len = 1;
  shape.max_kv_len = S;
  shape.num_heads = N;
  shape.num_kv_heads = K;
  shape.head_dim = H;
  shape.page_tokens = PT;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  shape.return_lse = true;
  PagedDecodeOptions popt;
  popt.partitions = opt.partitions;  // 0: the plan's choice
  StatusOr<PagedDecodePlan> plan = PagedDecodePlanFor(shape, 0, popt);
  CHECK_OK(plan.status());
  PagedDecodeShape cshape = shape;
  cshape.source = KvSource::kContiguous;
  PagedDecodeOptions copt;
  copt.partitions = plan->partitions;
  StatusOr<PagedDecodePlan> cplan = PagedDecodePlanFor(cshape, 0, copt);
  CHECK_OK(cplan.status());
  CHECK_CUDA(cudaMalloc(&d_ws, std::max<size_t>(256, plan->workspace_bytes)));
  // the arrival counters start at zero
  CHECK_CUDA(cudaMemsetAsync(d_ws, 0, std::max<size_t>(256, plan->workspace_bytes), stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::fprintf(stderr, "  plan: %s (grid %lld blocks)\n", plan->Describe().c_str(),
               static_cast<long long>(plan->grid_blocks));

  auto queries = [&](int s, void* o, void* lse) {
    DecodeQueries dq;
    dq.q = static_cast<const uint16_t*>(d_q) + s * q_elems;
    dq.q_offsets = static_cast<const int64_t*>(d_qoff);
    dq.o = o;
    dq.lse = static_cast<float*>(lse);
    return dq;
  };
  auto contiguous = [&](int s) {
    ContiguousKv kv;
    kv.k = static_cast<const uint8_t*>(d_ck) + s * set_elems * kvb;
    kv.v = static_cast<const uint8_t*>(d_cv) + s * set_elems * kvb;
    kv.capacity = S;
    kv.kv_lengths = static_cast<const int32_t*>(d_len);
    kv.k_scales = fp8 ? static_cast<const float*>(d_scales) : nullptr;
    kv.v_scales = fp8 ? static_cast<const float*>(d_scales) : nullptr;
    return kv;
  };

  // ---- correctness first (set 0) ----
  CHECK_CUDA(cudaMemsetAsync(d_o, 0xff, q_elems * 2, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemsetAsync(d_o2, 0xff, q_elems * 2, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_OK(PagedDecodeRun(*plan, pool, batches[0], queries(0, d_o, d_lse), d_ws, stream));
  CHECK_OK(ContiguousDecodeRun(*cplan, contiguous(0), queries(0, d_o2, d_lse2), d_ws, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint16_t> o(q_elems), o2(q_elems), q(q_elems);
  std::vector<float> lse(B * N), lse2(B * N);
  CHECK_CUDA(cudaMemcpy(o.data(), d_o, q_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(o2.data(), d_o2, q_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), d_lse, B * N * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse2.data(), d_lse2, B * N * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(q.data(), d_q, q_elems * 2, cudaMemcpyDeviceToHost));
  bool ok = true;
  std::ostringstream why;
  if (std::memcmp(o.data(), o2.data(), o.size() * 2) != 0 ||
      std::memcmp(lse.data(), lse2.data(), lse.size() * 4) != 0) {
    ok = false;
    why << "paged and contiguous outputs differ; ";
  }
  for (size_t i = 0; i < o.size(); ++i)
    if (std::isnan(Bf16ToFloat(o[i]))) {
      ok = false;
      why << "NaN in o at " << i << "; ";
      break;
    }
  if (fp8 && sat != 0) {
    ok = false;
    why << sat << " saturations while filling; ";
  }
  // Sampled rows against float64 on the (dequantised) contiguous set 0.
  double worst_rel = 0, worst_lse = 0, num = 0, den = 0;
  {
    std::mt19937 r(7);
    const int samples = opt.quick ? 6 : 12;
    std::vector<uint8_t> kh(S * H * kvb), vh(S * H * kvb);
    for (int sidx = 0; sidx < samples; ++sidx) {
      const int64_t b = sidx == 0 ? B - 1 : r() % B;
      const int64_t n = sidx == 0 ? N - 1 : r() % N;
      const int64_t kh_i = n / (N / K);
      // Rows (b, j, kh_i) of the contiguous copy: stride K*H elements.
      CHECK_CUDA(cudaMemcpy2D(kh.data(), H * kvb,
                              static_cast<const uint8_t*>(d_ck) + (b * S * K + kh_i) * H * kvb,
                              K * H * kvb, H * kvb, S, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy2D(vh.data(), H * kvb,
                              static_cast<const uint8_t*>(d_cv) + (b * S * K + kh_i) * H * kvb,
                              K * H * kvb, H * kvb, S, cudaMemcpyDeviceToHost));
      auto kval = [&](const std::vector<uint8_t>& a, int64_t i) {
        if (fp8) return E4M3(a[i]) * scales[b * K + kh_i];
        uint16_t u;
        std::memcpy(&u, &a[i * 2], 2);
        return static_cast<double>(Bf16ToFloat(u));
      };
      std::vector<double> logits(S);
      double mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < H; ++d)
          acc += static_cast<double>(Bf16ToFloat(q[(b * N + n) * H + d])) * kval(kh, j * H + d);
        logits[j] = acc * shape.scale;
        mx = std::max(mx, logits[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < S; ++j) sum += std::exp(logits[j] - mx);
      double rn = 0, en = 0;
      for (int64_t d = 0; d < H; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += std::exp(logits[j] - mx) * kval(vh, j * H + d);
        const double ref = acc / sum;
        const double got = Bf16ToFloat(o[(b * N + n) * H + d]);
        rn += ref * ref;
        en += (got - ref) * (got - ref);
      }
      num += en;
      den += rn;
      worst_rel = std::max(worst_rel, std::sqrt(en / rn));
      worst_lse = std::max(worst_lse, std::fabs(lse[n * B + b] - (mx + std::log(sum))));
    }
  }
  const double rel = std::sqrt(num / den);
  if (!(rel <= 1e-2) || !(worst_rel <= 5e-2) || !(worst_lse <= 1e-3)) {
    ok = false;
    why << "sampled rows: rel_l2 " << rel << " worst row " << worst_rel << " worst lse "
        << worst_lse;
  }
  char check[256];
  std::snprintf(check, sizeof(check), "rel_l2 %.3g worst_row %.3g worst_lse %.3g %s", rel,
                worst_rel, worst_lse, why.str().c_str());
  std::fprintf(stderr, "  check: %s %s\n", ok ? "ok" : "FAILED", check);

  // ---- timing ----
  Impl paged{"paged", [&](int64_t i) {
               const int s = static_cast<int>(i % nsets);
               (void)PagedDecodeRun(*plan, pool, batches[s], queries(s, d_o, d_lse), d_ws, stream);
             }};
  Impl contig{"contiguous", [&](int64_t i) {
                const int s = static_cast<int>(i % nsets);
                (void)ContiguousDecodeRun(*cplan, contiguous(s), queries(s, d_o2, d_lse2), d_ws,
                                          stream);
              }};
  std::vector<Impl*> impls{&paged, &contig};
  TimeAll(impls, opt, stream);
  CHECK_CUDA(cudaGetLastError());
  for (Impl* im : impls) {
    Result res;
    res.S = S;
    res.kv = kv_name;
    res.impl = im->name;
    res.ms = im->ms;
    res.gbps = kv_bytes / (im->ms * 1e-3) / 1e9;
    res.frac = stream_gbps > 0 ? res.gbps / stream_gbps : 0;
    res.kv_tokens_per_s = static_cast<double>(B) * S / (im->ms * 1e-3);
    res.steps_per_s = static_cast<double>(B) / (im->ms * 1e-3);
    res.plan = (im == &paged ? plan : cplan)->Describe();
    res.check_ok = ok;
    res.check = check;
    results->push_back(res);
    std::ostringstream js;
    js << "{\"record\":\"result\",\"B\":" << B << ",\"N\":" << N << ",\"K\":" << K
       << ",\"H\":" << H << ",\"T\":1,\"S\":" << S << ",\"page_tokens\":" << PT
       << ",\"dtype\":\"bfloat16\",\"kv_dtype\":" << JsonStr(kv_name)
       << ",\"impl\":" << JsonStr(im->name) << ",\"plan\":" << JsonStr(res.plan)
       << ",\"kv_bytes\":" << kv_bytes << ",\"buffer_sets\":" << nsets << ",\"iters\":" << im->iters
       << ",\"reps_ms\":[";
    for (size_t i = 0; i < im->reps_ms.size(); ++i) js << (i ? "," : "") << im->reps_ms[i];
    js << "],\"ms\":" << im->ms << ",\"kv_gbps\":" << res.gbps
       << ",\"fraction_of_stream\":" << res.frac << ",\"kv_tokens_per_s\":" << res.kv_tokens_per_s
       << ",\"decode_steps_per_s\":" << res.steps_per_s << ",\"check\":{\"passed\":"
       << (ok ? "true" : "false") << ",\"detail\":" << JsonStr(check) << "}}";
    std::printf("%s\n", js.str().c_str());
    std::fflush(stdout);
    json->push_back(js.str());
  }

  for (void* p : {d_kp, d_vp, d_bt, d_len, d_scales, d_q, d_qoff, d_o, d_o2, d_lse, d_lse2, d_ws,
                  d_newoff, d_sat, d_ck, d_cv})
    CHECK_CUDA(cudaFree(p));
  return ok;
}


// ---- paged prefill (--prefill) -----------------------------------------------------------------
//
// A prefill step over the paged KV cache: T query rows per sequence that are the LAST T of its
// S cached tokens (bottom-right causal; T = S is a fresh prompt, T < S a step over a cached
// prefix), N=32 K=8 H=128 bf16, 16-token pages in shuffled order, B sequences. Implementations,
// all on the same data:
//   fused_paged        FusedPagedRun: the fused kernel reading K/V through the block tables;
//   fused_contig_tile  FusedRun on the contiguous gathered copy with the same tile (the paged
//                      plan's variant): the cost of paging alone;
//   fused_contig       FusedRun with its default tile for the shape (what the stateless fused
//                      backend runs);
//   chunked_decode     the previous server path: each sequence's T rows cut into 64-row chunks,
//                      every chunk one batch row of a split-KV PagedDecodeRun (kv_len of chunk
//                      [r0, r1) = S - T + r1), one launch for the whole step.
// Correctness first: fused_paged and fused_contig_tile bit-identical; sampled rows of every
// implementation against float64 (bf16 tolerance 1e-2, per row 5e-2, lse 1e-3); NaN scan.
// FLOPs counted exactly: 4·N·H·(visible (query, key) pairs), i.e. half of 4·B·N·T·S·H when
// T = S, and T·(S−T) + T(T+1)/2 pairs per sequence in general.

struct PrefillResult {
  PrefillShape shape;
  std::string impl, plan;
  double ms, tflops;
  bool check_ok;
};

/// Runs one (B, T, S): build, check, time. Appends results; returns false on a failed check.
bool RunPrefill(const PrefillShape& ps, const Options& opt, int64_t l2_bytes, cudaStream_t stream,
                std::vector<PrefillResult>* results, std::vector<std::string>* json) {
  const int64_t B = ps.B, T = ps.T, S = ps.S, N = 32, K = 8, H = 128, PT = 16;
  const int64_t blocks = (S + PT - 1) / PT;
  const int64_t set_kv_elems = B * S * K * H;
  const int64_t kv_bytes = 2 * set_kv_elems * 2;
  const int nsets = static_cast<int>(
      std::min<int64_t>(4, std::max<int64_t>(1, (2 * l2_bytes) / kv_bytes + 1)));
  const int64_t q_elems = B * T * N * H;
  double pairs = 0;
  for (int64_t i = 0; i < T; ++i) pairs += static_cast<double>(std::max<int64_t>(0, S - T + i + 1));
  const double flops = 4.0 * N * H * pairs * B;
  std::fprintf(stderr, "[prefill] B=%lld T=%lld S=%lld: %d set(s) of %.1f MB K/V, %.1f GFLOP\n",
               static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(S),
               nsets, kv_bytes / 1e6, flops / 1e9);

  // Pool (all sets, pages shuffled), contiguous copies, queries, outputs.
  const int64_t pages = blocks * B * nsets;
  const int64_t page_bytes = K * PT * H * 2;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(7 + S * 31 + T);
  std::shuffle(order.begin(), order.end(), rng);
  void *d_kp, *d_vp, *d_bt, *d_len, *d_kvoff, *d_ck, *d_cv, *d_q, *d_qoff, *d_o, *d_lse, *d_sat;
  CHECK_CUDA(cudaMalloc(&d_kp, pages * page_bytes));
  CHECK_CUDA(cudaMalloc(&d_vp, pages * page_bytes));
  CHECK_CUDA(cudaMalloc(&d_bt, order.size() * 4));
  CHECK_CUDA(cudaMemcpy(d_bt, order.data(), order.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(S));
  CHECK_CUDA(cudaMalloc(&d_len, B * 4));
  CHECK_CUDA(cudaMemcpy(d_len, lens.data(), B * 4, cudaMemcpyHostToDevice));
  std::vector<int64_t> kvoff(static_cast<size_t>(B + 1)), qoff(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) {
    kvoff[b] = b * S;
    qoff[b] = b * T;
  }
  CHECK_CUDA(cudaMalloc(&d_kvoff, (B + 1) * 8));
  CHECK_CUDA(cudaMemcpy(d_kvoff, kvoff.data(), (B + 1) * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_qoff, (B + 1) * 8));
  CHECK_CUDA(cudaMemcpy(d_qoff, qoff.data(), (B + 1) * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_ck, set_kv_elems * 2 * nsets));
  CHECK_CUDA(cudaMalloc(&d_cv, set_kv_elems * 2 * nsets));
  CHECK_CUDA(cudaMalloc(&d_sat, 8));
  CHECK_CUDA(cudaMemsetAsync(d_sat, 0, 8, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  PagedKvPool pool;
  pool.k_pages = d_kp;
  pool.v_pages = d_vp;
  pool.num_pages = pages;
  pool.page_tokens = static_cast<int32_t>(PT);
  pool.num_kv_heads = static_cast<int32_t>(K);
  pool.head_dim = static_cast<int32_t>(H);
  pool.kv_dtype = DType::kBFloat16;
  std::vector<PagedBatch> batches(static_cast<size_t>(nsets));
  for (int s = 0; s < nsets; ++s) {
    PagedBatch& pb = batches[s];
    pb.batch = B;
    pb.block_tables = static_cast<const int32_t*>(d_bt) + s * B * blocks;
    pb.block_table_stride = blocks;
    pb.kv_lengths = static_cast<const int32_t*>(d_len);
    uint16_t* ck = static_cast<uint16_t*>(d_ck) + s * set_kv_elems;
    uint16_t* cv = static_cast<uint16_t*>(d_cv) + s * set_kv_elems;
    // Draw the contiguous (B·S, K, H) history, append it into the pages.
    FillNormalBf16<<<1024, 256, 0, stream>>>(ck, set_kv_elems, 3000 + s);
    FillNormalBf16<<<1024, 256, 0, stream>>>(cv, set_kv_elems, 4000 + s);
    AppendRows rows;
    rows.dtype = DType::kBFloat16;
    rows.k = ck;
    rows.v = cv;
    rows.new_offsets = static_cast<const int64_t*>(d_kvoff);
    rows.max_new_tokens = S;
    rows.saturations = static_cast<unsigned long long*>(d_sat);
    CHECK_OK(PagedAppendRun(pool, pb, rows, stream));
  }
  CHECK_CUDA(cudaMalloc(&d_q, q_elems * 2 * nsets));
  FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(d_q), q_elems * nsets, 99);
  CHECK_CUDA(cudaMalloc(&d_o, q_elems * 2 * 4));  // one output per implementation
  CHECK_CUDA(cudaMalloc(&d_lse, B * T * N * 4 * 4));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  auto out_of = [&](int impl) { return static_cast<uint16_t*>(d_o) + impl * q_elems; };
  auto lse_of = [&](int impl) { return static_cast<float*>(d_lse) + impl * B * T * N; };
  auto q_of = [&](int s) { return static_cast<const uint16_t*>(d_q) + s * q_elems; };

  // fused_paged
  FusedPagedShape fs;
  fs.dtype = fs.kv_dtype = DType::kBFloat16;
  fs.batch = B;
  fs.max_q_len = T;
  fs.max_kv_len = S;
  fs.total_q = B * T;
  fs.num_heads = N;
  fs.num_kv_heads = K;
  fs.head_dim = H;
  fs.page_tokens = PT;
  fs.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  fs.return_lse = true;
  StatusOr<FusedPagedPlan> fplan = FusedPagedPlanFor(fs, 0);
  CHECK_OK(fplan.status());
  // fused_contig_tile / fused_contig: varlen over the contiguous copy.
  AttentionShape cs;
  cs.layout = Layout::kVarlen;
  cs.dtype = DType::kBFloat16;
  cs.batch = B;
  cs.max_q_len = T;
  cs.max_kv_len = S;
  cs.total_q = B * T;
  cs.total_kv = B * S;
  cs.num_heads = N;
  cs.num_kv_heads = K;
  cs.head_dim = H;
  cs.mask.causal = CausalAlignment::kBottomRight;
  cs.scale = fs.scale;
  cs.has_lengths = true;
  cs.return_lse = true;
  FusedPlanOptions same_tile;
  same_tile.variant = fplan->variant;
  StatusOr<FusedPlan> tplan = FusedPlanFor(cs, 0, same_tile);
  CHECK_OK(tplan.status());
  StatusOr<FusedPlan> dplan = FusedPlanFor(cs, 0);
  CHECK_OK(dplan.status());
  // chunked_decode: rows = chunks of <= 64 query rows.
  const int64_t chunk = kPagedDecodeMaxQueryLen;
  const int64_t chunks_per_seq = (T + chunk - 1) / chunk;
  const int64_t rows = B * chunks_per_seq;
  std::vector<int64_t> coff(static_cast<size_t>(rows + 1), 0);
  std::vector<int32_t> clen(static_cast<size_t>(rows));
  std::vector<int32_t> cbt(static_cast<size_t>(nsets * rows * blocks));
  for (int s = 0; s < nsets; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < chunks_per_seq; ++c) {
        const int64_t r = b * chunks_per_seq + c;
        const int64_t r1 = std::min(T, (c + 1) * chunk);
        clen[r] = static_cast<int32_t>(S - T + r1);
        coff[r + 1] = b * T + r1;
        std::copy(order.begin() + (s * B + b) * blocks, order.begin() + (s * B + b + 1) * blocks,
                  cbt.begin() + (s * rows + r) * blocks);
      }
  void *d_cbt, *d_clen, *d_coff, *d_ws;
  CHECK_CUDA(cudaMalloc(&d_cbt, cbt.size() * 4));
  CHECK_CUDA(cudaMemcpy(d_cbt, cbt.data(), cbt.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_clen, rows * 4));
  CHECK_CUDA(cudaMemcpy(d_clen, clen.data(), rows * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_coff, (rows + 1) * 8));
  CHECK_CUDA(cudaMemcpy(d_coff, coff.data(), (rows + 1) * 8, cudaMemcpyHostToDevice));
  PagedDecodeShape ds;
  ds.source = KvSource::kPaged;
  ds.dtype = ds.kv_dtype = DType::kBFloat16;
  ds.batch = rows;
  ds.max_q_len = std::min(T, chunk);
  ds.max_kv_len = S;
  ds.num_heads = N;
  ds.num_kv_heads = K;
  ds.head_dim = H;
  ds.page_tokens = PT;
  ds.scale = fs.scale;
  ds.return_lse = true;
  StatusOr<PagedDecodePlan> cplan = PagedDecodePlanFor(ds, 0);
  CHECK_OK(cplan.status());
  CHECK_CUDA(cudaMalloc(&d_ws, std::max<size_t>(256, cplan->workspace_bytes)));
  // the arrival counters start at zero
  CHECK_CUDA(cudaMemsetAsync(d_ws, 0, std::max<size_t>(256, cplan->workspace_bytes), stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  auto run_paged = [&](int s, int impl) {
    FusedPagedQueries fq;
    fq.q = q_of(s);
    fq.q_offsets = static_cast<const int64_t*>(d_qoff);
    fq.o = out_of(impl);
    fq.lse = lse_of(impl);
    CHECK_OK(FusedPagedRun(*fplan, pool, batches[s], fq, stream));
  };
  auto run_contig = [&](const FusedPlan& plan, int s, int impl) {
    AttentionTensors t;
    t.q = q_of(s);
    t.k = static_cast<const uint16_t*>(d_ck) + s * set_kv_elems;
    t.v = static_cast<const uint16_t*>(d_cv) + s * set_kv_elems;
    t.o = out_of(impl);
    t.lse = lse_of(impl);
    t.q_offsets = static_cast<const int64_t*>(d_qoff);
    t.kv_offsets = static_cast<const int64_t*>(d_kvoff);
    CHECK_OK(FusedRun(plan, t, stream));
  };
  auto run_chunked = [&](int s, int impl) {
    PagedBatch pb;
    pb.batch = rows;
    pb.block_tables = static_cast<const int32_t*>(d_cbt) + s * rows * blocks;
    pb.block_table_stride = blocks;
    pb.kv_lengths = static_cast<const int32_t*>(d_clen);
    DecodeQueries dq;
    dq.q = q_of(s);
    dq.q_offsets = static_cast<const int64_t*>(d_coff);
    dq.o = out_of(impl);
    dq.lse = lse_of(impl);
    CHECK_OK(PagedDecodeRun(*cplan, pool, pb, dq, d_ws, stream));
  };
  Impl paged{"fused_paged", [&](int64_t i) { run_paged(static_cast<int>(i % nsets), 0); }};
  Impl tile{"fused_contig_tile",
            [&](int64_t i) { run_contig(*tplan, static_cast<int>(i % nsets), 1); }};
  Impl dflt{"fused_contig", [&](int64_t i) { run_contig(*dplan, static_cast<int>(i % nsets), 2); }};
  Impl chunked{"chunked_decode", [&](int64_t i) { run_chunked(static_cast<int>(i % nsets), 3); }};
  std::vector<Impl*> impls{&paged, &tile, &dflt, &chunked};
  const std::string plans[4] = {fplan->Describe(), tplan->Describe(), dplan->Describe(),
                                cplan->Describe()};
  for (int i = 0; i < 4; ++i) {
    std::fprintf(stderr, "  %s: %s\n", impls[i]->name.c_str(), plans[i].c_str());
  }

  // ---- correctness first (set 0) ----
  CHECK_CUDA(cudaMemsetAsync(d_o, 0xff, q_elems * 2 * 4, stream));
  CHECK_CUDA(cudaMemsetAsync(d_lse, 0xff, B * T * N * 4 * 4, stream));
  for (Impl* im : impls) im->launch(0);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());
  std::vector<uint16_t> o(q_elems * 4);
  std::vector<float> lse(B * T * N * 4);
  CHECK_CUDA(cudaMemcpy(o.data(), d_o, o.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost));
  bool ok = true;
  std::ostringstream why;
  if (std::memcmp(o.data(), o.data() + q_elems, q_elems * 2) != 0 ||
      std::memcmp(lse.data(), lse.data() + B * T * N, B * T * N * 4) != 0) {
    ok = false;
    why << "fused_paged and fused_contig_tile differ; ";
  }
  bool impl_ok[4] = {true, true, true, true};
  for (int im = 0; im < 4; ++im)
    for (int64_t i = 0; i < q_elems; ++i)
      if (std::isnan(Bf16ToFloat(o[im * q_elems + i]))) {
        impl_ok[im] = false;
        why << impls[im]->name << ": NaN in o at " << i << "; ";
        break;
      }
  // Sampled rows against float64 on the contiguous set 0.
  double worst_rel[4] = {0, 0, 0, 0}, worst_lse[4] = {0, 0, 0, 0}, num[4] = {0, 0, 0, 0},
         den = 0;
  {
    std::mt19937 r(11);
    const int samples = opt.quick ? 6 : 12;
    std::vector<uint16_t> kh(S * H), vh(S * H), qh(H);
    for (int sidx = 0; sidx < samples; ++sidx) {
      const int64_t b = sidx == 0 ? B - 1 : r() % B;
      const int64_t n = sidx == 0 ? N - 1 : r() % N;
      const int64_t i = sidx == 0 ? T - 1 : (sidx == 1 ? 0 : r() % T);
      const int64_t kvh = n / (N / K);
      CHECK_CUDA(cudaMemcpy2D(kh.data(), H * 2,
                              static_cast<const uint16_t*>(d_ck) + (b * S * K + kvh) * H, K * H * 2,
                              H * 2, S, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy2D(vh.data(), H * 2,
                              static_cast<const uint16_t*>(d_cv) + (b * S * K + kvh) * H, K * H * 2,
                              H * 2, S, cudaMemcpyDeviceToHost));
      const int64_t row = b * T + i;
      CHECK_CUDA(cudaMemcpy(qh.data(), q_of(0) + (row * N + n) * H, H * 2, cudaMemcpyDeviceToHost));
      const int64_t visible = S - T + i + 1;  // keys [0, visible)
      std::vector<double> logits(static_cast<size_t>(visible));
      double mx = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < H; ++d)
          acc += static_cast<double>(Bf16ToFloat(qh[d])) * Bf16ToFloat(kh[j * H + d]);
        logits[j] = acc * fs.scale;
        mx = std::max(mx, logits[j]);
      }
      double sum = 0;
      std::vector<double> ref(static_cast<size_t>(H), 0.0);
      for (int64_t j = 0; j < visible; ++j) {
        const double p = std::exp(logits[j] - mx);
        sum += p;
        for (int64_t d = 0; d < H; ++d) ref[d] += p * Bf16ToFloat(vh[j * H + d]);
      }
      double rn = 0;
      for (int64_t d = 0; d < H; ++d) {
        ref[d] /= sum;
        rn += ref[d] * ref[d];
      }
      den += rn;
      for (int im = 0; im < 4; ++im) {
        double en = 0;
        for (int64_t d = 0; d < H; ++d) {
          const double e = Bf16ToFloat(o[im * q_elems + (row * N + n) * H + d]) - ref[d];
          en += e * e;
        }
        num[im] += en;
        worst_rel[im] = std::max(worst_rel[im], std::sqrt(en / rn));
        const double gl = lse[im * B * T * N + n * B * T + row];
        const double lse_err = std::isnan(gl) ? INFINITY : std::fabs(gl - (mx + std::log(sum)));
        worst_lse[im] = std::max(worst_lse[im], lse_err);
      }
    }
  }
  std::string checks[4];
  for (int im = 0; im < 4; ++im) {
    const double rel = std::sqrt(num[im] / den);
    if (!(rel <= 1e-2) || !(worst_rel[im] <= 5e-2) || !(worst_lse[im] <= 1e-3)) impl_ok[im] = false;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "rel_l2 %.3g worst_row %.3g worst_lse %.3g", rel,
                  worst_rel[im], worst_lse[im]);
    checks[im] = buf;
    std::fprintf(stderr, "  check %s: %s %s\n", impls[im]->name.c_str(),
                 impl_ok[im] ? "ok" : "FAILED", buf);
    ok = ok && impl_ok[im];
  }
  if (!why.str().empty()) std::fprintf(stderr, "  check: %s\n", why.str().c_str());

  // ---- timing ----
  TimeAll(impls, opt, stream);
  CHECK_CUDA(cudaGetLastError());
  for (int im = 0; im < 4; ++im) {
    PrefillResult res;
    res.shape = ps;
    res.impl = impls[im]->name;
    res.plan = plans[im];
    res.ms = impls[im]->ms;
    res.tflops = flops / (res.ms * 1e-3) / 1e12;
    res.check_ok = ok;
    results->push_back(res);
    std::ostringstream js;
    js << "{\"record\":\"prefill\",\"B\":" << B << ",\"N\":" << N << ",\"K\":" << K
       << ",\"H\":" << H << ",\"T\":" << T << ",\"S\":" << S << ",\"page_tokens\":" << PT
       << ",\"dtype\":\"bfloat16\",\"mask\":\"bottom_right\",\"impl\":" << JsonStr(res.impl)
       << ",\"plan\":" << JsonStr(res.plan) << ",\"flops\":" << flops
       << ",\"buffer_sets\":" << nsets << ",\"iters\":" << impls[im]->iters << ",\"reps_ms\":[";
    for (size_t i = 0; i < impls[im]->reps_ms.size(); ++i)
      js << (i ? "," : "") << impls[im]->reps_ms[i];
    js << "],\"ms\":" << res.ms << ",\"tflops\":" << res.tflops << ",\"check\":{\"passed\":"
       << (impl_ok[im] && ok ? "true" : "false")
       << ",\"detail\":" << JsonStr(checks[im] + " " + why.str()) << "}}";
    std::printf("%s\n", js.str().c_str());
    std::fflush(stdout);
    json->push_back(js.str());
  }
  for (void* p : {d_kp, d_vp, d_bt, d_len, d_kvoff, d_ck, d_cv, d_q, d_qoff, d_o, d_lse, d_sat,
                  d_cbt, d_clen, d_coff, d_ws})
    CHECK_CUDA(cudaFree(p));
  return ok;
}

/// "<device slug>-<date>", as the decode results are named.
std::string SlugDate(const cudaDeviceProp& prop) {
  std::string slug;
  for (const char* c = prop.name; *c; ++c) {
    const char ch = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      slug += ch;
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::localtime(&now));
  return slug + "-" + date;
}

/// --prefill: every shape of opt.prefill_shapes, JSON (prefill-<device>-<date>.json), table last.
int PrefillMain(const Options& opt, const cudaDeviceProp& prop, cudaStream_t stream) {
  const auto t0 = std::chrono::steady_clock::now();
  std::ostringstream dev;
  dev << "{\"record\":\"device\",\"device\":" << JsonStr(prop.name)
      << ",\"sm_count\":" << prop.multiProcessorCount << ",\"l2_bytes\":" << prop.l2CacheSize
      << ",\"cc\":" << prop.major * 10 + prop.minor << "}";
  std::printf("%s\n", dev.str().c_str());
  std::vector<std::string> json{dev.str()};
  std::vector<PrefillResult> results;
  bool all_ok = true;
  for (const PrefillShape& ps : opt.prefill_shapes)
    all_ok &= RunPrefill(ps, opt, prop.l2CacheSize, stream, &results, &json);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& dir : opt.json_dirs) {
    const std::string path = dir + "/prefill-" + SlugDate(prop) + ".json";
    std::ofstream f(path);
    f << "{\"bench\":\"attn_decode_bench --prefill\",\"command\":" << JsonStr(opt.command)
      << ",\"all_checks_passed\":" << (all_ok ? "true" : "false") << ",\"wall_s\":" << wall
      << ",\"records\":[\n";
    for (size_t i = 0; i < json.size(); ++i) f << (i ? ",\n" : "") << json[i];
    f << "\n]}\n";
    std::fprintf(stderr, "[prefill] wrote %s\n", path.c_str());
  }
  std::printf("\npaged prefill N=32 K=8 H=128 bf16, 16-token pages, bottom-right causal "
              "(T query rows = the last T of S cached tokens)\n");
  std::printf("%3s %5s %5s %-18s %9s %8s %10s %10s %4s  %s\n", "B", "T", "S", "impl", "us",
              "TFLOP/s", "vs contig", "vs chunked", "ok", "plan");
  for (const PrefillResult& r : results) {
    double tile_ms = 0, chunked_ms = 0;
    for (const PrefillResult& o : results) {
      if (o.shape.B != r.shape.B || o.shape.T != r.shape.T || o.shape.S != r.shape.S) continue;
      if (o.impl == "fused_contig_tile") tile_ms = o.ms;
      if (o.impl == "chunked_decode") chunked_ms = o.ms;
    }
    std::printf("%3lld %5lld %5lld %-18s %9.1f %8.1f %10.3f %10.2f %4s  %s\n",
                static_cast<long long>(r.shape.B), static_cast<long long>(r.shape.T),
                static_cast<long long>(r.shape.S), r.impl.c_str(), r.ms * 1e3, r.tflops,
                tile_ms > 0 ? r.ms / tile_ms : 0.0, r.ms > 0 ? chunked_ms / r.ms : 0.0,
                r.check_ok ? "ok" : "BAD", r.plan.c_str());
  }
  std::printf("vs contig = time / fused_contig_tile time (the cost of paging, same tile); "
              "vs chunked = chunked_decode time / time (speed-up over the old path)\n");
  std::printf("checks: %s; wall %.1f s\n", all_ok ? "all passed" : "FAILED", wall);
  return all_ok ? 0 : 1;
}

}  // namespace

// ---- CUDA graphs (issue 6) ---------------------------------------------------------------------

struct GraphResult {
  int64_t B = 0;
  std::string plan;
  size_t nodes = 0;  // kernel nodes of the captured graph (one: decode merges in-kernel)
  // [0] direct PagedDecodeRun, [1] cudaGraphLaunch; microseconds
  double wall[2], wall_p10[2], wall_p90[2], enqueue[2], event[2], b2b[2];
  bool check_ok = false;
};

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

/// One paged bf16 decode batch (N=32 K=8 H=128 T=1, S=4096, 16-token pages in shuffled order)
/// launched directly vs replayed from a CUDA graph captured once (see the header). Appends a
/// result; returns false when the replay's output differs from the direct launch's.
bool RunGraph(int64_t B, const Options& opt, cudaStream_t stream,
              std::vector<GraphResult>* results, std::vector<std::string>* json) {
  const int64_t S = 4096, N = 32, K = 8, H = 128, PT = 16;
  const int64_t blocks = S / PT, pages = B * blocks, page_elems = K * PT * H;
  std::vector<int32_t> bt(static_cast<size_t>(pages));
  std::iota(bt.begin(), bt.end(), 0);
  std::mt19937_64 rng(99 + B);
  std::shuffle(bt.begin(), bt.end(), rng);
  void *d_kp, *d_vp, *d_bt, *d_len, *d_q, *d_qoff, *d_o, *d_o2, *d_lse, *d_lse2, *d_ws;
  CHECK_CUDA(cudaMalloc(&d_kp, pages * page_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_vp, pages * page_elems * 2));
  // The pool's values are drawn in place: this measures launches, not the append kernel.
  FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(d_kp), pages * page_elems, 5000 + B);
  FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(d_vp), pages * page_elems, 6000 + B);
  CHECK_CUDA(cudaMalloc(&d_bt, pages * 4));
  CHECK_CUDA(cudaMemcpy(d_bt, bt.data(), pages * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(S));
  CHECK_CUDA(cudaMalloc(&d_len, B * 4));
  CHECK_CUDA(cudaMemcpy(d_len, lens.data(), B * 4, cudaMemcpyHostToDevice));
  const int64_t q_elems = B * N * H;
  CHECK_CUDA(cudaMalloc(&d_q, q_elems * 2));
  FillNormalBf16<<<256, 256, 0, stream>>>(static_cast<uint16_t*>(d_q), q_elems, 7000 + B);
  std::vector<int64_t> qoff(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) qoff[b] = b;
  CHECK_CUDA(cudaMalloc(&d_qoff, (B + 1) * 8));
  CHECK_CUDA(cudaMemcpy(d_qoff, qoff.data(), (B + 1) * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&d_o, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_o2, q_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_lse, B * N * 4));
  CHECK_CUDA(cudaMalloc(&d_lse2, B * N * 4));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  PagedKvPool pool;
  pool.k_pages = d_kp;
  pool.v_pages = d_vp;
  pool.num_pages = pages;
  pool.page_tokens = static_cast<int32_t>(PT);
  pool.num_kv_heads = static_cast<int32_t>(K);
  pool.head_dim = static_cast<int32_t>(H);
  pool.kv_dtype = DType::kBFloat16;
  PagedBatch pb;
  pb.batch = B;
  pb.block_tables = static_cast<const int32_t*>(d_bt);
  pb.block_table_stride = blocks;
  pb.kv_lengths = static_cast<const int32_t*>(d_len);
  PagedDecodeShape shape;
  shape.source = KvSource::kPaged;
  shape.dtype = DType::kBFloat16;
  shape.kv_dtype = DType::kBFloat16;
  shape.batch = B;
  shape.max_q_len = 1;
  shape.max_kv_len = S;
  shape.num_heads = N;
  shape.num_kv_heads = K;
  shape.head_dim = H;
  shape.page_tokens = PT;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  shape.return_lse = true;
  PagedDecodeOptions gopt;
  gopt.partitions = opt.partitions;  // 0: the plan's choice
  StatusOr<PagedDecodePlan> plan = PagedDecodePlanFor(shape, 0, gopt);
  CHECK_OK(plan.status());
  CHECK_CUDA(cudaMalloc(&d_ws, std::max<size_t>(256, plan->workspace_bytes)));
  // the arrival counters start at zero
  CHECK_CUDA(cudaMemsetAsync(d_ws, 0, std::max<size_t>(256, plan->workspace_bytes), stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  DecodeQueries dq;
  dq.q = d_q;
  dq.q_offsets = static_cast<const int64_t*>(d_qoff);
  dq.o = d_o;
  dq.lse = static_cast<float*>(d_lse);
  DecodeQueries dq2 = dq;  // the graph writes o2 / lse2
  dq2.o = d_o2;
  dq2.lse = static_cast<float*>(d_lse2);

  // Capture once (the plan, pointers and lengths are baked in), instantiate, upload.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status captured = PagedDecodeRun(*plan, pool, pb, dq2, d_ws, stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_OK(captured);
  GraphResult res;
  res.B = B;
  res.plan = plan->Describe();
  CHECK_CUDA(cudaGraphGetNodes(graph, nullptr, &res.nodes));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphUpload(exec, stream));

  // Correctness first: the replay's output is the direct launch's, bit for bit.
  CHECK_CUDA(cudaMemsetAsync(d_o, 0xff, q_elems * 2, stream));
  CHECK_CUDA(cudaMemsetAsync(d_o2, 0xff, q_elems * 2, stream));
  CHECK_OK(PagedDecodeRun(*plan, pool, pb, dq, d_ws, stream));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint16_t> o(static_cast<size_t>(q_elems)), o2(o.size());
  std::vector<float> lse(static_cast<size_t>(B * N)), lse2(lse.size());
  CHECK_CUDA(cudaMemcpy(o.data(), d_o, q_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(o2.data(), d_o2, q_elems * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), d_lse, B * N * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse2.data(), d_lse2, B * N * 4, cudaMemcpyDeviceToHost));
  res.check_ok = std::memcmp(o.data(), o2.data(), o.size() * 2) == 0 &&
                 std::memcmp(lse.data(), lse2.data(), lse.size() * 4) == 0;
  for (uint16_t u : o) res.check_ok &= !std::isnan(Bf16ToFloat(u));

  auto launch = [&](int mode) {
    if (mode == 0) {
      (void)PagedDecodeRun(*plan, pool, pb, dq, d_ws, stream);
    } else {
      (void)cudaGraphLaunch(exec, stream);
    }
  };
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  const int iters = opt.graph_iters;
  for (int i = 0; i < 30; ++i) {  // warm-up (clocks, instruction caches, graph upload)
    launch(i & 1);
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  std::vector<double> wall[2], enq[2], ev[2], b2b[2];
  for (int i = 0; i < iters; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int mode = (i + k) & 1;  // alternate which mode goes first
      const Clock::time_point t0 = Clock::now();
      launch(mode);
      const Clock::time_point t1 = Clock::now();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const Clock::time_point t2 = Clock::now();
      enq[mode].push_back(us(t1 - t0));
      wall[mode].push_back(us(t2 - t0));
    }
  }
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < iters; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int mode = (i + k) & 1;
      CHECK_CUDA(cudaEventRecord(e0, stream));
      launch(mode);
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      ev[mode].push_back(ms * 1e3);
    }
  }
  constexpr int kBackToBack = 50;
  for (int r = 0; r < 7; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int mode = (r + k) & 1;
      CHECK_CUDA(cudaEventRecord(e0, stream));
      for (int i = 0; i < kBackToBack; ++i) launch(mode);
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      b2b[mode].push_back(ms * 1e3 / kBackToBack);
    }
  }
  CHECK_CUDA(cudaGetLastError());
  for (int m = 0; m < 2; ++m) {
    res.wall[m] = Quantile(wall[m], 0.5);
    res.wall_p10[m] = Quantile(wall[m], 0.1);
    res.wall_p90[m] = Quantile(wall[m], 0.9);
    res.enqueue[m] = Quantile(enq[m], 0.5);
    res.event[m] = Quantile(ev[m], 0.5);
    res.b2b[m] = Quantile(b2b[m], 0.5);
  }
  std::fprintf(stderr,
               "[decode_bench] graph B=%lld (%s, %zu nodes): wall %.1f / %.1f us, event %.1f / "
               "%.1f us (direct / graph), check %s\n",
               static_cast<long long>(B), res.plan.c_str(), res.nodes, res.wall[0], res.wall[1],
               res.event[0], res.event[1], res.check_ok ? "ok" : "FAILED");
  std::ostringstream js;
  js << "{\"record\":\"graph\",\"B\":" << B << ",\"N\":" << N << ",\"K\":" << K << ",\"H\":" << H
     << ",\"T\":1,\"S\":" << S << ",\"page_tokens\":" << PT
     << ",\"dtype\":\"bfloat16\",\"kv_dtype\":\"bf16\",\"plan\":" << JsonStr(res.plan)
     << ",\"graph_nodes\":" << res.nodes << ",\"iters\":" << iters;
  for (int m = 0; m < 2; ++m) {
    js << ",\"" << (m ? "graph" : "direct") << "\":{\"wall_us_median\":" << res.wall[m]
       << ",\"wall_us_p10\":" << res.wall_p10[m] << ",\"wall_us_p90\":" << res.wall_p90[m]
       << ",\"enqueue_us_median\":" << res.enqueue[m] << ",\"event_us_median\":" << res.event[m]
       << ",\"back_to_back_us_per_launch\":" << res.b2b[m] << "}";
  }
  js << ",\"check\":{\"passed\":" << (res.check_ok ? "true" : "false")
     << ",\"detail\":\"graph replay output bit-identical to the direct launch\"}}";
  std::printf("%s\n", js.str().c_str());
  std::fflush(stdout);
  json->push_back(js.str());
  results->push_back(res);

  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  for (void* p : {d_kp, d_vp, d_bt, d_len, d_q, d_qoff, d_o, d_o2, d_lse, d_lse2, d_ws})
    CHECK_CUDA(cudaFree(p));
  return res.check_ok;
}

/// The graph table (after the decode table).
void PrintGraphTable(const std::vector<GraphResult>& rs) {
  if (rs.empty()) return;
  std::printf("\nCUDA graphs: one paged bf16 decode batch (PagedDecodeRun: one decode kernel), "
              "N=32 K=8 H=128 T=1 S=4096; microseconds, direct / graph\n");
  std::printf("%5s %-40s %5s %17s %17s %15s %15s %15s %4s\n", "B", "plan", "nodes",
              "wall (launch+sync)", "wall p10..p90 d", "enqueue", "event (1 launch)",
              "b2b per launch", "ok");
  for (const GraphResult& r : rs) {
    std::printf("%5lld %-40s %5zu %8.1f / %6.1f %7.1f..%-7.1f %6.1f / %6.1f %6.1f / %6.1f "
                "%6.1f / %6.1f %4s\n",
                static_cast<long long>(r.B), r.plan.c_str(), r.nodes, r.wall[0], r.wall[1],
                r.wall_p10[0], r.wall_p90[0], r.enqueue[0], r.enqueue[1], r.event[0], r.event[1],
                r.b2b[0], r.b2b[1], r.check_ok ? "ok" : "BAD");
  }
  std::printf("graph saves (median wall, direct - graph):");
  for (const GraphResult& r : rs)
    std::printf("  B=%lld %.1f us (%.1f%%)", static_cast<long long>(r.B), r.wall[0] - r.wall[1],
                100.0 * (r.wall[0] - r.wall[1]) / r.wall[0]);
  std::printf("\n");
}

int main(int argc, char** argv) {
  const Options opt = Parse(argc, argv);
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "attn_decode_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (opt.prefill) return PrefillMain(opt, prop, stream);
  const auto t0 = std::chrono::steady_clock::now();

  // ---- the streaming denominator: 4 GiB read-only (>> L2), best of three launch shapes ----
  const int64_t stream_bytes = int64_t{4} << 30;
  void* d_stream;
  uint32_t* d_sink;
  CHECK_CUDA(cudaMalloc(&d_stream, stream_bytes));
  CHECK_CUDA(cudaMalloc(&d_sink, 4));
  CHECK_CUDA(cudaMemsetAsync(d_stream, 0x5a, stream_bytes, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const int64_t n16 = stream_bytes / 16;
  const int sms = prop.multiProcessorCount;
  Impl s1{"stream_u4_1024x2", [&](int64_t) {
            StreamRead<4><<<sms * 2, 1024, 0, stream>>>(static_cast<const uint4*>(d_stream), n16, d_sink);
          }};
  Impl s2{"stream_u8_256x8", [&](int64_t) {
            StreamRead<8><<<sms * 8, 256, 0, stream>>>(static_cast<const uint4*>(d_stream), n16, d_sink);
          }};
  Impl s3{"stream_u4_512x4", [&](int64_t) {
            StreamRead<4><<<sms * 4, 512, 0, stream>>>(static_cast<const uint4*>(d_stream), n16, d_sink);
          }};
  std::vector<Impl*> simpls{&s1, &s2, &s3};
  TimeAll(simpls, opt, stream);
  double stream_gbps = 0;
  std::string stream_best;
  for (Impl* im : simpls) {
    const double g = stream_bytes / (im->ms * 1e-3) / 1e9;
    std::fprintf(stderr, "[decode_bench] %s: %.0f GB/s\n", im->name.c_str(), g);
    if (g > stream_gbps) {
      stream_gbps = g;
      stream_best = im->name;
    }
  }
  CHECK_CUDA(cudaFree(d_stream));
  CHECK_CUDA(cudaFree(d_sink));

  std::ostringstream dev;
  dev << "{\"record\":\"device\",\"device\":" << JsonStr(prop.name) << ",\"sm_count\":" << sms
      << ",\"l2_bytes\":" << prop.l2CacheSize << ",\"cc\":" << prop.major * 10 + prop.minor
      << ",\"stream_read_gbps\":" << stream_gbps << ",\"stream_kernel\":" << JsonStr(stream_best)
      << ",\"stream_bytes\":" << stream_bytes << "}";
  std::printf("%s\n", dev.str().c_str());
  std::vector<std::string> json{dev.str()};

  Problem pr;
  std::vector<Result> results;
  bool all_ok = true;
  for (int64_t S : opt.sizes)
    for (DType kvd : {DType::kBFloat16, DType::kFloat8E4M3})
      all_ok &= RunOne(pr, S, kvd, opt, stream_gbps, prop.l2CacheSize, stream, &results, &json);
  std::vector<GraphResult> graph_results;
  for (int64_t gb : opt.graph_sizes) all_ok &= RunGraph(gb, opt, stream, &graph_results, &json);

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // ---- JSON documents ----
  std::string slug;
  for (const char* c = prop.name; *c; ++c) {
    const char ch = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      slug += ch;
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::localtime(&now));
  for (const std::string& dir : opt.json_dirs) {
    const std::string path = dir + "/decode-" + slug + "-" + date + ".json";
    std::ofstream f(path);
    f << "{\"bench\":\"attn_decode_bench\",\"command\":" << JsonStr(opt.command)
      << ",\"all_checks_passed\":" << (all_ok ? "true" : "false") << ",\"wall_s\":" << wall
      << ",\"records\":[\n";
    for (size_t i = 0; i < json.size(); ++i) f << (i ? ",\n" : "") << json[i];
    f << "\n]}\n";
    std::fprintf(stderr, "[decode_bench] wrote %s\n", path.c_str());
  }

  // ---- table last ----
  std::printf("\nstreaming read (denominator): %.0f GB/s (%s, 4 GiB)\n", stream_gbps,
              stream_best.c_str());
  std::printf("decode B=32 N=32 K=8 H=128 T=1, bf16 queries, 16-token pages\n");
  std::printf("%7s %-9s %-11s %9s %9s %7s %12s %11s %8s %4s\n", "S", "kv", "impl", "us", "KV GB/s",
              "frac", "KVtok/s", "steps/s", "p/c", "ok");
  for (const Result& r : results) {
    double contig_ms = 0, bf16_ms = 0;
    for (const Result& o : results) {
      if (o.S == r.S && o.kv == r.kv && o.impl == "contiguous") contig_ms = o.ms;
      if (o.S == r.S && o.kv == "bf16" && o.impl == r.impl) bf16_ms = o.ms;
    }
    std::printf("%7lld %-9s %-11s %9.1f %9.0f %7.3f %12.3e %11.0f %8.3f %4s", static_cast<long long>(r.S),
                r.kv.c_str(), r.impl.c_str(), r.ms * 1e3, r.gbps, r.frac, r.kv_tokens_per_s,
                r.steps_per_s, contig_ms > 0 ? r.ms / contig_ms : 0.0, r.check_ok ? "ok" : "BAD");
    if (r.kv != "bf16" && bf16_ms > 0) std::printf("   fp8 speed-up over bf16: %.2fx", bf16_ms / r.ms);
    std::printf("\n");
  }
  std::printf("targets: paged frac >= 0.85 for S >= 8k (bf16); fp8/bf16 >= 1.7x at S=32k; "
              "paged/contiguous (p/c) <= 1.10\n");
  PrintGraphTable(graph_results);
  std::printf("checks: %s; wall %.1f s\n", all_ok ? "all passed" : "FAILED", wall);
  return all_ok ? 0 : 1;
}
