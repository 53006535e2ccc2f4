// paged_decode_test: the paged KV append kernel and split-KV decode attention (decode family)
// against the float64 CPU reference (CpuAttentionF64) on the contiguous history.
//
// Every paged case:
//   1. draws a K/V history per sequence (random normal, rounded to the input dtype), a pool
//      with MORE pages than needed, pages assigned to sequences in shuffled order, and garbage
//      (NaN bit patterns) in every byte of the pool; block-table entries past a sequence's
//      blocks point at a free (NaN) page;
//   2. writes the history with the append kernel in two steps (prefix, then the T_b newest
//      tokens: appends that start mid-page), then checks the whole pool byte by byte: every
//      token slot holds the expected bits (FP8: a correctly rounded, saturating e4m3 of
//      x / scale), every other byte still holds its garbage;
//   3. runs decode (output and lse poisoned, workspace poisoned) and compares with the
//      reference (bottom-right causal, lse), DESIGN.md §4 tolerances: ‖out − ref‖₂/‖ref‖₂ ≤
//      bf16 1e-2 / fp16 2e-3 / FP8 6e-2 (FP8 against the ORIGINAL unquantised inputs), no row
//      worse than 5× that, rows that see no key exactly 0 with lse −inf, lse within 1e-3
//      (FP8: lse and a dtype-tolerance check against the reference on the dequantised pool,
//      which isolates kernel errors from quantisation error), NaN never passes;
//   4. 16-bit pages: runs decode again with the append folded into it (the pool holding only
//      the prefix, the newest rows in DecodeQueries::new_k / new_v), twice on one workspace,
//      and requires bit-identical o and lse and a byte-identical pool;
//   5. optionally runs the contiguous-K/V variant on the same data and requires bit-identical
//      output (same plan partitions: same arithmetic, different addressing).
// Without a CUDA device the tests skip ("no CUDA device: skipped").
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/paged_decode.h"
#include "attn/kernels/paged_kv.h"
#include "edge_cases.h"
#include "parity_harness.h"

