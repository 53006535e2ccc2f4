// attn_kernel_bench: correctness first, then time, our attention kernels on this GPU.
//
// For each shape: random normal inputs (generated on the device, fp16/bf16), then
//   1. correctness: the fused family (every tile variant) and, when built, the naive family are
//      checked against a float64 reference computed here on a sample of query rows (plus a NaN
//      scan of the whole output): ‖out − ref‖₂/‖ref‖₂ ≤ tol(dtype), no row worse than 5× tol,
//      lse within 1e-3;
//   2. timing with CUDA events: warm-up, then `reps` interleaved repeats (each implementation
//      in turn), each repeat = `iters` back-to-back launches rotating over enough input/output
//      buffer sets (>= 3, and >= 2× the L2 size in total) that L2 does not flatter; the
//      reported time is the median repeat divided by iters.
// FLOPs = 4·B·N·T·S·H, halved for causal (DESIGN.md §10). Output: JSON lines on stdout (and
// --out=FILE): one "device" record, then one "result" record per (shape, implementation).
//
// Usage: attn_kernel_bench [--suites=a,b,c] [--dtype=bf16|fp16] [--reps=5] [--target-ms=20]
//          [--no-naive] [--default-variant-only] [--naive-ws-gb=8] [--out=FILE] [--quick]
//          [--shape=B,N,K,H,T,S,causal]...
//   suites: a  B=4 N=8 H=64 T=S in {128..8192}, causal and not;
//           b  FlashAttention's: 16k tokens per batch (B=16384/T), hidden 2048 (N=2048/H),
//              H in {64,128}, T=S in {1024,4096,16384}, causal and not;
//           c  GQA: B=4 N=8 K in {8,2,1} H=128 T=S=4096, causal and not.
// Exit status: 0 when every correctness check passed, 1 otherwise (timings are still printed).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <memory>
#include <string>
#include <vector>

#include "attn/kernels/arch_probe.h"
#include "attn/kernels/attention_problem.h"
#include "attn/kernels/fused_attention.h"
#include "attn/kernels/host_dtype.h"
#if __has_include("attn/kernels/naive_attention.h")
#include <cublas_v2.h>

#include "attn/kernels/naive_attention.h"
#define ATTN_BENCH_HAVE_NAIVE 1
#else
#define ATTN_BENCH_HAVE_NAIVE 0
#endif
#if defined(ATTN_HAVE_CUDNN)
#include <chrono>

#include "attn/kernels/cudnn_attention.h"
#define ATTN_BENCH_HAVE_CUDNN 1
#else
#define ATTN_BENCH_HAVE_CUDNN 0
#endif

namespace {

using attn::Status;
using attn::StatusOr;
using attn::kernels::AttentionShape;
using attn::kernels::AttentionTensors;
using attn::kernels::CausalAlignment;
using attn::kernels::DType;

#define CHECK_CUDA(expr)                                                                  \
  do {                                                                                    \
    const cudaError_t _e = (expr);                                                        \
    if (_e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                  \
                   cudaGetErrorString(_e));                                               \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

// ---- device RNG ------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// out[i] = N(0,1) (Box-Muller on a counter hash), rounded to fp16/bf16.
__global__ void FillNormal(uint16_t* out, int64_t n, uint64_t seed, int bf16) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = SplitMix(seed ^ SplitMix(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(h >> 40) + 1.f) * (1.f / 16777217.f);  // (0, 1]
    const float u2 = static_cast<float>((h >> 16) & 0xffffff) * (1.f / 16777216.f);
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if (bf16) {
      __nv_bfloat16 b = __float2bfloat16_rn(z);
      out[i] = *reinterpret_cast<uint16_t*>(&b);
    } else {
      __half hh = __float2half_rn(z);
      out[i] = *reinterpret_cast<uint16_t*>(&hh);
    }
  }
}

// ---- shapes -----------------------------------------------------------------------------------

struct BenchShape {
  std::string suite;
  int64_t B, N, K, H, T, S;
  bool causal;
  std::string Name() const {
    std::ostringstream os;
    os << suite << "/B" << B << "_N" << N << "_K" << K << "_H" << H << "_T" << T << "_S" << S
       << (causal ? "_causal" : "");
    return os.str();
  }
  double Flops() const {
    const double f = 4.0 * B * N * static_cast<double>(T) * S * H;
    return causal ? f / 2 : f;
  }
};

std::vector<BenchShape> Suites(const std::string& suites, bool quick) {
  std::vector<BenchShape> out;
  auto has = [&](char c) { return suites.find(c) != std::string::npos; };
  if (has('a')) {
    const std::vector<int64_t> ts = quick ? std::vector<int64_t>{512, 2048}
                                          : std::vector<int64_t>{128, 512, 1024, 2048, 4096, 8192};
    for (int64_t t : ts)
      for (bool c : {false, true}) out.push_back({"a", 4, 8, 8, 64, t, t, c});
  }
  if (has('b')) {
    const std::vector<int64_t> ts =
        quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 4096, 16384};
    for (int64_t h : {64, 128})
      for (int64_t t : ts)
        for (bool c : {false, true})
          out.push_back({"b", 16384 / t, 2048 / h, 2048 / h, h, t, t, c});
  }
  if (has('c')) {
    for (int64_t k : {8, 2, 1})
      for (bool c : {false, true}) out.push_back({"c", 4, 8, k, 128, 4096, 4096, c});
  }
  return out;
}

