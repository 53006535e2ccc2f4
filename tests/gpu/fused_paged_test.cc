// fused_paged_test: the fused kernel reading K/V through a paged KV cache (FusedPagedRun, prefill
// over the cache) against the float64 CPU reference, and against the contiguous fused kernel on
// the same data.
//
// Every case:
//   1. draws a K/V history per sequence and the queries (random normal, rounded to the dtype),
//      a pool with MORE pages than needed (5 never used), pages assigned to the sequences in
//      shuffled (non-monotonic) order, every element of the pool NaN before the history is
//      written with the host append (PagedAppendCpu), so unused pages and the slots past S_b
//      in a sequence's last page stay NaN; block-table entries past a sequence's blocks name a
//      NaN page (or, in UnusedBlockTableEntriesAreNeverRead, an index far outside the pool);
//   2. runs the paged kernel (o and lse poisoned first) and compares with CpuAttentionF64 on
//      the contiguous history (varlen, the case's mask: bottom-right causal unless stated, so
//      the T_b queries are the last T_b tokens of S_b, a cached prefix when S_b > T_b), with the
//      tolerances of DESIGN.md §4 (‖out − ref‖₂/‖ref‖₂ ≤ fp16 2e-3 / bf16 1e-2, no row worse
//      than 5×, rows that see no key exactly 0 with lse −inf, lse within 1e-3, NaN never
//      passes);
//   3. runs the contiguous fused kernel with the same tile (FusedPagedPlan::variant) on the
//      contiguous history and requires bit-identical o and lse (same arithmetic, different
//      addressing).
// Without a CUDA device the GPU tests skip ("no CUDA device: skipped").
// ATTN_PARITY_OUT=<path>: per-case results appended as JSON lines (runner "fused_paged/...").
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/fused_attention.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/paged_kv.h"
#include "attn/kernels/paged_kv_cpu.h"
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
  Status From(const void* host, size_t bytes) {
    CUDA_OK(cudaMalloc(&p_, std::max<size_t>(bytes, 256)));
    if (bytes > 0) CUDA_OK(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice));
    // A pageable host->device cudaMemcpy may return before its DMA lands, and the kernels run
    // on a non-blocking stream that does not wait for the legacy stream: wait here.
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

cudaStream_t Stream() {
  static cudaStream_t s = [] {
    cudaStream_t st = nullptr;
    (void)cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    return st;
  }();
  return s;
}

constexpr uint16_t kNaN16 = 0x7fff;  // NaN in both fp16 and bf16

struct Case {
  std::string name;
  DType dtype = DType::kBFloat16;
  int64_t N = 8, K = 2, H = 128;
  int64_t page_tokens = 16;
  std::vector<int32_t> q_lens;   // T_b
  std::vector<int32_t> kv_lens;  // S_b
  MaskSpec mask{CausalAlignment::kBottomRight, -1, -1};
  float q_gain = 1.f;                    // ×8: sharp softmax
  int32_t unused_bt_entry = -1;          // -1: a NaN page; otherwise this value (never read)
  bool check_contiguous = true;
  uint64_t seed = 1;
};

std::string Describe(const Case& c) {
  std::ostringstream os;
  os << c.name << " [" << DTypeName(c.dtype) << " N" << c.N << " K" << c.K << " H" << c.H
     << " pt" << c.page_tokens << " T";
  for (size_t b = 0; b < c.q_lens.size(); ++b) os << (b ? "," : "") << c.q_lens[b];
  os << " S";
  for (size_t b = 0; b < c.kv_lens.size(); ++b) os << (b ? "," : "") << c.kv_lens[b];
  os << " " << CausalAlignmentName(c.mask.causal);
  if (c.mask.window_left >= 0 || c.mask.window_right >= 0) {
    os << " w" << c.mask.window_left << "/" << c.mask.window_right;
  }
  os << "]";
  return os.str();
}

double Tolerance(DType d) { return d == DType::kFloat16 ? 2e-3 : 1e-2; }

