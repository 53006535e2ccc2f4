// attn_int8_bench: the INT8 Q·Kᵀ variants of our 8-bit kernel (attn/kernels/int8_attention.h)
// against our bf16 fused kernel and the e4m3 kernel, same shapes, same GPU, same build (issue 20:
// "measure the INT8-Q·Kᵀ + fp16-P·V variant against the sm_89 bf16 fused kernel in the sm_89-only
// build on the H200"; build with CMAKE_CUDA_ARCHITECTURES=89 for that, 90a for native Hopper).
//
// Per shape: random normal bf16 inputs (host-generated, seeded), then
//   1. correctness first: every implementation's output against the fused kernel's (itself
//      held to float64 by tests/gpu/fused_parity_test.cc): relative L2 ≤ 0.05 for the INT8
//      paths (default recipe: rotation + K smoothing), ≤ 0.08 for e4m3, no NaN anywhere;
//   2. timing with CUDA events: 2 warm-up repeats, then `reps` interleaved repeats (each
//      implementation in turn), each repeat = `iters` back-to-back enqueues sized so a repeat
//      takes >= 20 ms; reported: the median repeat / iters.
// Implementations (kernel-only rows take inputs already quantised by their pre-pass):
//   fused          our bf16 fused kernel, default plan
//   fp8            Vᵀ pre-pass + e4m3 kernel (per-tensor E4M3 inputs, Fp8Prepass default recipe)
//   int8/e4m3-pv   Vᵀ pre-pass + INT8 Q·Kᵀ + E4M3 P·V kernel (default variant)
//   int8/16bit-pv  INT8 Q·Kᵀ + bf16 P·V kernel (V read from the bf16 input)
//   int8/<pv>+pre  Int8Prepass then the kernel: what a bf16 request costs end to end
// FLOPs = 4·B·N·T·S·H, halved for causal (DESIGN.md §10).
// Output: one JSON line per (shape, implementation) on stdout (ms, TFLOP/s, ratio to fused).
// Usage: attn_int8_bench [--reps=5] [--shape=B,N,K,H,T,S,causal]...
//   default: H in {128 (N=16), 64 (N=32)}, T = S in {4096, 8192}, B = 16384 / T, causal and not.
// Exit status: 0 when every correctness check passed, 1 otherwise (timings still printed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/fp8_attention.h"
#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fused_attention.h"
#include "attn/kernels/host_dtype.h"
#include "attn/kernels/int8_attention.h"
#include "attn/kernels/int8_prepass.h"

namespace {

using attn::Status;
using attn::kernels::AttentionShape;
using attn::kernels::AttentionTensors;
using attn::kernels::CausalAlignment;
using attn::kernels::DType;
using attn::kernels::Int8PvFormat;

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

void* Alloc(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes == 0 ? 256 : bytes));
  return p;
}