// ---- options ----------------------------------------------------------------------------------

struct Options {
  std::string suites = "abc";
  DType dtype = DType::kBFloat16;
  int reps = 5;
  double target_ms = 20;
  bool naive = true;
  bool cudnn = true;  ///< also time the cudnn family: "cudnn" (bf16/fp16) and "fp8" (sm_90+)
  bool all_variants = true;
  double naive_ws_gb = 8;
  std::string out;
  bool quick = false;
  std::vector<BenchShape> custom;
};

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() { return a.substr(a.find('=') + 1); };
    if (StartsWith(a, "--suites=")) o.suites = val();
    else if (a == "--dtype=bf16") o.dtype = DType::kBFloat16;
    else if (a == "--dtype=fp16") o.dtype = DType::kFloat16;
    else if (StartsWith(a, "--reps=")) o.reps = std::max(3, std::atoi(val().c_str()));
    else if (StartsWith(a, "--target-ms=")) o.target_ms = std::atof(val().c_str());
    else if (a == "--no-naive") o.naive = false;
    else if (a == "--no-cudnn") o.cudnn = false;
    else if (a == "--default-variant-only") o.all_variants = false;
    else if (StartsWith(a, "--naive-ws-gb=")) o.naive_ws_gb = std::atof(val().c_str());
    else if (StartsWith(a, "--out=")) o.out = val();
    else if (a == "--quick") o.quick = true;
    else if (StartsWith(a, "--shape=")) {
      BenchShape s{"custom", 0, 0, 0, 0, 0, 0, false};
      int c = 0;
      if (std::sscanf(val().c_str(), "%ld,%ld,%ld,%ld,%ld,%ld,%d", &s.B, &s.N, &s.K, &s.H, &s.T,
                      &s.S, &c) != 7) {
        std::fprintf(stderr, "bad --shape (B,N,K,H,T,S,causal): %s\n", a.c_str());
        std::exit(2);
      }
      s.causal = c != 0;
      o.custom.push_back(s);
    } else {
      std::fprintf(stderr, "unknown argument %s (see the header of attn_kernel_bench.cu)\n",
                   a.c_str());
      std::exit(2);
    }
  }
  return o;
}

// ---- reference on sampled rows -----------------------------------------------------------------

struct Check {
  double rel_l2 = 0, worst_row = 0, lse_abs = 0;
  bool nan = false;
  bool passed = false;
};

float ToFloat(uint16_t x, DType d) {
  return d == DType::kBFloat16 ? attn::kernels::Bf16ToFloat(x) : attn::kernels::Fp16ToFloat(x);
}

struct Sample {
  int64_t b, h, i;
};

