// attn_fp8_bench: our FP8 (E4M3) attention kernel against our bf16 fused kernel, same shapes,
// same GPU, same build (issue 4: the sm_89 FP8 kernel ≥ 1.3× the sm_89 bf16 fused kernel in
// the L4 build, CMAKE_CUDA_ARCHITECTURES=89 + ATTN_EMULATE_L4, run on an H200 through PTX JIT).
//
// Per shape: random normal bf16 inputs (generated on the device), then
//   1. correctness: fused (bf16 tolerance 1e-2) and fp8 (6e-2; inputs quantised on the GPU
//      with Fp8QuantizePerTensor, every variant) against a float64 reference of sampled query
//      rows computed here from the bf16 inputs, plus a NaN scan of the whole output; lse within
//      1e-3 (fused) / 0.25 (fp8: e4m3 logits, see tests/gpu/fp8_parity_test.cc);
//   2. timing with CUDA events: 2 warm-up repeats, then `reps` interleaved repeats (each
//      implementation in turn), each repeat = `iters` back-to-back launches (iters sized so a
//      repeat takes >= target-ms) rotating over enough input/output sets (>= 3 and >= 2× L2)
//      that L2 does not flatter; the time reported is the median repeat / iters.
// Implementations:
//   fused         our bf16 fused kernel, default plan (what the `fused` backend runs)
//   fp8           Vᵀ pre-pass + FP8 kernel on inputs already in E4M3 (default variant)
//   fp8/v<i>      the same for every tile variant (unless --default-variant-only)
//   fp8_quant     the three per-tensor quantisations (amax + convert) of bf16 q, k, v alone
//   fp8+quant     fp8_quant then fp8: what a bf16 request costs end to end on the FP8 path
// FLOPs = 4·B·N·T·S·H, halved for causal (DESIGN.md §10); fp8_quant is reported in GB/s.
// Output: JSON lines on stdout (and --out=FILE): a "device" record, one "result" record per
// (shape, implementation) with ms / TFLOP/s / ratio to fused, then a table on stderr.
//
// Usage: attn_fp8_bench [--reps=5] [--target-ms=20] [--quick] [--default-variant-only]
//          [--out=FILE] [--shape=B,N,K,H,T,S,causal]...
//   default grid: hidden 2048 (N = 2048/H: N=32 at H=64, N=16 at H=128), 16k tokens per batch
//   (B = 16384/T), T = S in {1024, 2048, 4096, 8192, 16384}, causal and not.
//   --quick: T in {1024, 4096, 16384}.
// Exit status: 0 when every correctness check passed, 1 otherwise (timings still printed).
#include <cuda_bf16.h>
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
#include <string>
#include <vector>

#include "attn/kernels/arch_probe.h"
#include "attn/kernels/attention_problem.h"
#include "attn/kernels/device_limits.h"
#include "attn/kernels/fp8_attention.h"
#include "attn/kernels/fp8_quantize.h"
#include "attn/kernels/fused_attention.h"
#include "attn/kernels/host_dtype.h"

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
#define CHECK_OK(expr)                                                                    \
  do {                                                                                    \
    const Status _s = (expr);                                                             \
    if (!_s.ok()) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                  \
                   _s.ToString().c_str());                                                \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

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

struct BenchShape {
  int64_t B, N, K, H, T, S;
  bool causal;
  std::string Name() const {
    std::ostringstream os;
    os << "B" << B << "_N" << N << "_K" << K << "_H" << H << "_T" << T << "_S" << S
       << (causal ? "_causal" : "");
    return os.str();
  }
  double Flops() const {
    const double f = 4.0 * B * N * static_cast<double>(T) * S * H;
    return causal ? f / 2 : f;
  }
};