/// Compares o ((total_q, N, H) dtype bits) and lse ((N, total_q)) with the float64 reference;
/// fills `r` (passed, rel_l2, worst row, worst lse, failure).
void Compare(const Case& c, const std::vector<uint16_t>& o, const std::vector<float>& lse,
             const std::vector<double>& ref_o, const std::vector<double>& ref_lse,
             int64_t total_q, parity::CaseResult* r) {
  const int64_t N = c.N, H = c.H;
  const double tol = Tolerance(c.dtype);
  double num = 0, den = 0;
  char buf[256];
  auto fail = [&](const char* msg) {
    r->passed = false;
    r->failure = msg;
  };
  r->passed = true;
  for (int64_t row = 0; row < total_q; ++row) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t base = (row * N + n) * H;
      const double rl = ref_lse[n * total_q + row];
      const float gl = lse[n * total_q + row];
      double rn = 0, en = 0;
      for (int64_t d = 0; d < H; ++d) {
        const double g = LoadAsFloat(o.data(), c.dtype, base + d);
        if (std::isnan(g)) {
          std::snprintf(buf, sizeof(buf), "NaN in o at row %lld head %lld dim %lld",
                        static_cast<long long>(row), static_cast<long long>(n),
                        static_cast<long long>(d));
          return fail(buf);
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
                        static_cast<long long>(row), static_cast<long long>(n), std::sqrt(en),
                        gl);
          return fail(buf);
        }
        continue;
      }
      if (std::isnan(gl) || std::fabs(gl - rl) > 1e-3) {
        std::snprintf(buf, sizeof(buf), "lse at row %lld head %lld: got %.6f want %.6f",
                      static_cast<long long>(row), static_cast<long long>(n), gl, rl);
        return fail(buf);
      }
      r->worst_lse_abs = std::max(r->worst_lse_abs, std::fabs(gl - rl));
      num += en;
      den += rn;
      const double row_rel = rn > 0 ? std::sqrt(en / rn) : std::sqrt(en);
      r->worst_row_rel = std::max(r->worst_row_rel, row_rel);
      if (row_rel > 5 * tol) {
        std::snprintf(buf, sizeof(buf), "row %lld head %lld: relative error %.3g > 5 x %.3g",
                      static_cast<long long>(row), static_cast<long long>(n), row_rel, tol);
        return fail(buf);
      }
    }
  }
  r->rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (r->rel_l2 > tol) {
    std::snprintf(buf, sizeof(buf), "relative L2 error %.3g > %.3g (worst row %.3g)", r->rel_l2,
                  tol, r->worst_row_rel);
    return fail(buf);
  }
}