/// Float64 reference of the sampled rows (o: rows x H; lse per row).
void Reference(const AttentionShape& s, const std::vector<uint16_t>& q,
               const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
               const std::vector<Sample>& samples, std::vector<double>* o,
               std::vector<double>* lse) {
  const int64_t H = s.head_dim, N = s.num_heads, K = s.num_kv_heads, T = s.max_q_len,
                S = s.max_kv_len;
  o->assign(samples.size() * H, 0.0);
  lse->assign(samples.size(), -INFINITY);
  std::vector<double> qr(H), logits(S);
  for (size_t r = 0; r < samples.size(); ++r) {
    const Sample& sm = samples[r];
    const int64_t kvh = sm.h / (N / K);
    for (int64_t d = 0; d < H; ++d) qr[d] = ToFloat(q[((sm.b * T + sm.i) * N + sm.h) * H + d], s.dtype);
    const attn::kernels::KeyRange kr = attn::kernels::BandKeyRange(s.mask, sm.i, T, S);
    if (kr.empty()) continue;
    double mx = -INFINITY;
    for (int64_t j = kr.lo; j <= kr.hi; ++j) {
      const uint16_t* kp = &k[((sm.b * S + j) * K + kvh) * H];
      double acc = 0;
      for (int64_t d = 0; d < H; ++d) acc += qr[d] * ToFloat(kp[d], s.dtype);
      logits[j] = acc * s.scale;
      mx = std::max(mx, logits[j]);
    }
    double sum = 0;
    for (int64_t j = kr.lo; j <= kr.hi; ++j) {
      const double p = std::exp(logits[j] - mx);
      sum += p;
      const uint16_t* vp = &v[((sm.b * S + j) * K + kvh) * H];
      for (int64_t d = 0; d < H; ++d) (*o)[r * H + d] += p * ToFloat(vp[d], s.dtype);
    }
    for (int64_t d = 0; d < H; ++d) (*o)[r * H + d] /= sum;
    (*lse)[r] = mx + std::log(sum);
  }
}

Check Compare(const AttentionShape& s, const std::vector<uint16_t>& out,
              const std::vector<float>& lse, const std::vector<Sample>& samples,
              const std::vector<double>& ref_o, const std::vector<double>& ref_lse,
              double tol_override = 0, double lse_tol = 1e-3) {
  Check c;
  const int64_t H = s.head_dim, N = s.num_heads, T = s.max_q_len;
  for (uint16_t x : out) {
    if (std::isnan(ToFloat(x, s.dtype))) {
      c.nan = true;
      break;
    }
  }
  double num = 0, den = 0;
  for (size_t r = 0; r < samples.size(); ++r) {
    const Sample& sm = samples[r];
    double rn = 0, rd = 0;
    for (int64_t d = 0; d < H; ++d) {
      const double got = ToFloat(out[((sm.b * T + sm.i) * N + sm.h) * H + d], s.dtype);
      const double want = ref_o[r * H + d];
      rn += (got - want) * (got - want);
      rd += want * want;
    }
    num += rn;
    den += rd;
    c.worst_row = std::max(c.worst_row, std::sqrt(rn / std::max(rd, 1e-300)));
    if (!lse.empty()) {
      const double got = lse[(sm.b * N + sm.h) * T + sm.i];
      const double diff = std::isinf(ref_lse[r]) ? (got == ref_lse[r] ? 0 : INFINITY)
                                                 : std::fabs(got - ref_lse[r]);
      c.lse_abs = std::max(c.lse_abs, std::isnan(got) ? INFINITY : diff);
    }
  }
  c.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  const double tol =
      tol_override > 0 ? tol_override : (s.dtype == DType::kBFloat16 ? 1e-2 : 2e-3);
  c.passed = !c.nan && c.rel_l2 <= tol && c.worst_row <= 5 * tol && c.lse_abs <= lse_tol &&
             !std::isnan(c.rel_l2);
  return c;
}

// ---- timing -----------------------------------------------------------------------------------