struct Options {
  int reps = 5;
  double target_ms = 20;
  bool quick = false;
  bool all_variants = true;
  std::string out;
  std::vector<BenchShape> shapes;
};

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() { return a.substr(a.find('=') + 1); };
    if (StartsWith(a, "--reps=")) o.reps = std::max(3, std::atoi(val().c_str()));
    else if (StartsWith(a, "--target-ms=")) o.target_ms = std::atof(val().c_str());
    else if (a == "--quick") o.quick = true;
    else if (a == "--default-variant-only") o.all_variants = false;
    else if (StartsWith(a, "--out=")) o.out = val();
    else if (StartsWith(a, "--shape=")) {
      BenchShape s{};
      int c = 0;
      long long v[6];
      if (std::sscanf(val().c_str(), "%lld,%lld,%lld,%lld,%lld,%lld,%d", &v[0], &v[1], &v[2],
                      &v[3], &v[4], &v[5], &c) != 7) {
        std::fprintf(stderr, "bad --shape (B,N,K,H,T,S,causal): %s\n", a.c_str());
        std::exit(2);
      }
      s = {v[0], v[1], v[2], v[3], v[4], v[5], c != 0};
      o.shapes.push_back(s);
    } else {
      std::fprintf(stderr, "unknown argument %s (see the header of fp8_bench.cu)\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.shapes.empty()) {
    const std::vector<int64_t> ts = o.quick ? std::vector<int64_t>{1024, 4096, 16384}
                                            : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
    for (int64_t h : {64, 128})
      for (int64_t t : ts)
        for (bool c : {false, true}) o.shapes.push_back({16384 / t, 2048 / h, 2048 / h, h, t, t, c});
  }
  return o;
}

// ---- reference on sampled rows ----------------------------------------------------------------

struct Sample {
  int64_t b, h, i;
};
struct Check {
  double rel_l2 = 0, worst_row = 0, lse_abs = 0;
  bool nan = false, passed = false;
};

void Reference(const AttentionShape& s, const std::vector<uint16_t>& q,
               const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
               const std::vector<Sample>& samples, std::vector<double>* o,
               std::vector<double>* lse) {
  using attn::kernels::Bf16ToFloat;
  const int64_t H = s.head_dim, N = s.num_heads, K = s.num_kv_heads, T = s.max_q_len,
                S = s.max_kv_len;
  o->assign(samples.size() * H, 0.0);
  lse->assign(samples.size(), -INFINITY);
  std::vector<double> qr(H), logits(S);
  for (size_t r = 0; r < samples.size(); ++r) {
    const Sample& sm = samples[r];
    const int64_t kvh = sm.h / (N / K);
    for (int64_t d = 0; d < H; ++d) qr[d] = Bf16ToFloat(q[((sm.b * T + sm.i) * N + sm.h) * H + d]);
    const attn::kernels::KeyRange kr = attn::kernels::BandKeyRange(s.mask, sm.i, T, S);
    if (kr.empty()) continue;
    double mx = -INFINITY;
    for (int64_t j = kr.lo; j <= kr.hi; ++j) {
      const uint16_t* kp = &k[((sm.b * S + j) * K + kvh) * H];
      double acc = 0;
      for (int64_t d = 0; d < H; ++d) acc += qr[d] * Bf16ToFloat(kp[d]);
      logits[j] = acc * s.scale;
      mx = std::max(mx, logits[j]);
    }
    double sum = 0;
    for (int64_t j = kr.lo; j <= kr.hi; ++j) {
      const double p = std::exp(logits[j] - mx);
      sum += p;
      const uint16_t* vp = &v[((sm.b * S + j) * K + kvh) * H];
      for (int64_t d = 0; d < H; ++d) (*o)[r * H + d] += p * Bf16ToFloat(vp[d]);
    }
    for (int64_t d = 0; d < H; ++d) (*o)[r * H + d] /= sum;
    (*lse)[r] = mx + std::log(sum);
  }
}

Check Compare(const AttentionShape& s, const std::vector<uint16_t>& out,
              const std::vector<float>& lse, const std::vector<Sample>& samples,
              const std::vector<double>& ref_o, const std::vector<double>& ref_lse, double tol,
              double lse_tol) {
  using attn::kernels::Bf16ToFloat;
  Check c;
  const int64_t H = s.head_dim, N = s.num_heads, T = s.max_q_len;
  for (uint16_t x : out) {
    if (std::isnan(Bf16ToFloat(x))) {
      c.nan = true;
      break;
    }
  }
  double num = 0, den = 0;
  for (size_t r = 0; r < samples.size(); ++r) {
    const Sample& sm = samples[r];
    double rn = 0, rd = 0;
    for (int64_t d = 0; d < H; ++d) {
      const double got = Bf16ToFloat(out[((sm.b * T + sm.i) * N + sm.h) * H + d]);
      const double want = ref_o[r * H + d];
      rn += (got - want) * (got - want);
      rd += want * want;
    }
    num += rn;
    den += rd;
    c.worst_row = std::max(c.worst_row, std::sqrt(rn / std::max(rd, 1e-300)));
    const double got = lse[(sm.b * N + sm.h) * T + sm.i];
    const double diff = std::isinf(ref_lse[r]) ? (got == ref_lse[r] ? 0 : INFINITY)
                                               : std::fabs(got - ref_lse[r]);
    c.lse_abs = std::max(c.lse_abs, std::isnan(got) ? INFINITY : diff);
  }
  c.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  c.passed = !c.nan && c.rel_l2 <= tol && c.worst_row <= 5 * tol && c.lse_abs <= lse_tol;
  return c;
}