/// Runs one case end to end. Returns Ok (result in *r, possibly failed) or a setup/launch error.
Status RunCase(const Case& c, parity::CaseResult* r) {
  r->name = Describe(c);
  const int64_t B = static_cast<int64_t>(c.q_lens.size());
  const int64_t N = c.N, K = c.K, H = c.H, PT = c.page_tokens;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.f, 1.f);

  std::vector<int64_t> q_off(B + 1, 0), kv_off(B + 1, 0);
  int64_t max_q = 0, max_kv = 0, max_blocks = 0;
  for (int64_t b = 0; b < B; ++b) {
    q_off[b + 1] = q_off[b] + c.q_lens[b];
    kv_off[b + 1] = kv_off[b] + c.kv_lens[b];
    max_q = std::max<int64_t>(max_q, c.q_lens[b]);
    max_kv = std::max<int64_t>(max_kv, c.kv_lens[b]);
    max_blocks = std::max<int64_t>(max_blocks, (c.kv_lens[b] + PT - 1) / PT);
  }
  const int64_t total_q = q_off[B], total_kv = kv_off[B];
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

  // Pool: the sequences' pages + 5 never used, in shuffled order; all NaN, then the history.
  int64_t used_pages = 0;
  for (int64_t b = 0; b < B; ++b) used_pages += (c.kv_lens[b] + PT - 1) / PT;
  const int64_t num_pages = used_pages + 5;
  std::vector<int32_t> order(static_cast<size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const int32_t past = c.unused_bt_entry >= 0 ? c.unused_bt_entry : order.back();
  const int64_t bt_stride = max_blocks + 3;
  std::vector<int32_t> bt(static_cast<size_t>(std::max<int64_t>(1, B * bt_stride)), past);
  {
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < (c.kv_lens[b] + PT - 1) / PT; ++i) {
        bt[b * bt_stride + i] = order[next++];
      }
  }
  const int64_t page_elems = K * PT * H;
  std::vector<uint16_t> kp(static_cast<size_t>(num_pages * page_elems), kNaN16), vp(kp.size(),
                                                                                  kNaN16);
  PagedKvPool hpool;
  hpool.k_pages = kp.data();
  hpool.v_pages = vp.data();
  hpool.num_pages = num_pages;
  hpool.page_tokens = static_cast<int32_t>(PT);
  hpool.num_kv_heads = static_cast<int32_t>(K);
  hpool.head_dim = static_cast<int32_t>(H);
  hpool.kv_dtype = c.dtype;
  for (int64_t b = 0; b < B; ++b) {
    ATTN_RETURN_IF_ERROR(PagedAppendCpu(hpool, bt.data() + b * bt_stride,
                                        (c.kv_lens[b] + PT - 1) / PT, 0, c.kv_lens[b],
                                        hk.data() + kv_off[b] * K * H,
                                        hv.data() + kv_off[b] * K * H, c.dtype, nullptr, nullptr,
                                        nullptr));
  }

  DeviceBuffer d_kp, d_vp, d_bt, d_len, d_q, d_qoff, d_o, d_lse;
  ATTN_RETURN_IF_ERROR(d_kp.FromVec(kp));
  ATTN_RETURN_IF_ERROR(d_vp.FromVec(vp));
  ATTN_RETURN_IF_ERROR(d_bt.FromVec(bt));
  ATTN_RETURN_IF_ERROR(d_len.FromVec(c.kv_lens));
  ATTN_RETURN_IF_ERROR(d_q.FromVec(hq));
  ATTN_RETURN_IF_ERROR(d_qoff.FromVec(q_off));
  const std::vector<uint16_t> o_poison(static_cast<size_t>(total_q * N * H), kNaN16);
  const std::vector<float> lse_poison(static_cast<size_t>(total_q * N), std::nanf(""));
  ATTN_RETURN_IF_ERROR(d_o.FromVec(o_poison));
  ATTN_RETURN_IF_ERROR(d_lse.FromVec(lse_poison));

  FusedPagedShape shape;
  shape.dtype = c.dtype;
  shape.kv_dtype = c.dtype;
  shape.batch = B;
  shape.max_q_len = max_q;
  shape.max_kv_len = max_kv;
  shape.total_q = total_q;
  shape.num_heads = N;
  shape.num_kv_heads = K;
  shape.head_dim = H;
  shape.page_tokens = PT;
  shape.mask = c.mask;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
  shape.return_lse = true;
  StatusOr<FusedPagedPlan> plan = FusedPagedPlanFor(shape, 0);
  if (!plan.ok()) return plan.status();
  std::printf("  %s: %s\n", r->name.c_str(), plan->Describe().c_str());

  PagedKvPool pool = hpool;
  pool.k_pages = d_kp.get();
  pool.v_pages = d_vp.get();
  PagedBatch batch;
  batch.batch = B;
  batch.block_tables = d_bt.as<int32_t>();
  batch.block_table_stride = bt_stride;
  batch.kv_lengths = d_len.as<int32_t>();
  FusedPagedQueries fq;
  fq.q = d_q.get();
  fq.q_offsets = d_qoff.as<int64_t>();
  fq.o = d_o.get();
  fq.lse = d_lse.as<float>();
  ATTN_RETURN_IF_ERROR(FusedPagedRun(*plan, pool, batch, fq, Stream()));
  CUDA_OK(cudaStreamSynchronize(Stream()));
  CUDA_OK(cudaGetLastError());
  std::vector<uint16_t> o(o_poison.size());
  std::vector<float> lse(lse_poison.size());
  ATTN_RETURN_IF_ERROR(d_o.To(&o));
  ATTN_RETURN_IF_ERROR(d_lse.To(&lse));

  // The float64 reference on the contiguous history (varlen).
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
  ref_shape.mask = c.mask;
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
  Compare(c, o, lse, ref_o, ref_lse, total_q, r);
  if (!r->passed) {
    r->failure = "paged vs float64 reference: " + r->failure;
    return Status::Ok();
  }

  // The contiguous kernel with the same tile on the same data: bit-identical.
  if (c.check_contiguous) {
    FusedPlanOptions opt;
    opt.variant = plan->variant;
    StatusOr<FusedPlan> cplan = FusedPlanFor(ref_shape, 0, opt);
    if (!cplan.ok()) return cplan.status();
    if (cplan->block_m != plan->block_m || cplan->block_n != plan->block_n ||
        cplan->warps != plan->warps) {
      return Internal("contiguous plan " + cplan->Describe() + " has another tile than " +
                      plan->Describe());
    }
    DeviceBuffer d_k, d_v, d_kvoff, d_o2, d_lse2;
    ATTN_RETURN_IF_ERROR(d_k.FromVec(hk));
    ATTN_RETURN_IF_ERROR(d_v.FromVec(hv));
    ATTN_RETURN_IF_ERROR(d_kvoff.FromVec(kv_off));
    ATTN_RETURN_IF_ERROR(d_o2.FromVec(o_poison));
    ATTN_RETURN_IF_ERROR(d_lse2.FromVec(lse_poison));
    AttentionTensors t;
    t.q = d_q.get();
    t.k = d_k.get();
    t.v = d_v.get();
    t.o = d_o2.get();
    t.lse = d_lse2.as<float>();
    t.q_offsets = d_qoff.as<int64_t>();
    t.kv_offsets = d_kvoff.as<int64_t>();
    ATTN_RETURN_IF_ERROR(FusedRun(*cplan, t, Stream()));
    CUDA_OK(cudaStreamSynchronize(Stream()));
    std::vector<uint16_t> o2(o.size());
    std::vector<float> lse2(lse.size());
    ATTN_RETURN_IF_ERROR(d_o2.To(&o2));
    ATTN_RETURN_IF_ERROR(d_lse2.To(&lse2));
    int64_t o_diff = 0, lse_diff = 0;
    double max_abs = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      if (o[i] == o2[i]) continue;
      ++o_diff;
      const double a = LoadAsFloat(o.data(), c.dtype, static_cast<int64_t>(i));
      const double b = LoadAsFloat(o2.data(), c.dtype, static_cast<int64_t>(i));
      max_abs = std::max(max_abs, std::fabs(a - b));
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      lse_diff += std::memcmp(&lse[i], &lse2[i], 4) != 0;
    }
    if (o_diff != 0 || lse_diff != 0) {
      char buf[200];
      std::snprintf(buf, sizeof(buf),
                    "paged and contiguous (%s) differ: %lld o elements (max |diff| %g), %lld lse",
                    cplan->Describe().c_str(), static_cast<long long>(o_diff), max_abs,
                    static_cast<long long>(lse_diff));
      r->passed = false;
      r->failure = buf;
    }
  }
  return Status::Ok();
}

class FusedPagedGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
  }
};

void RunAll(const std::string& label, const std::vector<Case>& cases) {
  std::vector<parity::CaseResult> results;
  int failed = 0;
  double worst = 0;
  for (const Case& c : cases) {
    parity::CaseResult r;
    const Status s = RunCase(c, &r);
    if (!s.ok()) {
      r.passed = false;
      r.failure = s.ToString();
    }
    if (!r.passed) {
      ++failed;
      ADD_FAILURE() << r.name << ": " << r.failure;
    } else {
      worst = std::max(worst, r.rel_l2);
      std::printf("    rel_l2 %.3g worst row %.3g worst lse %.3g\n", r.rel_l2, r.worst_row_rel,
                  r.worst_lse_abs);
    }
    results.push_back(r);
  }
  if (const char* path = std::getenv("ATTN_PARITY_OUT")) {
    std::ofstream(path, std::ios::app) << parity::ResultsToJson("fused_paged/" + label, results);
  }
  std::printf("[fused_paged/%s] %zu cases, %d failed; worst rel_l2 %.3g\n", label.c_str(),
              cases.size(), failed, worst);
}

const DType kF16 = DType::kFloat16;
const DType kBF16 = DType::kBFloat16;

/// Every dtype × head dim × page size (1 and 8 to 128: smaller than, equal to and larger than
/// the key tile) on one batch mixing prefill lengths (T = 1, 37, 64, 100, 130), fresh prompts
/// (S = T) and cached prefixes (S > T), lengths that are not multiples of the page or the tile.
TEST_F(FusedPagedGpu, DtypesHeadDimsPageSizes) {
  std::vector<Case> cases;
  uint64_t seed = 100;
  for (DType dt : {kF16, kBF16})
    for (int64_t H : {64, 128})
      for (int64_t pt : {1, 8, 16, 64, 128}) {
        if (pt == 1 && H == 64) continue;  // one pt=1 case per dtype is enough
        Case c;
        c.dtype = dt;
        c.H = H;
        c.page_tokens = pt;
        c.seed = seed++;
        c.name = "mixed batch";
        c.q_lens = {1, 37, 64, 100, 130, 100};
        c.kv_lens = {1, 37 + 211, 64, 100, 130 + 999, 517};
        cases.push_back(c);
      }
  RunAll("page_sizes", cases);
}