struct Impl {
  std::string name;     ///< "fused", "fused/v1", "naive"
  std::string detail;   ///< plan description
  std::function<void(int set)> run;  ///< enqueue one launch on buffer set `set`
  double tol = 0;        ///< relative L2 tolerance; 0: the dtype's (bf16 1e-2, fp16 2e-3)
  double lse_tol = 1e-3; ///< absolute lse tolerance
  Check check;
  std::vector<double> rep_ms;
  int iters = 1;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

std::string Num(double x) {
  if (std::isnan(x)) return "null";
  if (std::isinf(x)) return x > 0 ? "1e308" : "-1e308";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = Parse(argc, argv);
  std::ofstream out_file;
  if (!opt.out.empty()) out_file.open(opt.out, std::ios::app);
  auto emit = [&](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (out_file) out_file << line << "\n" << std::flush;
  };

  int device = 0;
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  int arch_ran = 0;
  if (StatusOr<attn::kernels::ArchProbeResult> pr = attn::kernels::ProbeCudaArch(device); pr.ok())
    arch_ran = pr->cuda_arch;
  {
    std::ostringstream os;
    os << "{\"record\":\"device\",\"device\":\"" << JsonEscape(prop.name) << "\",\"cc\":"
       << prop.major * 10 + prop.minor << ",\"sm_count\":" << prop.multiProcessorCount
       << ",\"l2_bytes\":" << prop.l2CacheSize << ",\"smem_optin\":"
       << prop.sharedMemPerBlockOptin << ",\"cuda_runtime\":" << rt << ",\"cuda_driver\":" << drv
       << ",\"kernel_image_arch\":" << arch_ran << ",\"dtype\":\""
       << attn::kernels::DTypeName(opt.dtype) << "\",\"naive_built\":" << ATTN_BENCH_HAVE_NAIVE
       << "}";
    emit(os.str());
  }

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
#if ATTN_BENCH_HAVE_NAIVE
  cublasHandle_t cublas = nullptr;
  void* cublas_ws = nullptr;
  const size_t kCublasWs = size_t{64} << 20;
  if (opt.naive) {
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      return 2;
    }
    CHECK_CUDA(cudaMalloc(&cublas_ws, kCublasWs));
    cublasSetStream(cublas, stream);
    cublasSetWorkspace(cublas, cublas_ws, kCublasWs);
  }
#endif