struct Impl {
  std::string name, detail;
  std::function<void(int set)> run;
  bool check = true;      ///< has an output to check (fp8_quant alone has none)
  bool fp8 = false;
  double bytes = 0;       ///< fp8_quant: bytes moved (GB/s instead of TFLOP/s)
  Check result;
  std::vector<double> rep_ms;
  int iters = 1;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

struct Set {
  void *q, *k, *v, *q8, *k8, *v8, *o, *ws;
  float *lse, *sc;  // sc: (scale, descale, amax) x 3
};

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
  const int device = 0;
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  int arch_ran = 0;
  if (StatusOr<attn::kernels::ArchProbeResult> pr = attn::kernels::ProbeCudaArch(device); pr.ok())
    arch_ran = pr->cuda_arch;
  {
    std::ostringstream os;
    os << "{\"record\":\"device\",\"bench\":\"attn_fp8_bench\",\"device\":\"" << prop.name
       << "\",\"cc\":" << prop.major * 10 + prop.minor << ",\"sm_count\":"
       << prop.multiProcessorCount << ",\"kernel_image_arch\":" << arch_ran
       << ",\"emulate_l4\":" << (attn::kernels::kEmulateL4 ? "true" : "false") << "}";
    emit(os.str());
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));

  bool all_passed = true;
  uint64_t seed = 4242;
  std::vector<std::string> table;
  for (const BenchShape& bs : opt.shapes) {
    AttentionShape s;
    s.dtype = DType::kBFloat16;
    s.batch = bs.B;
    s.max_q_len = bs.T;
    s.max_kv_len = bs.S;
    s.num_heads = bs.N;
    s.num_kv_heads = bs.K;
    s.head_dim = bs.H;
    s.mask.causal = bs.causal ? CausalAlignment::kBottomRight : CausalAlignment::kNone;
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(bs.H)));
    s.return_lse = true;

    StatusOr<attn::kernels::FusedPlan> fplan = attn::kernels::FusedPlanFor(s, device);
    CHECK_OK(fplan.status());
    std::vector<attn::kernels::Fp8AttentionPlan> pplans;
    const int nvar = attn::kernels::Fp8AttentionVariantCount(bs.H);
    for (int vi = -1; vi < (opt.all_variants ? nvar : 0); ++vi) {
      attn::kernels::Fp8AttentionPlanOptions po;
      po.variant = vi;
      StatusOr<attn::kernels::Fp8AttentionPlan> p = attn::kernels::Fp8AttentionPlanFor(s, device, po);
      CHECK_OK(p.status());
      pplans.push_back(*p);
    }
    const int64_t ws_bytes = pplans[0].workspace_bytes;

    const size_t nq = s.q_elements(), nkv = s.kv_elements();
    const size_t set_bytes = 3 * nq + 3 * nkv + 2 * nkv + ws_bytes + s.lse_elements() * 4;
    const int nsets = static_cast<int>(std::min<size_t>(
        16, std::max<size_t>(3, (2 * static_cast<size_t>(prop.l2CacheSize) + set_bytes - 1) /
                                    set_bytes)));
    std::vector<Set> sets(nsets);
    for (Set& st : sets) {
      CHECK_CUDA(cudaMalloc(&st.q, nq * 2));
      CHECK_CUDA(cudaMalloc(&st.k, nkv * 2));
      CHECK_CUDA(cudaMalloc(&st.v, nkv * 2));
      CHECK_CUDA(cudaMalloc(&st.q8, nq));
      CHECK_CUDA(cudaMalloc(&st.k8, nkv));
      CHECK_CUDA(cudaMalloc(&st.v8, nkv));
      CHECK_CUDA(cudaMalloc(&st.o, nq * 2));
      CHECK_CUDA(cudaMalloc(&st.ws, std::max<int64_t>(ws_bytes, 256)));
      CHECK_CUDA(cudaMalloc(&st.lse, s.lse_elements() * 4));
      CHECK_CUDA(cudaMalloc(&st.sc, 9 * sizeof(float)));
      FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(st.q), nq, seed++);
      FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(st.k), nkv, seed++);
      FillNormalBf16<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(st.v), nkv, seed++);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));

    auto quant = [&, nq, nkv](const Set& st) {
      CHECK_OK(attn::kernels::Fp8QuantizePerTensor(st.q, DType::kBFloat16, nq, st.q8, st.sc,
                                                   st.sc + 1, st.sc + 2, stream));
      CHECK_OK(attn::kernels::Fp8QuantizePerTensor(st.k, DType::kBFloat16, nkv, st.k8, st.sc + 3,
                                                   st.sc + 4, st.sc + 5, stream));
      CHECK_OK(attn::kernels::Fp8QuantizePerTensor(st.v, DType::kBFloat16, nkv, st.v8, st.sc + 6,
                                                   st.sc + 7, st.sc + 8, stream));
    };
    auto fp8_run = [&, ws_bytes](const attn::kernels::Fp8AttentionPlan& pl, const Set& st) {
      AttentionTensors t;
      t.q = st.q8;
      t.k = st.k8;
      t.v = st.v8;
      t.o = st.o;
      t.lse = st.lse;
      CHECK_OK(attn::kernels::Fp8AttentionRun(pl, t, {st.sc + 1, st.sc + 4, st.sc + 7}, st.ws,
                                              ws_bytes, stream));
    };
    // Quantised inputs exist in every set before anything kernel-only is timed.
    for (const Set& st : sets) quant(st);

    std::vector<Impl> impls;
    impls.push_back({"fused", fplan->Describe(), [&](int i) {
                       AttentionTensors t;
                       t.q = sets[i].q;
                       t.k = sets[i].k;
                       t.v = sets[i].v;
                       t.o = sets[i].o;
                       t.lse = sets[i].lse;
                       CHECK_OK(attn::kernels::FusedRun(*fplan, t, stream));
                     }});
    for (size_t pi = 0; pi < pplans.size(); ++pi) {
      Impl im{pi == 0 ? "fp8" : "fp8/v" + std::to_string(pplans[pi].variant),
              pplans[pi].Describe(), [&, pi](int i) { fp8_run(pplans[pi], sets[i]); }};
      im.fp8 = true;
      impls.push_back(im);
    }
    {
      Impl im{"fp8_quant", "3x Fp8QuantizePerTensor (bf16 -> e4m3)",
              [&](int i) { quant(sets[i]); }};
      im.check = false;
      im.bytes = 2.0 * (2 * nq + 2 * nkv * 2) + nq + 2.0 * nkv;  // amax read + convert r/w
      impls.push_back(im);
    }
    {
      Impl im{"fp8+quant", pplans[0].Describe() + " + quantisation", [&](int i) {
                quant(sets[i]);
                fp8_run(pplans[0], sets[i]);
              }};
      im.fp8 = true;
      impls.push_back(im);
    }

    // 1. correctness on set 0.
    std::vector<uint16_t> hq(nq), hk(nkv), hv(nkv), ho(nq);
    std::vector<float> hl(s.lse_elements());
    CHECK_CUDA(cudaMemcpy(hq.data(), sets[0].q, nq * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hk.data(), sets[0].k, nkv * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hv.data(), sets[0].v, nkv * 2, cudaMemcpyDeviceToHost));
    std::vector<Sample> samples;
    for (int r = 0; r < 48; ++r) {
      const uint64_t h = (seed + 977 * r) * 0x9E3779B97F4A7C15ull;
      samples.push_back({static_cast<int64_t>(h % bs.B), static_cast<int64_t>((h >> 20) % bs.N),
                         r < 4 ? (r < 2 ? r : bs.T - 1 - (r - 2))
                               : static_cast<int64_t>((h >> 32) % bs.T)});
    }
    std::vector<double> ref_o, ref_lse;
    Reference(s, hq, hk, hv, samples, &ref_o, &ref_lse);
    for (Impl& im : impls) {
      if (!im.check) continue;
      CHECK_CUDA(cudaMemsetAsync(sets[0].o, 0xFF, nq * 2, stream));  // on the stream: ordered
      im.run(0);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaMemcpy(ho.data(), sets[0].o, nq * 2, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(hl.data(), sets[0].lse, hl.size() * 4, cudaMemcpyDeviceToHost));
      im.result = Compare(s, ho, hl, samples, ref_o, ref_lse, im.fp8 ? 6e-2 : 1e-2,
                          im.fp8 ? 0.25 : 1e-3);
      all_passed = all_passed && im.result.passed;
    }

    // 2. timing: iters per repeat from one timed launch, warm-up, interleaved repeats.
    for (Impl& im : impls) {
      CHECK_CUDA(cudaEventRecord(ev0, stream));
      for (int i = 0; i < 3; ++i) im.run(i % nsets);
      CHECK_CUDA(cudaEventRecord(ev1, stream));
      CHECK_CUDA(cudaEventSynchronize(ev1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
      im.iters = std::max(1, std::min(1000, static_cast<int>(opt.target_ms / (ms / 3 + 1e-3))));
    }
    for (int rep = -2; rep < opt.reps; ++rep) {
      for (Impl& im : impls) {
        CHECK_CUDA(cudaEventRecord(ev0, stream));
        for (int i = 0; i < im.iters; ++i) im.run(i % nsets);
        CHECK_CUDA(cudaEventRecord(ev1, stream));
        CHECK_CUDA(cudaEventSynchronize(ev1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
        if (rep >= 0) im.rep_ms.push_back(ms / im.iters);
      }
    }
    const double fused_ms = Median(impls[0].rep_ms);
    for (const Impl& im : impls) {
      const double ms = Median(im.rep_ms);
      const double tflops = bs.Flops() / (ms * 1e-3) / 1e12;
      std::ostringstream os;
      os << "{\"record\":\"result\",\"shape\":\"" << bs.Name() << "\",\"B\":" << bs.B
         << ",\"N\":" << bs.N << ",\"K\":" << bs.K << ",\"H\":" << bs.H << ",\"T\":" << bs.T
         << ",\"S\":" << bs.S << ",\"causal\":" << (bs.causal ? "true" : "false")
         << ",\"impl\":\"" << im.name << "\",\"detail\":\"" << im.detail << "\",\"ms\":"
         << Num(ms);
      if (im.bytes > 0) {
        os << ",\"gb_per_s\":" << Num(im.bytes / (ms * 1e-3) / 1e9);
      } else {
        os << ",\"tflops\":" << Num(tflops) << ",\"speedup_vs_fused\":" << Num(fused_ms / ms);
      }
      if (im.check) {
        os << ",\"rel_l2\":" << Num(im.result.rel_l2) << ",\"worst_row\":"
           << Num(im.result.worst_row) << ",\"lse_abs\":" << Num(im.result.lse_abs)
           << ",\"correct\":" << (im.result.passed ? "true" : "false");
      }
      os << ",\"iters\":" << im.iters << ",\"reps\":" << im.rep_ms.size() << "}";
      emit(os.str());
      char line[256];
      if (im.bytes > 0) {
        std::snprintf(line, sizeof(line), "%-28s %-10s %9.3f ms  %8.1f GB/s", bs.Name().c_str(),
                      im.name.c_str(), ms, im.bytes / (ms * 1e-3) / 1e9);
      } else {
        std::snprintf(line, sizeof(line), "%-28s %-10s %9.3f ms  %7.1f TFLOP/s  x%.2f  err %.3g%s",
                      bs.Name().c_str(), im.name.c_str(), ms, tflops, fused_ms / ms,
                      im.result.rel_l2, im.result.passed ? "" : "  FAILED");
      }
      table.push_back(line);
    }
    for (Set& st : sets) {
      for (void* p : {st.q, st.k, st.v, st.q8, st.k8, st.v8, st.o, st.ws}) cudaFree(p);
      cudaFree(st.lse);
      cudaFree(st.sc);
    }
  }
  std::fprintf(stderr, "\nshape                        impl              time       rate  vs fused\n");
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  std::fprintf(stderr, "correctness: %s\n", all_passed ? "all passed" : "FAILURES (see records)");
  return all_passed ? 0 : 1;
}