namespace attn::kernels {
namespace {

bool HaveDevice() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

#define CUDA_OK(expr)                                                                         \
  do {                                                                                        \
    const cudaError_t _e = (expr);                                                            \
    if (_e != cudaSuccess) return Internal(std::string(#expr) + ": " + cudaGetErrorName(_e)); \
  } while (0)

/// A device allocation freed on scope exit (tests only: the library never allocates).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Status Alloc(size_t bytes) {
    CUDA_OK(cudaMalloc(&p_, std::max<size_t>(bytes, 256)));
    return Status::Ok();
  }
  Status From(const void* host, size_t bytes) {
    ATTN_RETURN_IF_ERROR(Alloc(bytes));
    if (bytes > 0) CUDA_OK(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice));
    // A pageable host->device cudaMemcpy may return before its DMA lands, and the kernels run
    // on a non-blocking stream that does not wait for the legacy stream: wait here, or the
    // kernel can read the buffer before it is filled (seen as rare wrong results under load).
    CUDA_OK(cudaDeviceSynchronize());
    return Status::Ok();
  }
  template <class T>
  Status FromVec(const std::vector<T>& v) {
    return From(v.data(), v.size() * sizeof(T));
  }
  template <class T>
  Status To(std::vector<T>* v) const {
    if (!v->empty()) {
      CUDA_OK(cudaMemcpy(v->data(), p_, v->size() * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return Status::Ok();
  }
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// ---- FP8 E4M3 on the host ------------------------------------------------------------------

double E4M3ToDouble(uint8_t c) {
  const int e = (c >> 3) & 0xf, m = c & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (c & 0x80) ? -mag : mag;
}

/// Round to nearest even, saturating to ±448 (cvt.rn.satfinite.e4m3x2.f32); NaN -> 0x7f.
uint8_t FloatToE4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_err = a;
  for (int c = 1; c <= 0x7e; ++c) {
    const double err = std::fabs(E4M3ToDouble(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

/// True when `got` is a correct saturating round-to-nearest e4m3 of y (either code of a tie).
bool Fp8ByteOk(uint8_t got, float y) {
  const uint8_t want = FloatToE4M3(y);
  if (got == want) return true;
  const double g = E4M3ToDouble(got), w = E4M3ToDouble(want);
  if (g == w) return true;  // +0 / -0
  if (std::fabs(y) >= 448.f || std::isnan(g)) return false;
  return std::fabs(g - y) == std::fabs(w - y);
}

// ---- Cases -----------------------------------------------------------------------------------

struct Case {
  std::string name;
  DType dtype = DType::kBFloat16;
  DType kv_dtype = DType::kBFloat16;
  int64_t N = 8, K = 2, H = 128;
  int64_t page_tokens = 16;
  std::vector<int32_t> q_lens;   // T_b
  std::vector<int32_t> kv_lens;  // S_b
  int64_t partitions = 0;        // 0: the plan's choice
  bool check_contiguous = true;  // also run ContiguousDecodeRun, require identical output
  float q_gain = 1.f;            // ×8: sharp softmax
  float fp8_scale_div = 400.f;   // FP8 scales = amax / this (400: no saturation)
  uint64_t seed = 1;
};

std::string Describe(const Case& c) {
  std::ostringstream os;
  os << c.name << " [" << DTypeName(c.dtype) << "/" << DTypeName(c.kv_dtype) << " N" << c.N
     << " K" << c.K << " H" << c.H << " pt" << c.page_tokens << " B" << c.q_lens.size()
     << " parts" << c.partitions << "]";
  return os.str();
}

double Tolerance(DType d) {
  return d == DType::kFloat16 ? 2e-3 : (d == DType::kBFloat16 ? 1e-2 : 6e-2);
}

/// Compares o (dtype bits, (total_q, N, H)) and lse with a float64 reference.
/// Returns "" when it passes, otherwise the first violation.
std::string Compare(const Case& c, DType dtype, const std::vector<uint16_t>& o,
                    const std::vector<float>& lse, const std::vector<double>& ref_o,
                    const std::vector<double>& ref_lse, int64_t total_q, double tol,
                    double lse_tol, double* rel_out) {
  const int64_t N = c.N, H = c.H;
  double num = 0, den = 0, worst_row = 0, worst_lse = 0;
  char buf[256];
  for (int64_t r = 0; r < total_q; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t base = (r * N + n) * H;
      const double rl = ref_lse[n * total_q + r];
      const float gl = lse[n * total_q + r];
      double rn = 0, en = 0;
      for (int64_t d = 0; d < H; ++d) {
        const double g = LoadAsFloat(o.data(), dtype, base + d);
        if (std::isnan(g)) {
          std::snprintf(buf, sizeof(buf), "NaN in o at row %lld head %lld dim %lld",
                        static_cast<long long>(r), static_cast<long long>(n),
                        static_cast<long long>(d));
          return buf;
        }
        const double e = g - ref_o[base + d];
        rn += ref_o[base + d] * ref_o[base + d];
        en += e * e;
      }
      if (std::isinf(rl) && rl < 0) {
        if (en != 0 || !(std::isinf(gl) && gl < 0)) {
          std::snprintf(buf, sizeof(buf),
                        "row %lld head %lld sees no key: want zeros and lse -inf, got |o|=%g "
                        "lse=%g",
                        static_cast<long long>(r), static_cast<long long>(n), std::sqrt(en), gl);
          return buf;
        }
        continue;
      }
      if (std::isnan(gl) || std::fabs(gl - rl) > lse_tol) {
        std::snprintf(buf, sizeof(buf), "lse at row %lld head %lld: got %.6f want %.6f",
                      static_cast<long long>(r), static_cast<long long>(n), gl, rl);
        return buf;
      }
      worst_lse = std::max(worst_lse, std::fabs(gl - rl));
      num += en;
      den += rn;
      const double row_rel = rn > 0 ? std::sqrt(en / rn) : std::sqrt(en);
      if (row_rel > 5 * tol) {
        std::snprintf(buf, sizeof(buf), "row %lld head %lld: relative error %.3g > 5 x %.3g",
                      static_cast<long long>(r), static_cast<long long>(n), row_rel, tol);
        return buf;
      }
      worst_row = std::max(worst_row, row_rel);
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (rel_out != nullptr) *rel_out = rel;
  if (rel > tol) {
    std::snprintf(buf, sizeof(buf), "relative L2 error %.3g > %.3g (worst row %.3g)", rel, tol,
                  worst_row);
    return buf;
  }
  return "";
}

/// Runs one case end to end. Returns Ok or the first failure (as INTERNAL with a message).
Status RunCase(const Case& c) {
  const int64_t B = static_cast<int64_t>(c.q_lens.size());
  const int64_t N = c.N, K = c.K, H = c.H, PT = c.page_tokens;
  const bool fp8 = c.kv_dtype == DType::kFloat8E4M3;
  const int kvb = fp8 ? 1 : 2;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);

  // Offsets and extents.
  std::vector<int64_t> q_off(B + 1, 0), kv_off(B + 1, 0), new_off(B + 1, 0), pre_off(B + 1, 0);
  std::vector<int32_t> new_lens(B), pre_lens(B);
  int64_t max_q = 1, max_kv = 0, max_new = 0, max_pre = 0, max_blocks = 0;
  for (int64_t b = 0; b < B; ++b) {
    new_lens[b] = std::min(c.q_lens[b], c.kv_lens[b]);
    pre_lens[b] = c.kv_lens[b] - new_lens[b];
    q_off[b + 1] = q_off[b] + c.q_lens[b];
    kv_off[b + 1] = kv_off[b] + c.kv_lens[b];
    new_off[b + 1] = new_off[b] + new_lens[b];
    pre_off[b + 1] = pre_off[b] + pre_lens[b];
    max_q = std::max<int64_t>(max_q, c.q_lens[b]);
    max_kv = std::max<int64_t>(max_kv, c.kv_lens[b]);
    max_new = std::max<int64_t>(max_new, new_lens[b]);
    max_pre = std::max<int64_t>(max_pre, pre_lens[b]);
    max_blocks = std::max<int64_t>(max_blocks, (c.kv_lens[b] + PT - 1) / PT);
  }
  const int64_t total_q = q_off[B], total_kv = kv_off[B];

  // History (total_kv, K, H) in dtype; queries (total_q, N, H).
  auto draw = [&](int64_t n, float gain) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) {
      const float f = normal(rng) * gain;
      x = c.dtype == DType::kBFloat16 ? FloatToBf16(f) : FloatToFp16(f);
    }
    return v;
  };
  const std::vector<uint16_t> hk = draw(total_kv * K * H, 1.f);
  const std::vector<uint16_t> hv = draw(total_kv * K * H, 1.f);
  const std::vector<uint16_t> hq = draw(total_q * N * H, c.q_gain);
  auto val = [&](const std::vector<uint16_t>& a, int64_t i) {
    return LoadAsFloat(a.data(), c.dtype, i);
  };

  // FP8 scales per (sequence, kv head): amax / fp8_scale_div (1 where the history is empty).
  std::vector<float> k_scales(B * K, 1.f), v_scales(B * K, 1.f);
  if (fp8) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < K; ++h) {
        float ak = 0, av = 0;
        for (int64_t j = kv_off[b]; j < kv_off[b + 1]; ++j)
          for (int64_t d = 0; d < H; ++d) {
            ak = std::max(ak, std::fabs(val(hk, (j * K + h) * H + d)));
            av = std::max(av, std::fabs(val(hv, (j * K + h) * H + d)));
          }
        if (ak > 0) k_scales[b * K + h] = ak / c.fp8_scale_div;
        if (av > 0) v_scales[b * K + h] = av / c.fp8_scale_div;
      }
  }

  // Pool: used pages + 5 free ones, shuffled; every byte garbage (NaN patterns).
  int64_t used_pages = 0;
  for (int64_t b = 0; b < B; ++b) used_pages += (c.kv_lens[b] + PT - 1) / PT;
  const int64_t num_pages = used_pages + 5;
  std::vector<int32_t> order(static_cast<size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const int32_t free_page = order.back();  // never assigned
  const int64_t bt_stride = max_blocks + 3;
  std::vector<int32_t> bt(static_cast<size_t>(B * bt_stride), free_page);
  {
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < (c.kv_lens[b] + PT - 1) / PT; ++i) bt[b * bt_stride + i] = order[next++];
  }
  const int64_t page_elems = K * PT * H;
  const size_t pool_bytes = static_cast<size_t>(num_pages * page_elems * kvb);
  std::vector<uint8_t> garbage(pool_bytes);
  for (size_t i = 0; i < pool_bytes; ++i) garbage[i] = fp8 ? 0x7f : ((i & 1) ? 0x7f : 0xff);

  DeviceBuffer d_kp, d_vp, d_bt, d_kvlen, d_pre_len, d_ks, d_vs, d_sat;
  ATTN_RETURN_IF_ERROR(d_kp.From(garbage.data(), pool_bytes));
  ATTN_RETURN_IF_ERROR(d_vp.From(garbage.data(), pool_bytes));
  ATTN_RETURN_IF_ERROR(d_bt.FromVec(bt));
  ATTN_RETURN_IF_ERROR(d_kvlen.FromVec(c.kv_lens));
  ATTN_RETURN_IF_ERROR(d_pre_len.FromVec(pre_lens));
  ATTN_RETURN_IF_ERROR(d_ks.FromVec(k_scales));
  ATTN_RETURN_IF_ERROR(d_vs.FromVec(v_scales));
  const std::vector<unsigned long long> zero_sat(1, 0);
  ATTN_RETURN_IF_ERROR(d_sat.FromVec(zero_sat));

  PagedKvPool pool;
  pool.k_pages = d_kp.get();
  pool.v_pages = d_vp.get();
  pool.num_pages = num_pages;
  pool.page_tokens = static_cast<int32_t>(PT);
  pool.num_kv_heads = static_cast<int32_t>(K);
  pool.head_dim = static_cast<int32_t>(H);
  pool.kv_dtype = c.kv_dtype;
  PagedBatch batch;
  batch.batch = B;
  batch.block_tables = d_bt.as<int32_t>();
  batch.block_table_stride = bt_stride;
  batch.k_scales = fp8 ? d_ks.as<float>() : nullptr;
  batch.v_scales = fp8 ? d_vs.as<float>() : nullptr;

  // Append in two steps: the prefix (lengths pre_b), then the newest new_b tokens (lengths S_b).
  // The rows an append step writes: per sequence, the prefix or the newest new_b tokens.
  auto rows_of = [&](const std::vector<uint16_t>& h, bool newest) {
    std::vector<uint16_t> out;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t j0 = kv_off[b] + (newest ? pre_lens[b] : 0);
      const int64_t j1 = newest ? kv_off[b + 1] : kv_off[b] + pre_lens[b];
      out.insert(out.end(), h.begin() + j0 * K * H, h.begin() + j1 * K * H);
    }
    return out;
  };
  cudaStream_t stream = nullptr;
  DeviceBuffer d_pre_kp, d_pre_vp;
  for (int step = 0; step < 2; ++step) {
    const bool newest = step == 1;
    const std::vector<int64_t>& off = newest ? new_off : pre_off;
    const std::vector<uint16_t> rk = rows_of(hk, newest);
    const std::vector<uint16_t> rv = rows_of(hv, newest);
    DeviceBuffer d_rk, d_rv, d_off;
    ATTN_RETURN_IF_ERROR(d_rk.FromVec(rk));
    ATTN_RETURN_IF_ERROR(d_rv.FromVec(rv));
    ATTN_RETURN_IF_ERROR(d_off.FromVec(off));
    batch.kv_lengths = newest ? d_kvlen.as<int32_t>() : d_pre_len.as<int32_t>();
    AppendRows rows;
    rows.dtype = c.dtype;
    rows.k = d_rk.get();
    rows.v = d_rv.get();
    rows.new_offsets = d_off.as<int64_t>();
    rows.max_new_tokens = newest ? max_new : max_pre;
    rows.saturations = d_sat.as<unsigned long long>();
    ATTN_RETURN_IF_ERROR(PagedAppendRun(pool, batch, rows, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    if (!newest) {  // the pool holding the prefix only: the folded append's starting point
      ATTN_RETURN_IF_ERROR(d_pre_kp.Alloc(pool_bytes));
      ATTN_RETURN_IF_ERROR(d_pre_vp.Alloc(pool_bytes));
      CUDA_OK(cudaMemcpy(d_pre_kp.get(), d_kp.get(), pool_bytes, cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaMemcpy(d_pre_vp.get(), d_vp.get(), pool_bytes, cudaMemcpyDeviceToDevice));
    }
  }
  batch.kv_lengths = d_kvlen.as<int32_t>();

  // The pool, byte by byte.
  std::vector<uint8_t> kp(pool_bytes), vp(pool_bytes);
  ATTN_RETURN_IF_ERROR(d_kp.To(&kp));
  ATTN_RETURN_IF_ERROR(d_vp.To(&vp));
  std::vector<unsigned long long> sat(1);
  ATTN_RETURN_IF_ERROR(d_sat.To(&sat));
  unsigned long long want_sat = 0;
  {
    // Expected bytes: 16-bit pools the input bits; FP8 pools a correct rounding of x / scale
    // (y_k / y_v hold the quotients, NaN outside token slots); elsewhere the garbage.
    std::vector<uint8_t> expect_k = garbage, expect_v = garbage;
    std::vector<float> y_k, y_v;
    if (fp8) {
      y_k.assign(pool_bytes, std::nanf(""));
      y_v.assign(pool_bytes, std::nanf(""));
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c.kv_lens[b]; ++j)
        for (int64_t h = 0; h < K; ++h) {
          const int64_t page = bt[b * bt_stride + j / PT];
          const int64_t dst = pool.Offset(page, h, j % PT);
          const int64_t src = ((kv_off[b] + j) * K + h) * H;
          for (int64_t d = 0; d < H; ++d) {
            if (!fp8) {
              std::memcpy(&expect_k[(dst + d) * 2], &hk[src + d], 2);
              std::memcpy(&expect_v[(dst + d) * 2], &hv[src + d], 2);
            } else {
              const float yk = val(hk, src + d) / k_scales[b * K + h];
              const float yv = val(hv, src + d) / v_scales[b * K + h];
              want_sat += (std::fabs(yk) > 448.f) + (std::fabs(yv) > 448.f);
              expect_k[dst + d] = FloatToE4M3(yk);
              expect_v[dst + d] = FloatToE4M3(yv);
              y_k[dst + d] = yk;
              y_v[dst + d] = yv;
            }
          }
        }
    auto check_pool = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                          const std::vector<float>& y, const char* which) -> std::string {
      int64_t bad = 0;
      std::string first;
      for (size_t i = 0; i < pool_bytes; ++i) {
        if (got[i] == want[i]) continue;
        if (fp8 && !std::isnan(y[i]) && Fp8ByteOk(got[i], y[i])) continue;
        if (bad++ == 0) {
          char buf[160];
          std::snprintf(buf, sizeof(buf), "%s pool byte %zu (page %lld): got 0x%02x want 0x%02x",
                        which, i, static_cast<long long>(i / (page_elems * kvb)), got[i], want[i]);
          first = buf;
        }
      }
      if (bad == 0) return "";
      return first + " (" + std::to_string(bad) + " bytes differ)";
    };
    std::string e = check_pool(kp, expect_k, y_k, "K");
    if (e.empty()) e = check_pool(vp, expect_v, y_v, "V");
    if (!e.empty()) return Internal("append: " + e);
    if (fp8 && sat[0] != want_sat) {
      return Internal("append: saturation counter " + std::to_string(sat[0]) + ", want " +
                      std::to_string(want_sat));
    }
  }

  // Decode.
  PagedDecodeShape shape;
  shape.source = KvSource::kPaged;
  shape.dtype = c.dtype;
  shape.kv_dtype = c.kv_dtype;
  shape.batch = B;
  shape.max_q_len = max_q;
  shape.max_kv_len = max_kv;
  shape.num_heads = N;
  shape.num_kv_heads = K;
  shape.head_dim = H;
  shape.page_tokens = PT;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  shape.return_lse = true;
  PagedDecodeOptions opt;
  opt.partitions = c.partitions;
  StatusOr<PagedDecodePlan> plan = PagedDecodePlanFor(shape, 0, opt);
  if (!plan.ok()) return plan.status();
  std::printf("  %s: %s\n", Describe(c).c_str(), plan->Describe().c_str());

  DeviceBuffer d_q, d_qoff, d_o, d_lse, d_ws;
  ATTN_RETURN_IF_ERROR(d_q.FromVec(hq));
  ATTN_RETURN_IF_ERROR(d_qoff.FromVec(q_off));
  const std::vector<uint16_t> o_poison(static_cast<size_t>(total_q * N * H), 0x7fff);
  const std::vector<float> lse_poison(static_cast<size_t>(total_q * N), std::nanf(""));
  ATTN_RETURN_IF_ERROR(d_o.FromVec(o_poison));
  ATTN_RETURN_IF_ERROR(d_lse.FromVec(lse_poison));
  ATTN_RETURN_IF_ERROR(d_ws.Alloc(plan->workspace_bytes));
  CUDA_OK(cudaMemset(d_ws.get(), 0xff, std::max<size_t>(plan->workspace_bytes, 256)));
  CUDA_OK(cudaMemset(d_ws.get(), 0, plan->counter_bytes));  // counters start at zero
  CUDA_OK(cudaDeviceSynchronize());  // the memset is on the legacy stream; the run is not
  DecodeQueries dq;
  dq.q = d_q.get();
  dq.q_offsets = d_qoff.as<int64_t>();
  dq.o = d_o.get();
  dq.lse = d_lse.as<float>();
  ATTN_RETURN_IF_ERROR(PagedDecodeRun(*plan, pool, batch, dq, d_ws.get(), stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> o(o_poison.size());
  std::vector<float> lse(lse_poison.size());
  ATTN_RETURN_IF_ERROR(d_o.To(&o));
  ATTN_RETURN_IF_ERROR(d_lse.To(&lse));

  // References: the original history (dtype); for FP8 also the dequantised pool (float32).
  AttentionShape ref_shape;
  ref_shape.layout = Layout::kVarlen;
  ref_shape.dtype = c.dtype;
  ref_shape.batch = B;
  ref_shape.max_q_len = max_q;
  ref_shape.max_kv_len = max_kv;
  ref_shape.total_q = total_q;
  ref_shape.total_kv = total_kv;
  ref_shape.num_heads = N;
  ref_shape.num_kv_heads = K;
  ref_shape.head_dim = H;
  ref_shape.mask.causal = CausalAlignment::kBottomRight;
  ref_shape.scale = shape.scale;
  ref_shape.has_lengths = true;
  ref_shape.return_lse = true;
  AttentionTensors rt;
  rt.q = hq.data();
  rt.k = hk.data();
  rt.v = hv.data();
  rt.q_lengths = c.q_lens.data();
  rt.kv_lengths = c.kv_lens.data();
  rt.q_offsets = q_off.data();
  rt.kv_offsets = kv_off.data();
  std::vector<double> ref_o(static_cast<size_t>(total_q * N * H)), ref_lse(total_q * N);
  ATTN_RETURN_IF_ERROR(CpuAttentionF64(ref_shape, rt, ref_o.data(), ref_lse.data()));

  double rel = 0;
  std::string err;
  if (!fp8) {
    err = Compare(c, c.dtype, o, lse, ref_o, ref_lse, total_q, Tolerance(c.dtype), 1e-3, &rel);
    if (!err.empty()) return Internal("decode vs reference: " + err);
  } else {
    // Against the original inputs: FP8 tolerance; lse only loosely (quantisation moves it).
    err = Compare(c, c.dtype, o, lse, ref_o, ref_lse, total_q, Tolerance(c.kv_dtype), 0.25, &rel);
    if (!err.empty()) return Internal("decode (FP8) vs unquantised reference: " + err);
    // Against the dequantised pool (what the kernel read): dtype tolerance, lse 1e-3.
    std::vector<float> dk(static_cast<size_t>(total_kv * K * H)), dv(dk.size()), fq(hq.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c.kv_lens[b]; ++j)
        for (int64_t h = 0; h < K; ++h) {
          const int64_t page = bt[b * bt_stride + j / PT];
          const int64_t src = pool.Offset(page, h, j % PT);
          for (int64_t d = 0; d < H; ++d) {
            const int64_t i = ((kv_off[b] + j) * K + h) * H + d;
            dk[i] = static_cast<float>(E4M3ToDouble(kp[src + d])) * k_scales[b * K + h];
            dv[i] = static_cast<float>(E4M3ToDouble(vp[src + d])) * v_scales[b * K + h];
          }
        }
    for (size_t i = 0; i < fq.size(); ++i) fq[i] = val(hq, static_cast<int64_t>(i));
    AttentionShape s32 = ref_shape;
    s32.dtype = DType::kFloat32;
    AttentionTensors t32 = rt;
    t32.q = fq.data();
    t32.k = dk.data();
    t32.v = dv.data();
    std::vector<double> ref2_o(ref_o.size()), ref2_lse(ref_lse.size());
    ATTN_RETURN_IF_ERROR(CpuAttentionF64(s32, t32, ref2_o.data(), ref2_lse.data()));
    double rel2 = 0;
    err = Compare(c, c.dtype, o, lse, ref2_o, ref2_lse, total_q, Tolerance(c.dtype), 1e-3, &rel2);
    if (!err.empty()) return Internal("decode (FP8) vs dequantised reference: " + err);
    std::printf("    rel_l2 vs dequantised %.3g\n", rel2);
  }
  std::printf("    rel_l2 %.3g\n", rel);

  // The folded append (16-bit pages, every T_b <= S_b): the pool holding only the prefix, the
  // newest rows in new_k / new_v, one decode launch. Same o and lse bit for bit, same pool
  // bytes, and the counters back at zero (the workspace is reused, unzeroed, for a second run).
  bool foldable = !fp8;
  for (int64_t b = 0; b < B; ++b) foldable = foldable && c.q_lens[b] <= c.kv_lens[b];
  if (foldable) {
    DeviceBuffer d_nk, d_nv, d_o3, d_lse3;
    ATTN_RETURN_IF_ERROR(d_nk.FromVec(rows_of(hk, true)));
    ATTN_RETURN_IF_ERROR(d_nv.FromVec(rows_of(hv, true)));
    ATTN_RETURN_IF_ERROR(d_o3.FromVec(o_poison));
    ATTN_RETURN_IF_ERROR(d_lse3.FromVec(lse_poison));
    PagedKvPool pool3 = pool;
    pool3.k_pages = d_pre_kp.get();
    pool3.v_pages = d_pre_vp.get();
    DecodeQueries dq3 = dq;
    dq3.o = d_o3.get();
    dq3.lse = d_lse3.as<float>();
    dq3.new_k = d_nk.get();
    dq3.new_v = d_nv.get();
    for (int run = 0; run < 2; ++run) {
      ATTN_RETURN_IF_ERROR(PagedDecodeRun(*plan, pool3, batch, dq3, d_ws.get(), stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      CUDA_OK(cudaGetLastError());
      std::vector<uint16_t> o3(o.size());
      std::vector<float> lse3(lse.size());
      std::vector<uint8_t> kp3(pool_bytes), vp3(pool_bytes);
      ATTN_RETURN_IF_ERROR(d_o3.To(&o3));
      ATTN_RETURN_IF_ERROR(d_lse3.To(&lse3));
      ATTN_RETURN_IF_ERROR(d_pre_kp.To(&kp3));
      ATTN_RETURN_IF_ERROR(d_pre_vp.To(&vp3));
      if (std::memcmp(o.data(), o3.data(), o.size() * 2) != 0 ||
          std::memcmp(lse.data(), lse3.data(), lse.size() * 4) != 0) {
        return Internal("folded append: decode output differs from append + decode (run " +
                        std::to_string(run) + ")");
      }
      if (kp3 != kp || vp3 != vp) {
        return Internal("folded append: the pool differs from PagedAppendRun's (run " +
                        std::to_string(run) + ")");
      }
    }
    std::printf("    folded append: identical output and pool\n");
  }

  // The contiguous variant on the same (quantised) data: bit-identical output.
  if (c.check_contiguous) {
    PagedDecodeShape cs = shape;
    cs.source = KvSource::kContiguous;
    PagedDecodeOptions copt;
    copt.partitions = plan->partitions;
    StatusOr<PagedDecodePlan> cplan = PagedDecodePlanFor(cs, 0, copt);
    if (!cplan.ok()) return cplan.status();
    if (cplan->partitions != plan->partitions || cplan->partition_tokens != plan->partition_tokens) {
      return Internal("contiguous plan differs: " + cplan->Describe() + " vs " + plan->Describe());
    }
    const int64_t cap = max_kv + 7;  // slots past S_b hold garbage
    std::vector<uint8_t> ck(static_cast<size_t>(B * cap * K * H * kvb)), cv(ck.size());
    for (size_t i = 0; i < ck.size(); ++i) ck[i] = cv[i] = fp8 ? 0x7f : ((i & 1) ? 0x7f : 0xff);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c.kv_lens[b]; ++j)
        for (int64_t h = 0; h < K; ++h) {
          const int64_t page = bt[b * bt_stride + j / PT];
          const int64_t src = pool.Offset(page, h, j % PT) * kvb;
          const int64_t dst = ((b * cap + j) * K + h) * H * kvb;
          std::memcpy(&ck[dst], &kp[src], H * kvb);
          std::memcpy(&cv[dst], &vp[src], H * kvb);
        }
    DeviceBuffer d_ck, d_cv, d_o2, d_lse2, d_ws2;
    ATTN_RETURN_IF_ERROR(d_ck.FromVec(ck));
    ATTN_RETURN_IF_ERROR(d_cv.FromVec(cv));
    ATTN_RETURN_IF_ERROR(d_o2.FromVec(o_poison));
    ATTN_RETURN_IF_ERROR(d_lse2.FromVec(lse_poison));
    ATTN_RETURN_IF_ERROR(d_ws2.Alloc(cplan->workspace_bytes));
    CUDA_OK(cudaMemset(d_ws2.get(), 0, cplan->counter_bytes));
    CUDA_OK(cudaDeviceSynchronize());
    ContiguousKv kv;
    kv.k = d_ck.get();
    kv.v = d_cv.get();
    kv.capacity = cap;
    kv.kv_lengths = d_kvlen.as<int32_t>();
    kv.k_scales = fp8 ? d_ks.as<float>() : nullptr;
    kv.v_scales = fp8 ? d_vs.as<float>() : nullptr;
    DecodeQueries dq2 = dq;
    dq2.o = d_o2.get();
    dq2.lse = d_lse2.as<float>();
    ATTN_RETURN_IF_ERROR(ContiguousDecodeRun(*cplan, kv, dq2, d_ws2.get(), stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> o2(o.size());
    std::vector<float> lse2(lse.size());
    ATTN_RETURN_IF_ERROR(d_o2.To(&o2));
    ATTN_RETURN_IF_ERROR(d_lse2.To(&lse2));
    if (std::memcmp(o.data(), o2.data(), o.size() * 2) != 0 ||
        std::memcmp(lse.data(), lse2.data(), lse.size() * 4) != 0) {
      return Internal("contiguous decode output differs from paged decode on the same data");
    }
  }
  return Status::Ok();
}

class PagedDecodeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
  }
};

void RunAll(const std::vector<Case>& cases) {
  int failed = 0;
  for (const Case& c : cases) {
    const Status s = RunCase(c);
    if (!s.ok()) {
      ++failed;
      ADD_FAILURE() << Describe(c) << ": " << s.ToString();
    }
  }
  std::printf("[paged_decode] %zu cases, %d failed\n", cases.size(), failed);
}

const DType kF16 = DType::kFloat16;
const DType kBF16 = DType::kBFloat16;
const DType kE4M3 = DType::kFloat8E4M3;

/// Every (dtype, kv dtype) × head dim × page size on decode (T=1) and speculative (T=5)
/// batches: S < one page, S not a multiple of the page, S = 0, T > S, long S.
TEST_F(PagedDecodeGpu, DtypesHeadDimsPageSizes) {
  std::vector<Case> cases;
  uint64_t seed = 100;
  for (auto [dt, kdt] : {std::pair{kF16, kF16}, std::pair{kBF16, kBF16}, std::pair{kF16, kE4M3},
                         std::pair{kBF16, kE4M3}})
    for (int64_t H : {64, 128})
      for (int64_t pt : {16, 32}) {
        Case c;
        c.dtype = dt;
        c.kv_dtype = kdt;
        c.H = H;
        c.page_tokens = pt;
        c.N = 8;
        c.K = 2;
        c.seed = seed++;
        c.name = "decode T=1";
        c.q_lens = {1, 1, 1, 1, 1, 1, 1};
        c.kv_lens = {1, 7, 16, 33, 0, 517, 1000};
        cases.push_back(c);
        c.seed = seed++;
        c.name = "speculative T=5";
        c.q_lens = {5, 5, 5, 5, 2};
        c.kv_lens = {5, 3, 64, 300, 0};
        cases.push_back(c);
      }
  RunAll(cases);
}

/// GQA groups 1/4/8 (N=8) and 4/16/32 (N=32) at T=1 and T=5 (up to 10 row chunks per head).
TEST_F(PagedDecodeGpu, GroupedHeads) {
  std::vector<Case> cases;
  uint64_t seed = 200;
  for (DType kdt : {kBF16, kE4M3})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{8, 8}, {8, 2}, {8, 1}, {32, 8}, {32, 2},
                        {32, 1}})
      for (int T : {1, 5}) {
        Case c;
        c.dtype = kBF16;
        c.kv_dtype = kdt;
        c.N = N;
        c.K = K;
        c.H = 128;
        c.seed = seed++;
        c.name = "gqa T=" + std::to_string(T);
        c.q_lens = {T, T, T};
        c.kv_lens = {T + 40, 250, 129};
        cases.push_back(c);
      }
  RunAll(cases);
}

/// Forced partition counts: 1 (direct output), 2, 7, and as many as there are tiles, on
/// sequences of very different lengths (partitions past S_b are skipped and not merged).
TEST_F(PagedDecodeGpu, Partitions) {
  std::vector<Case> cases;
  uint64_t seed = 300;
  for (DType dt : {kF16, kBF16})
    for (DType kdt : {dt, kE4M3})
      for (int64_t parts : {1, 2, 7, 100000}) {
        Case c;
        c.dtype = dt;
        c.kv_dtype = kdt;
        c.N = 16;
        c.K = 4;
        c.H = 64;
        c.page_tokens = 16;
        c.partitions = parts;
        c.seed = seed++;
        c.name = "partitions";
        c.q_lens = {1, 3, 1, 4, 1};
        c.kv_lens = {2000, 3, 0, 700, 65};
        cases.push_back(c);
      }
  RunAll(cases);
}

/// The benchmark's configuration, smaller: B=32, N=32, K=8, H=128, random S up to 3000,
/// the plan's own partitions; bf16, fp16 and FP8 pages; page sizes 16 and 32.
TEST_F(PagedDecodeGpu, LargeBatch) {
  std::vector<Case> cases;
  uint64_t seed = 400;
  for (auto [dt, kdt, pt] : {std::tuple{kBF16, kBF16, 16}, std::tuple{kF16, kF16, 32},
                             std::tuple{kBF16, kE4M3, 16}, std::tuple{kF16, kE4M3, 32}}) {
    Case c;
    c.dtype = dt;
    c.kv_dtype = kdt;
    c.N = 32;
    c.K = 8;
    c.H = 128;
    c.page_tokens = pt;
    c.seed = seed++;
    c.name = "B=32";
    std::mt19937 r(static_cast<uint32_t>(c.seed));
    for (int b = 0; b < 32; ++b) {
      c.q_lens.push_back(1);
      c.kv_lens.push_back(static_cast<int32_t>(1 + r() % 1500));
    }
    cases.push_back(c);
  }
  RunAll(cases);
}

/// Pages smaller than a loader thread's run of rows (8 rows for 16-bit H=128, 4 for 16-bit H=64
/// and FP8 H=128, 2 for FP8 H=64): 1, 2, 4 and 8 tokens, where the kernel looks every row up
/// on its own instead of one block-table entry per thread per tile; T=1 and T=3, one and three
/// partitions (partitions that start mid-sequence).
TEST_F(PagedDecodeGpu, SmallPages) {
  std::vector<Case> cases;
  uint64_t seed = 600;
  for (auto [dt, kdt] : {std::pair{kBF16, kBF16}, std::pair{kF16, kF16}, std::pair{kBF16, kE4M3},
                         std::pair{kF16, kE4M3}})
    for (int64_t H : {64, 128})
      for (int64_t pt : {1, 2, 4, 8}) {
        Case c;
        c.dtype = dt;
        c.kv_dtype = kdt;
        c.H = H;
        c.page_tokens = pt;
        c.N = 8;
        c.K = 2;
        c.partitions = pt == 2 ? 3 : 0;
        c.seed = seed++;
        c.name = "small pages";
        c.q_lens = {1, 3, 1, 3};
        c.kv_lens = {1, 70, 0, 333};
        cases.push_back(c);
      }
  RunAll(cases);
}

/// Long sequences, one partition (the plan may pick more): many tiles per block, so the
/// block-table entries loaded a tile ahead and the L2 prefetches run far past the prologue;
/// 16-token pages, all (dtype, kv dtype) pairs, page-aligned and ragged lengths.
TEST_F(PagedDecodeGpu, LongSequences) {
  std::vector<Case> cases;
  uint64_t seed = 700;
  for (auto [dt, kdt] : {std::pair{kBF16, kBF16}, std::pair{kF16, kF16}, std::pair{kBF16, kE4M3},
                         std::pair{kF16, kE4M3}})
    for (int64_t parts : {1, 0}) {
      Case c;
      c.dtype = dt;
      c.kv_dtype = kdt;
      c.H = 128;
      c.N = 8;
      c.K = 2;
      c.partitions = parts;
      c.seed = seed++;
      c.name = "long";
      c.q_lens = {1, 2};
      c.kv_lens = {4096, 3001};
      cases.push_back(c);
    }
  RunAll(cases);
}

/// Sharp softmax (queries × 8) for the 16-bit paths, with many partitions.
TEST_F(PagedDecodeGpu, SharpLogits) {
  std::vector<Case> cases;
  uint64_t seed = 500;
  for (DType dt : {kF16, kBF16})
    for (int64_t H : {64, 128}) {
      Case c;
      c.dtype = dt;
      c.kv_dtype = dt;
      c.H = H;
      c.N = 8;
      c.K = 2;
      c.q_gain = 8.f;
      c.partitions = 5;
      c.seed = seed++;
      c.name = "logits x8";
      c.q_lens = {1, 5};
      c.kv_lens = {1500, 777};
      cases.push_back(c);
    }
  RunAll(cases);
}

/// FP8 append with scales so small that many values saturate (append only: clipped values
/// would not meet the decode tolerance against the unquantised reference): the counter must
/// count |x / scale| > 448 exactly, the bytes must be ±448 there, a correct rounding elsewhere,
/// and the garbage around the written slots must survive.
TEST_F(PagedDecodeGpu, Fp8Saturation) {
  struct AppendOnly {
    static Status Run(DType dt) {
      const int64_t B = 3, K = 2, H = 64, PT = 16;
      const std::vector<int32_t> lens = {5, 40, 17};
      std::mt19937_64 rng(7);
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<int64_t> off(B + 1, 0);
      for (int64_t b = 0; b < B; ++b) off[b + 1] = off[b] + lens[b];
      const int64_t total = off[B];
      std::vector<uint16_t> k(static_cast<size_t>(total * K * H)), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) {
        const float a = normal(rng) * 3.f, c = normal(rng) * 3.f;
        k[i] = dt == DType::kBFloat16 ? FloatToBf16(a) : FloatToFp16(a);
        v[i] = dt == DType::kBFloat16 ? FloatToBf16(c) : FloatToFp16(c);
      }
      const std::vector<float> scales = {0.004f, 0.01f, 0.02f, 0.003f, 0.5f, 0.007f};
      int64_t pages = 0;
      for (int32_t l : lens) pages += (l + PT - 1) / PT;
      pages += 2;
      const int64_t stride = 4;
      std::vector<int32_t> bt(static_cast<size_t>(B * stride), static_cast<int32_t>(pages - 1));
      int32_t next = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < (lens[b] + PT - 1) / PT; ++i) bt[b * stride + i] = next++;
      const size_t bytes = static_cast<size_t>(pages * K * PT * H);
      std::vector<uint8_t> garbage(bytes, 0x7f);
      DeviceBuffer dk, dv, dkp, dvp, dbt, dlen, doff, dsc, dsat;
      ATTN_RETURN_IF_ERROR(dk.FromVec(k));
      ATTN_RETURN_IF_ERROR(dv.FromVec(v));
      ATTN_RETURN_IF_ERROR(dkp.FromVec(garbage));
      ATTN_RETURN_IF_ERROR(dvp.FromVec(garbage));
      ATTN_RETURN_IF_ERROR(dbt.FromVec(bt));
      ATTN_RETURN_IF_ERROR(dlen.FromVec(lens));
      ATTN_RETURN_IF_ERROR(doff.FromVec(off));
      ATTN_RETURN_IF_ERROR(dsc.FromVec(scales));
      ATTN_RETURN_IF_ERROR(dsat.FromVec(std::vector<unsigned long long>(1, 0)));
      PagedKvPool pool;
      pool.k_pages = dkp.get();
      pool.v_pages = dvp.get();
      pool.num_pages = pages;
      pool.page_tokens = PT;
      pool.num_kv_heads = K;
      pool.head_dim = H;
      pool.kv_dtype = DType::kFloat8E4M3;
      PagedBatch batch;
      batch.batch = B;
      batch.block_tables = dbt.as<int32_t>();
      batch.block_table_stride = stride;
      batch.kv_lengths = dlen.as<int32_t>();
      batch.k_scales = dsc.as<float>();
      batch.v_scales = dsc.as<float>();  // same scales for V
      AppendRows rows;
      rows.dtype = dt;
      rows.k = dk.get();
      rows.v = dv.get();
      rows.new_offsets = doff.as<int64_t>();
      rows.max_new_tokens = 40;
      rows.saturations = dsat.as<unsigned long long>();
      ATTN_RETURN_IF_ERROR(PagedAppendRun(pool, batch, rows, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint8_t> kp(bytes), vp(bytes);
      std::vector<unsigned long long> sat(1);
      ATTN_RETURN_IF_ERROR(dkp.To(&kp));
      ATTN_RETURN_IF_ERROR(dvp.To(&vp));
      ATTN_RETURN_IF_ERROR(dsat.To(&sat));
      std::vector<uint8_t> ek = garbage, ev = garbage;
      std::vector<float> yk_at(bytes, std::nanf("")), yv_at(bytes, std::nanf(""));
      unsigned long long want = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < lens[b]; ++j)
          for (int64_t h = 0; h < K; ++h) {
            const int64_t dst = pool.Offset(bt[b * stride + j / PT], h, j % PT);
            for (int64_t d = 0; d < H; ++d) {
              const int64_t i = ((off[b] + j) * K + h) * H + d;
              const float yk = LoadAsFloat(k.data(), dt, i) / scales[b * K + h];
              const float yv = LoadAsFloat(v.data(), dt, i) / scales[b * K + h];
              want += (std::fabs(yk) > 448.f) + (std::fabs(yv) > 448.f);
              ek[dst + d] = FloatToE4M3(yk);
              ev[dst + d] = FloatToE4M3(yv);
              yk_at[dst + d] = yk;
              yv_at[dst + d] = yv;
            }
          }
      int64_t bad = 0;
      for (size_t i = 0; i < bytes; ++i) {
        bad += kp[i] != ek[i] && (std::isnan(yk_at[i]) || !Fp8ByteOk(kp[i], yk_at[i]));
        bad += vp[i] != ev[i] && (std::isnan(yv_at[i]) || !Fp8ByteOk(vp[i], yv_at[i]));
      }
      if (bad != 0) return Internal(std::to_string(bad) + " pool bytes differ");
      if (want == 0) return Internal("test setup: no saturation drawn");
      if (sat[0] != want) {
        return Internal("saturations " + std::to_string(sat[0]) + ", want " + std::to_string(want));
      }
      std::printf("  %s: %llu saturations counted\n", DTypeName(dt), sat[0]);
      return Status::Ok();
    }
  };
  for (DType dt : {kF16, kBF16}) {
    const Status s = AppendOnly::Run(dt);
    EXPECT_TRUE(s.ok()) << DTypeName(dt) << ": " << s.ToString();
  }
}

/// Refusals with reasons (no device needed for Supports).
TEST(PagedDecodeSupports, Refusals) {
  PagedDecodeShape s;
  s.batch = 2;
  s.max_q_len = 1;
  s.max_kv_len = 100;
  s.num_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.scale = 0.1f;
  EXPECT_TRUE(PagedDecodeSupports(s).ok());
  PagedDecodeShape t = s;
  t.head_dim = 96;
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(PagedDecodeSupports(t).message().find("head dim 96"), std::string::npos);
  t = s;
  t.dtype = DType::kFloat32;
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kFailedPrecondition);
  t = s;
  t.kv_dtype = DType::kFloat16;  // q bf16, pages fp16
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kFailedPrecondition);
  t = s;
  t.num_heads = 7;
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kInvalidArgument);
  t = s;
  t.page_tokens = 24;
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kFailedPrecondition);
  t = s;
  t.max_q_len = kPagedDecodeMaxQueryLen + 1;
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kFailedPrecondition);
  t = s;
  t.scale = 0.f;
  EXPECT_EQ(PagedDecodeSupports(t).code(), StatusCode::kFailedPrecondition);
}