/// Grouped heads (N=8: groups 1, 2, 8) at both head dims, prefill over a cached prefix and
/// fresh, sequences in one launch with very different lengths.
TEST_F(FusedPagedGpu, GroupedHeads) {
  std::vector<Case> cases;
  uint64_t seed = 200;
  for (DType dt : {kF16, kBF16})
    for (int64_t H : {64, 128})
      for (int64_t K : {8, 4, 1}) {
        Case c;
        c.dtype = dt;
        c.N = 8;
        c.K = K;
        c.H = H;
        c.page_tokens = 16;
        c.seed = seed++;
        c.name = "gqa";
        c.q_lens = {100, 37, 300};
        c.kv_lens = {300, 37, 301};
        cases.push_back(c);
      }
  RunAll("gqa", cases);
}

/// Long prompts: T = S = 4096 (fresh), and T = 4000 over 4500 keys (a 500-token prefix), at
/// both head dims and two page sizes.
TEST_F(FusedPagedGpu, LongPrefill) {
  std::vector<Case> cases;
  uint64_t seed = 300;
  for (auto [dt, H, K, pt] : {std::tuple{kBF16, int64_t{128}, int64_t{1}, int64_t{16}},
                              std::tuple{kF16, int64_t{64}, int64_t{2}, int64_t{128}}}) {
    Case c;
    c.dtype = dt;
    c.N = 4;
    c.K = K;
    c.H = H;
    c.page_tokens = pt;
    c.seed = seed++;
    c.name = "long fresh";
    c.q_lens = {4096};
    c.kv_lens = {4096};
    cases.push_back(c);
    c.seed = seed++;
    c.name = "long over prefix";
    c.q_lens = {4000, 64};
    c.kv_lens = {4500, 1000};
    cases.push_back(c);
  }
  RunAll("long", cases);
}

/// Edge cases: rows that see no key (T > S: the first T - S rows; S = 0: every row), a single
/// key, sharp softmax (q × 8), and the other masks the API accepts (none, top-left, windows).
TEST_F(FusedPagedGpu, EdgesAndMasks) {
  std::vector<Case> cases;
  uint64_t seed = 400;
  for (DType dt : {kF16, kBF16})
    for (int64_t H : {64, 128}) {
      Case c;
      c.dtype = dt;
      c.H = H;
      c.N = 4;
      c.K = 2;
      c.page_tokens = 8;
      c.seed = seed++;
      c.name = "T > S and S = 0";
      c.q_lens = {10, 5, 70, 1};
      c.kv_lens = {3, 0, 65, 1};
      cases.push_back(c);
      c.seed = seed++;
      c.name = "logits x8";
      c.q_gain = 8.f;
      c.q_lens = {200, 129};
      c.kv_lens = {700, 129};
      cases.push_back(c);
      c.q_gain = 1.f;
      c.seed = seed++;
      c.name = "no mask";
      c.mask = MaskSpec{CausalAlignment::kNone, -1, -1};
      c.q_lens = {77, 300};
      c.kv_lens = {500, 300};
      cases.push_back(c);
      c.seed = seed++;
      c.name = "top-left";
      c.mask = MaskSpec{CausalAlignment::kTopLeft, -1, -1};
      cases.push_back(c);
      c.seed = seed++;
      c.name = "bottom-right window";
      c.mask = MaskSpec{CausalAlignment::kBottomRight, 100, -1};
      cases.push_back(c);
      c.seed = seed++;
      c.name = "window both sides";
      c.mask = MaskSpec{CausalAlignment::kNone, 37, 5};
      cases.push_back(c);
    }
  RunAll("edges", cases);
}