  std::vector<BenchShape> shapes = opt.custom.empty() ? Suites(opt.suites, opt.quick) : opt.custom;
  bool all_passed = true;
  uint64_t seed = 12345;
  for (const BenchShape& bs : shapes) {
    AttentionShape s;
    s.layout = attn::kernels::Layout::kPadded;
    s.dtype = opt.dtype;
    s.batch = bs.B;
    s.max_q_len = bs.T;
    s.max_kv_len = bs.S;
    s.num_heads = bs.N;
    s.num_kv_heads = bs.K;
    s.head_dim = bs.H;
    s.mask.causal = bs.causal ? CausalAlignment::kBottomRight : CausalAlignment::kNone;
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(bs.H)));
    s.return_lse = true;

    const size_t q_bytes = s.q_elements() * 2, kv_bytes = s.kv_elements() * 2;
    const size_t lse_bytes = s.lse_elements() * sizeof(float);
    const size_t set_bytes = 2 * q_bytes + 2 * kv_bytes + lse_bytes;
    const int nsets = static_cast<int>(std::min<size_t>(
        64, std::max<size_t>(3, (2 * static_cast<size_t>(prop.l2CacheSize) + set_bytes - 1) /
                                    set_bytes)));
    std::vector<AttentionTensors> sets(nsets);
    for (int i = 0; i < nsets; ++i) {
      void *q, *k, *v, *o, *l;
      CHECK_CUDA(cudaMalloc(&q, q_bytes));
      CHECK_CUDA(cudaMalloc(&k, kv_bytes));
      CHECK_CUDA(cudaMalloc(&v, kv_bytes));
      CHECK_CUDA(cudaMalloc(&o, q_bytes));
      CHECK_CUDA(cudaMalloc(&l, lse_bytes));
      const int bf = opt.dtype == DType::kBFloat16;
      FillNormal<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(q), s.q_elements(), seed++, bf);
      FillNormal<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(k), s.kv_elements(), seed++, bf);
      FillNormal<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(v), s.kv_elements(), seed++, bf);
      sets[i].q = q;
      sets[i].k = k;
      sets[i].v = v;
      sets[i].o = o;
      sets[i].lse = static_cast<float*>(l);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));

    // Implementations: "fused" = the default plan (variant -1: what the backend runs, chosen
    // per shape by FusedDefaultVariant; its detail names the variant), then every variant as
    // "fused/v<i>" (with --default-variant-only: none), then naive.
    std::vector<Impl> impls;
    const int nvar = opt.all_variants ? attn::kernels::FusedVariantCount(bs.H) : 0;
    std::vector<attn::kernels::FusedPlan> fplans;
    fplans.reserve(nvar + 1);
    for (int vi = -1; vi < nvar; ++vi) {
      attn::kernels::FusedPlanOptions po;
      po.variant = vi;
      StatusOr<attn::kernels::FusedPlan> plan = attn::kernels::FusedPlanFor(s, device, po);
      if (!plan.ok()) {
        emit("{\"record\":\"skip\",\"shape\":\"" + bs.Name() + "\",\"impl\":\"" +
             (vi < 0 ? std::string("fused") : "fused/v" + std::to_string(vi)) +
             "\",\"reason\":\"" + JsonEscape(plan.status().ToString()) + "\"}");
        continue;
      }
      fplans.push_back(*plan);
      const attn::kernels::FusedPlan* p = &fplans.back();
      Impl im;
      im.name = vi < 0 ? "fused" : "fused/v" + std::to_string(vi);
      im.detail = p->Describe();
      im.run = [p, &sets, stream](int set) {
        const Status st = attn::kernels::FusedRun(*p, sets[set], stream);
        if (!st.ok()) {
          std::fprintf(stderr, "FusedRun: %s\n", st.ToString().c_str());
          std::exit(2);
        }
      };
      impls.push_back(std::move(im));
    }
#if ATTN_BENCH_HAVE_NAIVE
    void* naive_ws = nullptr;
    attn::kernels::NaivePlan nplan;
    if (opt.naive) {
      StatusOr<attn::kernels::NaivePlan> np = attn::kernels::NaivePlanFor(
          s, static_cast<size_t>(opt.naive_ws_gb * (1ull << 30)));
      if (np.ok() && cudaMalloc(&naive_ws, np->workspace_bytes) == cudaSuccess) {
        nplan = *np;
        Impl im;
        im.name = "naive";
        im.detail = "naive chunks " + std::to_string(nplan.num_chunks) + " ws " +
                    std::to_string(nplan.workspace_bytes);
        im.run = [&nplan, &sets, naive_ws, cublas, stream](int set) {
          const Status st = attn::kernels::NaiveRun(nplan, sets[set], naive_ws,
                                                    nplan.workspace_bytes, cublas, stream);
          if (!st.ok()) {
            std::fprintf(stderr, "NaiveRun: %s\n", st.ToString().c_str());
            std::exit(2);
          }
        };
        impls.push_back(std::move(im));
      } else {
        (void)cudaGetLastError();
        emit("{\"record\":\"skip\",\"shape\":\"" + bs.Name() +
             "\",\"impl\":\"naive\",\"reason\":\"" +
             JsonEscape(np.ok() ? "workspace allocation failed" : np.status().ToString()) +
             "\"}");
      }
    }