// ---- Edge cases through the parity harness (contiguous decode: the same kernel as paged) ----

/// Runs a padded harness case (bottom-right causal, or no mask with T = 1) with
/// ContiguousDecodeRun: q packed by q_lengths, K/V (B, S, K, H) as they are, o and lse
/// unpacked into the harness layout (padding rows zero, lse -inf).
Status RunDecodeCase(const parity::HostCase& c, parity::HostOutputs* out) {
  const AttentionShape& s = c.shape;
  const int64_t B = s.batch, T = s.max_q_len, S = s.max_kv_len, N = s.num_heads;
  const int64_t K = s.num_kv_heads, H = s.head_dim;
  const int es = DTypeSize(s.dtype);
  std::vector<int64_t> q_off(B + 1, 0);
  std::vector<int32_t> kv_lens(B);
  for (int64_t b = 0; b < B; ++b) {
    q_off[b + 1] = q_off[b] + (s.has_lengths ? c.q_lengths[b] : T);
    kv_lens[b] = static_cast<int32_t>(s.has_lengths ? c.kv_lengths[b] : S);
  }
  const int64_t total_q = q_off[B];
  std::vector<uint8_t> q(static_cast<size_t>(std::max<int64_t>(total_q, 1) * N * H * es));
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(q.data() + q_off[b] * N * H * es, c.q.data() + b * T * N * H * es,
                (q_off[b + 1] - q_off[b]) * N * H * es);
  PagedDecodeShape shape;
  shape.source = KvSource::kContiguous;
  shape.dtype = s.dtype;
  shape.kv_dtype = s.dtype;
  shape.batch = B;
  shape.max_q_len = T;
  shape.max_kv_len = S;
  shape.num_heads = N;
  shape.num_kv_heads = K;
  shape.head_dim = H;
  shape.page_tokens = 16;
  shape.scale = s.scale;
  shape.return_lse = true;
  StatusOr<PagedDecodePlan> plan = PagedDecodePlanFor(shape, 0, PagedDecodeOptions{});
  if (!plan.ok()) return plan.status();
  DeviceBuffer d_q, d_qoff, d_k, d_v, d_len, d_o, d_lse, d_ws;
  ATTN_RETURN_IF_ERROR(d_q.FromVec(q));
  ATTN_RETURN_IF_ERROR(d_qoff.FromVec(q_off));
  ATTN_RETURN_IF_ERROR(d_k.FromVec(c.k));
  ATTN_RETURN_IF_ERROR(d_v.FromVec(c.v));
  ATTN_RETURN_IF_ERROR(d_len.FromVec(kv_lens));
  ATTN_RETURN_IF_ERROR(d_o.Alloc(q.size()));
  ATTN_RETURN_IF_ERROR(d_lse.Alloc(std::max<int64_t>(total_q, 1) * N * sizeof(float)));
  ATTN_RETURN_IF_ERROR(d_ws.Alloc(plan->workspace_bytes));
  CUDA_OK(cudaMemset(d_ws.get(), 0, plan->counter_bytes));  // counters start at zero
  CUDA_OK(cudaDeviceSynchronize());
  ContiguousKv kv;
  kv.k = d_k.get();
  kv.v = d_v.get();
  kv.capacity = S;
  kv.kv_lengths = d_len.as<int32_t>();
  DecodeQueries dq;
  dq.q = d_q.get();
  dq.q_offsets = d_qoff.as<int64_t>();
  dq.o = d_o.get();
  dq.lse = d_lse.as<float>();
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Status run = ContiguousDecodeRun(*plan, kv, dq, d_ws.get(), stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  (void)cudaStreamDestroy(stream);
  ATTN_RETURN_IF_ERROR(run);
  CUDA_OK(sync);
  std::vector<uint8_t> o(q.size());
  std::vector<float> lse(static_cast<size_t>(std::max<int64_t>(total_q, 1) * N));
  ATTN_RETURN_IF_ERROR(d_o.To(&o));
  ATTN_RETURN_IF_ERROR(d_lse.To(&lse));
  std::fill(out->o.begin(), out->o.end(), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t rows = q_off[b + 1] - q_off[b];
    std::memcpy(out->o.data() + b * T * N * H * es, o.data() + q_off[b] * N * H * es,
                rows * N * H * es);
    for (int64_t h = 0; h < N; ++h)
      for (int64_t t = 0; t < T; ++t)
        out->lse[(b * N + h) * T + t] =
            t < rows ? lse[h * total_q + q_off[b] + t] : -std::numeric_limits<float>::infinity();
  }
  return Status::Ok();
}

parity::KernelRunner DecodeRunner() {
  parity::KernelRunner r;
  r.name = "decode-contiguous";
  r.supports = [](const AttentionShape& s) -> Status {
    const bool mask_ok = s.mask.window_left < 0 && s.mask.window_right < 0 &&
                         (s.mask.causal == CausalAlignment::kBottomRight ||
                          (s.mask.causal == CausalAlignment::kNone && s.max_q_len == 1));
    if (!mask_ok) return FailedPrecondition("decode: bottom-right causal without windows only");
    if (s.layout != Layout::kPadded) return FailedPrecondition("decode runner: padded cases");
    PagedDecodeShape d;
    d.source = KvSource::kContiguous;
    d.dtype = s.dtype;
    d.kv_dtype = s.dtype;
    d.batch = s.batch;
    d.max_q_len = s.max_q_len;
    d.max_kv_len = s.max_kv_len;
    d.num_heads = s.num_heads;
    d.num_kv_heads = s.num_kv_heads;
    d.head_dim = s.head_dim;
    d.page_tokens = 16;
    d.scale = s.scale;
    return PagedDecodeSupports(d);
  };
  r.run = RunDecodeCase;
  r.exact_single_key = true;
  return r;
}

// Large magnitudes (finite, single-key rows exactly v), very negative logits, NaN/±Inf at keys
// that causally masked rows or padding cannot see (edge_cases.h), on the decode kernel.
TEST_F(PagedDecodeGpu, EdgeCases) {
  parity::EdgeOptions opt;
  opt.head_dims = {64, 128};
  const parity::KernelRunner runner = DecodeRunner();
  int passed = 0, failed = 0, skipped = 0;
  for (const parity::HostCase& c : parity::EdgeCases(opt)) {
    const parity::CaseResult r = parity::RunCase(runner, c);
    if (r.skipped) {
      ++skipped;
    } else if (r.passed) {
      ++passed;
    } else if (++failed <= 25) {
      ADD_FAILURE() << r.name << ": " << r.failure;
    }
  }
  std::printf("[decode edge] %d passed, %d failed, %d skipped (masks decode does not take)\n",
              passed, failed, skipped);
  EXPECT_EQ(failed, 0);
  EXPECT_GT(passed, 10);
}

}  // namespace
}  // namespace attn::kernels