struct Shape {
  int64_t B, N, K, H, T, S;
  bool causal;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

/// Relative L2 of bf16 `got` against bf16 `want` (device buffers of n elements); NaN when got
/// holds a NaN.
double RelL2(const void* got, const void* want, int64_t n) {
  std::vector<uint16_t> a(n), b(n);
  CHECK_CUDA(cudaMemcpy(a.data(), got, 2 * n, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), want, 2 * n, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = attn::kernels::Bf16ToFloat(a[i]), y = attn::kernels::Bf16ToFloat(b[i]);
    if (std::isnan(x)) return NAN;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

struct Impl {
  std::string name;
  std::function<void()> enqueue;
  void* out;            // bf16 output checked against fused
  double tol;           // relative L2 bound against fused
  std::vector<double> rep_ms;
};

bool RunShape(const Shape& sh, int reps, cudaStream_t stream) {
  AttentionShape s;
  s.dtype = DType::kBFloat16;
  s.batch = sh.B;
  s.max_q_len = sh.T;
  s.max_kv_len = sh.S;
  s.num_heads = sh.N;
  s.num_kv_heads = sh.K;
  s.head_dim = sh.H;
  s.mask.causal = sh.causal ? CausalAlignment::kBottomRight : CausalAlignment::kNone;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sh.H)));
  const int64_t nq = s.q_elements(), nkv = s.kv_elements();
  std::mt19937_64 rng(1234 + sh.T + sh.H);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> host(std::max(nq, nkv));
  auto upload = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) host[i] = attn::kernels::FloatToBf16(normal(rng));
    void* d = Alloc(2 * n);
    CHECK_CUDA(cudaMemcpy(d, host.data(), 2 * n, cudaMemcpyHostToDevice));
    return d;
  };
  void *q = upload(nq), *k = upload(nkv), *v = upload(nkv);
  AttentionTensors in;
  in.q = q;
  in.k = k;
  in.v = v;
  std::vector<void*> owned{q, k, v};
  auto buf = [&](size_t bytes) {
    owned.push_back(Alloc(bytes));
    return owned.back();
  };
  std::vector<Impl> impls;

  // fused bf16.
  auto fplan = attn::kernels::FusedPlanFor(s, 0);
  CHECK_OK(fplan.status());
  AttentionTensors ft = in;
  ft.o = buf(2 * nq);
  impls.push_back({"fused", [&, ft] { CHECK_OK(attn::kernels::FusedRun(*fplan, ft, stream)); },
                   ft.o, 0.0, {}});

  // e4m3 kernel on per-tensor E4M3 inputs (Fp8Prepass, default recipe).
  auto eplan = attn::kernels::Fp8AttentionPlanFor(s, 0);
  CHECK_OK(eplan.status());
  void *q8 = buf(nq), *k8 = buf(nkv), *v8 = buf(nkv);
  auto* sc = static_cast<float*>(buf(64));
  const int64_t pw = std::max(attn::kernels::Fp8PrepassWorkspaceBytes(s),
                              attn::kernels::Int8PrepassWorkspaceBytes(s));
  void* pws = buf(pw);
  CHECK_OK(attn::kernels::Fp8Prepass(s, in, q8, k8, v8, sc, pws, pw, stream));
  AttentionTensors et = in;
  et.q = q8;
  et.k = k8;
  et.v = v8;
  et.o = buf(2 * nq);
  void* ews = buf(eplan->workspace_bytes);
  const attn::kernels::Fp8Descales ed{sc + attn::kernels::kFp8DescaleQ,
                                      sc + attn::kernels::kFp8DescaleK,
                                      sc + attn::kernels::kFp8DescaleV};
  impls.push_back({"fp8",
                   [&, et, ed, ews] {
                     CHECK_OK(attn::kernels::Fp8AttentionRun(*eplan, et, ed, ews,
                                                             eplan->workspace_bytes, stream));
                   },
                   et.o, 0.08, {}});

  // The INT8 paths: pre-quantised (kernel only) and with the pre-pass.
  std::vector<attn::kernels::Int8AttentionPlan> iplans;
  for (Int8PvFormat pv : {Int8PvFormat::kE4M3, Int8PvFormat::k16Bit}) {
    attn::kernels::Int8AttentionPlanOptions opt;
    opt.pv = pv;
    auto plan = attn::kernels::Int8AttentionPlanFor(s, 0, opt);
    CHECK_OK(plan.status());
    iplans.push_back(*plan);
  }
  for (size_t i = 0; i < iplans.size(); ++i) {
    const Int8PvFormat pv = iplans[i].pv;
    attn::kernels::Int8PrepassOutputs pre;
    pre.q8 = static_cast<int8_t*>(buf(nq));
    pre.k8 = static_cast<int8_t*>(buf(nkv));
    pre.q_scale = static_cast<float*>(buf(4 * s.q_rows() * s.num_heads));
    pre.k_scale = static_cast<float*>(buf(4 * s.kv_rows() * s.num_kv_heads));
    pre.v8 = static_cast<uint8_t*>(buf(nkv));
    pre.v_scalars = static_cast<float*>(buf(16));
    void* ipws = buf(pw);
    CHECK_OK(attn::kernels::Int8Prepass(s, in, pv, pre, ipws, pw, stream));
    AttentionTensors it = in;
    it.q = pre.q8;
    it.k = pre.k8;
    it.v = pv == Int8PvFormat::kE4M3 ? static_cast<const void*>(pre.v8) : v;
    it.o = buf(2 * nq);
    void* iws = buf(iplans[i].workspace_bytes);
    const attn::kernels::Int8Scales isc{pre.q_scale, pre.k_scale, pre.v_scalars + 1};
    const attn::kernels::Int8AttentionPlan* plan = &iplans[i];
    const std::string name = std::string("int8/") + (i == 0 ? "e4m3-pv" : "16bit-pv");
    auto kernel = [plan, it, isc, iws, stream] {
      CHECK_OK(attn::kernels::Int8AttentionRun(*plan, it, isc, iws, plan->workspace_bytes,
                                               stream));
    };
    impls.push_back({name, kernel, it.o, 0.05, {}});
    impls.push_back({name + "+pre",
                     [kernel, s, in, pv, pre, ipws, pw, stream] {
                       CHECK_OK(attn::kernels::Int8Prepass(s, in, pv, pre, ipws, pw, stream));
                       kernel();
                     },
                     it.o, 0.05, {}});
  }

  // 1. correctness.
  bool ok = true;
  for (Impl& im : impls) im.enqueue();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (const Impl& im : impls) {
    if (im.tol == 0) continue;
    const double e = RelL2(im.out, ft.o, nq);
    const bool pass = std::isfinite(e) && e <= im.tol;
    std::fprintf(stderr, "  %-20s rel_l2 vs fused %.4f (bound %.2f)%s\n", im.name.c_str(), e,
                 im.tol, pass ? "" : "  FAILED");
    ok = ok && pass;
  }

  // 2. timing.
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
  auto time_iters = [&](Impl& im, int iters) {
    CHECK_CUDA(cudaEventRecord(ev0, stream));
    for (int i = 0; i < iters; ++i) im.enqueue();
    CHECK_CUDA(cudaEventRecord(ev1, stream));
    CHECK_CUDA(cudaEventSynchronize(ev1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
    return static_cast<double>(ms);
  };
  std::vector<int> iters(impls.size());
  for (size_t i = 0; i < impls.size(); ++i) {
    const double one = std::max(time_iters(impls[i], 1), 1e-3);
    iters[i] = std::max(1, static_cast<int>(std::ceil(20.0 / one)));
    for (int w = 0; w < 2; ++w) time_iters(impls[i], iters[i]);  // warm-up
  }
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < impls.size(); ++i)
      impls[i].rep_ms.push_back(time_iters(impls[i], iters[i]) / iters[i]);
  const double flops = 4.0 * sh.B * sh.N * sh.T * sh.S * sh.H * (sh.causal ? 0.5 : 1.0);
  const double fused_ms = Median(impls[0].rep_ms);
  for (const Impl& im : impls) {
    const double ms = Median(im.rep_ms);
    std::printf("{\"record\":\"result\",\"impl\":\"%s\",\"B\":%lld,\"N\":%lld,\"K\":%lld,"
                "\"H\":%lld,\"T\":%lld,\"S\":%lld,\"causal\":%s,\"ms\":%.5f,\"tflops\":%.2f,"
                "\"vs_fused\":%.3f,\"ok\":%s}\n",
                im.name.c_str(), static_cast<long long>(sh.B), static_cast<long long>(sh.N),
                static_cast<long long>(sh.K), static_cast<long long>(sh.H),
                static_cast<long long>(sh.T), static_cast<long long>(sh.S),
                sh.causal ? "true" : "false", ms, flops / ms * 1e-9, fused_ms / ms,
                ok ? "true" : "false");
  }
  CHECK_CUDA(cudaEventDestroy(ev0));
  CHECK_CUDA(cudaEventDestroy(ev1));
  for (void* p : owned) CHECK_CUDA(cudaFree(p));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::atoi(a.c_str() + 7));
    } else if (a.rfind("--shape=", 0) == 0) {
      Shape s{};
      int c = 0;
      if (std::sscanf(a.c_str() + 8, "%ld,%ld,%ld,%ld,%ld,%ld,%d", &s.B, &s.N, &s.K, &s.H, &s.T,
                      &s.S, &c) != 7) {
        std::fprintf(stderr, "bad --shape (B,N,K,H,T,S,causal): %s\n", a.c_str());
        return 2;
      }
      s.causal = c != 0;
      shapes.push_back(s);
    } else {
      std::fprintf(stderr, "usage: %s [--reps=N] [--shape=B,N,K,H,T,S,causal]...\n", argv[0]);
      return 2;
    }
  }
  if (shapes.empty()) {
    for (int64_t H : {128, 64})
      for (int64_t T : {4096, 8192})
        for (bool causal : {false, true})
          shapes.push_back({16384 / T, 2048 / H, 2048 / H, H, T, T, causal});
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"record\":\"device\",\"name\":\"%s\",\"cc\":%d}\n", prop.name,
              prop.major * 10 + prop.minor);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool ok = true;
  for (const Shape& s : shapes) {
    std::fprintf(stderr, "shape B%lld N%lld K%lld H%lld T%lld S%lld %s\n",
                 static_cast<long long>(s.B), static_cast<long long>(s.N),
                 static_cast<long long>(s.K), static_cast<long long>(s.H),
                 static_cast<long long>(s.T), static_cast<long long>(s.S),
                 s.causal ? "causal" : "non-causal");
    ok = RunShape(s, reps, stream) && ok;
  }
  return ok ? 0 : 1;
}