#endif
#if ATTN_BENCH_HAVE_CUDNN
    // cudnn family: "cudnn" (cuDNN fused SDPA, bf16/fp16) and "fp8" (cuDNN FP8 SDPA on sm_90+,
    // counting per-tensor amax + quantisation of q/k/v and the output conversion). The graph
    // build (cold start) is timed separately and emitted as a "graph_build" record.
    static std::unique_ptr<attn::kernels::CudnnAttention> cudnn;
    static std::string cudnn_why;
    if (opt.cudnn && !cudnn && cudnn_why.empty()) {
      auto c = attn::kernels::CudnnAttention::Create(device, {});
      if (c.ok()) cudnn = std::move(*c); else cudnn_why = c.status().ToString();
    }
    std::vector<attn::kernels::CudnnPlan> cplans;
    std::vector<void*> cws;
    cplans.reserve(2);
    for (int fp8 = 0; fp8 < 2 && opt.cudnn; ++fp8) {
      const char* name = fp8 ? "fp8" : "cudnn";
      if (!cudnn) {
        emit("{\"record\":\"skip\",\"shape\":\"" + bs.Name() + "\",\"impl\":\"" + name +
             "\",\"reason\":\"" + JsonEscape(cudnn_why) + "\"}");
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<attn::kernels::CudnnPlan> cp = cudnn->Plan(s, fp8 != 0);
      const double build_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      void* ws = nullptr;
      if (!cp.ok() || cudaMalloc(&ws, std::max<uint64_t>(cp->workspace_bytes, 256)) != cudaSuccess) {
        (void)cudaGetLastError();
        emit("{\"record\":\"skip\",\"shape\":\"" + bs.Name() + "\",\"impl\":\"" + name +
             "\",\"reason\":\"" +
             JsonEscape(cp.ok() ? "workspace allocation failed" : cp.status().ToString()) + "\"}");
        continue;
      }
      emit("{\"record\":\"graph_build\",\"shape\":\"" + bs.Name() + "\",\"impl\":\"" + name +
           "\",\"seconds\":" + Num(build_s) + ",\"detail\":\"" + JsonEscape(cp->Describe()) +
           "\"}");
      cplans.push_back(*cp);
      cws.push_back(ws);
      const attn::kernels::CudnnPlan* p = &cplans.back();
      attn::kernels::CudnnFp8Inputs in;
      in.out_dtype = s.dtype;
      Impl im;
      im.name = name;
      im.detail = p->Describe();
      if (fp8) {
        im.tol = 6e-2;     // DESIGN.md §4: FP8
        im.lse_tol = 0.25; // logits from E4M3 q/k: lse moves by ~0.02-0.1 (measured)
      }
      im.run = [p, &sets, ws, in, stream](int set) {
        const Status st = cudnn->Run(*p, sets[set], in, ws, p->workspace_bytes, stream);
        if (!st.ok()) {
          std::fprintf(stderr, "CudnnRun: %s\n", st.ToString().c_str());
          std::exit(2);
        }
      };
      impls.push_back(std::move(im));
    }
#endif

    // Correctness on buffer set 0: sampled rows against float64, full-output NaN scan.
    {
      std::vector<uint16_t> hq(s.q_elements()), hk(s.kv_elements()), hv(s.kv_elements());
      CHECK_CUDA(cudaMemcpy(hq.data(), sets[0].q, q_bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(hk.data(), sets[0].k, kv_bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(hv.data(), sets[0].v, kv_bytes, cudaMemcpyDeviceToHost));
      std::vector<Sample> samples;
      const int want = bs.S >= 8192 ? 24 : 48;
      uint64_t r = seed * 2654435761ull + 1;
      auto next = [&r]() {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        return r;
      };
      samples.push_back({0, 0, 0});
      samples.push_back({bs.B - 1, bs.N - 1, bs.T - 1});
      while (static_cast<int>(samples.size()) < want) {
        samples.push_back({static_cast<int64_t>(next() % bs.B), static_cast<int64_t>(next() % bs.N),
                           static_cast<int64_t>(next() % bs.T)});
      }
      std::vector<double> ref_o, ref_lse;
      Reference(s, hq, hk, hv, samples, &ref_o, &ref_lse);
      std::vector<uint16_t> ho(s.q_elements());
      std::vector<float> hl(s.lse_elements());
      for (Impl& im : impls) {
        CHECK_CUDA(cudaMemsetAsync(sets[0].o, 0xFF, q_bytes, stream));  // NaN poison
        CHECK_CUDA(cudaMemsetAsync(sets[0].lse, 0xFF, lse_bytes, stream));
        im.run(0);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        CHECK_CUDA(cudaMemcpy(ho.data(), sets[0].o, q_bytes, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hl.data(), sets[0].lse, lse_bytes, cudaMemcpyDeviceToHost));
        im.check = Compare(s, ho, hl, samples, ref_o, ref_lse, im.tol, im.lse_tol);
        all_passed = all_passed && im.check.passed;
      }
    }

    // Timing: warm-up + calibration, then interleaved repeats.
    int set_counter = 0;
    for (Impl& im : impls) {
      for (int i = 0; i < 3; ++i) im.run(set_counter++ % nsets);
      CHECK_CUDA(cudaEventRecord(ev0, stream));
      for (int i = 0; i < 3; ++i) im.run(set_counter++ % nsets);
      CHECK_CUDA(cudaEventRecord(ev1, stream));
      CHECK_CUDA(cudaEventSynchronize(ev1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
      im.iters = std::clamp(static_cast<int>(opt.target_ms / std::max(ms / 3, 1e-4f)), 3, 2000);
    }
    for (int rep = 0; rep < opt.reps; ++rep) {
      for (Impl& im : impls) {
        CHECK_CUDA(cudaEventRecord(ev0, stream));
        for (int i = 0; i < im.iters; ++i) im.run(set_counter++ % nsets);
        CHECK_CUDA(cudaEventRecord(ev1, stream));
        CHECK_CUDA(cudaEventSynchronize(ev1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
        im.rep_ms.push_back(ms / im.iters);
      }
    }
    CHECK_CUDA(cudaGetLastError());

    for (const Impl& im : impls) {
      const double ms = Median(im.rep_ms);
      std::ostringstream os;
      os << "{\"record\":\"result\",\"shape\":\"" << bs.Name() << "\",\"suite\":\"" << bs.suite
         << "\",\"B\":" << bs.B << ",\"N\":" << bs.N << ",\"K\":" << bs.K << ",\"H\":" << bs.H
         << ",\"T\":" << bs.T << ",\"S\":" << bs.S << ",\"causal\":"
         << (bs.causal ? "true" : "false") << ",\"dtype\":\""
         << attn::kernels::DTypeName(opt.dtype) << "\",\"impl\":\"" << im.name
         << "\",\"detail\":\"" << JsonEscape(im.detail) << "\",\"ms\":" << Num(ms)
         << ",\"tflops\":" << Num(bs.Flops() / (ms * 1e-3) / 1e12)
         << ",\"flops\":" << Num(bs.Flops()) << ",\"iters\":" << im.iters
         << ",\"buffer_sets\":" << nsets << ",\"reps_ms\":[";
      for (size_t i = 0; i < im.rep_ms.size(); ++i) os << (i ? "," : "") << Num(im.rep_ms[i]);
      os << "],\"check\":{\"passed\":" << (im.check.passed ? "true" : "false")
         << ",\"rel_l2\":" << Num(im.check.rel_l2) << ",\"worst_row\":"
         << Num(im.check.worst_row) << ",\"lse_abs\":" << Num(im.check.lse_abs)
         << ",\"nan\":" << (im.check.nan ? "true" : "false") << "}}";
      emit(os.str());
    }

#if ATTN_BENCH_HAVE_NAIVE
    if (naive_ws != nullptr) CHECK_CUDA(cudaFree(naive_ws));
#endif
#if ATTN_BENCH_HAVE_CUDNN
    for (void* w : cws) CHECK_CUDA(cudaFree(w));
#endif
    for (AttentionTensors& t : sets) {
      CHECK_CUDA(cudaFree(const_cast<void*>(t.q)));
      CHECK_CUDA(cudaFree(const_cast<void*>(t.k)));
      CHECK_CUDA(cudaFree(const_cast<void*>(t.v)));
      CHECK_CUDA(cudaFree(t.o));
      CHECK_CUDA(cudaFree(t.lse));
    }
  }
  emit(std::string("{\"record\":\"done\",\"all_checks_passed\":") +
       (all_passed ? "true" : "false") + "}");
  return all_passed ? 0 : 1;
}