/// The benchmark's head configuration, smaller: N=32, K=8, H=128, bf16 and fp16, 16-token
/// pages, eight sequences of random prefill lengths over random cached prefixes.
TEST_F(FusedPagedGpu, ServingBatch) {
  std::vector<Case> cases;
  uint64_t seed = 500;
  for (DType dt : {kBF16, kF16}) {
    Case c;
    c.dtype = dt;
    c.N = 32;
    c.K = 8;
    c.H = 128;
    c.page_tokens = 16;
    c.seed = seed++;
    c.name = "B=8 random";
    std::mt19937 r(static_cast<uint32_t>(c.seed));
    for (int b = 0; b < 8; ++b) {
      const int32_t t = static_cast<int32_t>(65 + r() % 400);
      c.q_lens.push_back(t);
      c.kv_lens.push_back(t + static_cast<int32_t>(r() % 700));
    }
    cases.push_back(c);
  }
  RunAll("serving", cases);
}

/// Run-time errors: mismatched pool or batch, missing pointers.
TEST_F(FusedPagedGpu, RunErrors) {
  FusedPagedShape s;
  s.dtype = kBF16;
  s.kv_dtype = kBF16;
  s.batch = 2;
  s.max_q_len = 100;
  s.max_kv_len = 300;
  s.total_q = 150;
  s.num_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.page_tokens = 16;
  s.scale = 0.1f;
  StatusOr<FusedPagedPlan> plan = FusedPagedPlanFor(s, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->block_n % 16, 0);
  EXPECT_LE(plan->smem_bytes, 101376) << plan->Describe();
  PagedKvPool pool;
  pool.num_kv_heads = 2;
  pool.head_dim = 128;
  pool.page_tokens = 16;
  pool.kv_dtype = kBF16;
  PagedBatch batch;
  batch.batch = 2;
  FusedPagedQueries q;  // all null
  EXPECT_EQ(FusedPagedRun(*plan, pool, batch, q, Stream()).code(), StatusCode::kInvalidArgument);
  PagedKvPool other = pool;
  other.page_tokens = 32;
  EXPECT_EQ(FusedPagedRun(*plan, other, batch, q, Stream()).code(),
            StatusCode::kInvalidArgument);
  PagedBatch wrong = batch;
  wrong.batch = 3;
  EXPECT_EQ(FusedPagedRun(*plan, pool, wrong, q, Stream()).code(), StatusCode::kInvalidArgument);
  FusedPagedPlan empty;
  EXPECT_EQ(FusedPagedRun(empty, pool, batch, q, Stream()).code(), StatusCode::kInvalidArgument);
  // Every dtype and head dim plans, within the L4's shared memory.
  for (DType dt : {kF16, kBF16})
    for (int64_t H : {64, 128}) {
      FusedPagedShape t = s;
      t.dtype = t.kv_dtype = dt;
      t.head_dim = H;
      StatusOr<FusedPagedPlan> p = FusedPagedPlanFor(t, 0);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      EXPECT_LE(p->smem_bytes, 101376) << p->Describe();
      std::printf("%s (contiguous variant %d)\n", p->Describe().c_str(), p->variant);
    }
}

/// Block-table entries past a sequence's blocks hold an index far outside the pool: reading
/// one (let alone its page) would fault. Last in this file: a fault would poison the context.
TEST_F(FusedPagedGpu, UnusedBlockTableEntriesAreNeverRead) {
  std::vector<Case> cases;
  uint64_t seed = 600;
  for (int64_t H : {64, 128})
    for (int64_t pt : {8, 16, 128}) {
      Case c;
      c.dtype = kBF16;
      c.H = H;
      c.N = 4;
      c.K = 2;
      c.page_tokens = pt;
      c.unused_bt_entry = 0x7fffffff;
      c.seed = seed++;
      c.name = "unused entries poisoned";
      c.q_lens = {100, 1, 33, 64};
      c.kv_lens = {100, 129, 65, 64};
      cases.push_back(c);
    }
  RunAll("bt_poison", cases);
}

}  // namespace
}  // namespace attn::kernels
