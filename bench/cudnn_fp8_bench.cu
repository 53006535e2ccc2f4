// attn_cudnn_fp8_bench: cuDNN's FP8 (E4M3) SDPA on Hopper, alone and as the whole `fp8` path
// from bf16 inputs (pre-pass + graph + conversion of O), against cuDNN's bf16 SDPA on the same
// shapes, same GPU, same build (issue 20: the FP8 path on Hopper).
//
// Per shape: random normal bf16 inputs generated on the device, then
//   1. correctness, before any timing: cudnn, fp8_plain and fp8_default against a float64
//      reference of 64 sampled query rows (spread over batch entries and heads; GQA: kv head =
//      n / (N/K)) computed here from the bf16 inputs of set 0, for three input kinds:
//        normal   q, k, v ~ N(0,1)
//        outlier  q and k channels 1, H/2, H-1 multiplied by 20 (v normal)
//        kbias    k = N(0,1) + 20 on channels 1, H/2, H-1 (q, v normal)
//      error = ‖out − ref‖₂/‖ref‖₂ over the sampled rows, plus a NaN scan of the whole output;
//      a failure when cudnn > 2e-2, fp8_default > 0.10, fp8_plain > 1.0 or any NaN, for every
//      kind. fp8_graph and
//      fp8_graph_tuned (E4M3 output × descale_v) are checked on normal inputs for information
//      only (not gated).
//   2. timing with CUDA events, normal inputs only: 2 warm-up repeats, then `reps` interleaved
//      repeats (each implementation in turn), each repeat = `iters` back-to-back launches (iters
//      sized so that one repeat takes >= target-ms) rotating over >= 3 input/output sets, more
//      when 3 sets hold less than 2× the L2 size (cudaDeviceProp::l2CacheSize), so that L2 does
//      not flatter; the time reported is the median repeat / iters.
// Implementations:
//   cudnn            CudnnAttention::Run on the bf16 plan (what the `cudnn` backend runs)
//   fp8_graph        the FP8 graph alone on inputs already in E4M3 (each set's default-recipe
//                    pre-pass, its descales copied to the host once), E4M3 output: no pre-pass
//                    and no conversion run
//   fp8_graph_tuned  the same graph from a CudnnAttention created with CudnnOptions::autotune
//                    (every engine configuration timed at its first Run, which runs untimed
//                    here and is reported as an "autotune" record)
//   fp8_plain        bf16 in, bf16 out, recipe off (shape.fp8.rotate = smooth_k = false):
//                    pre-pass (amax + quantise) + FP8 graph + conversion of O
//   fp8_default      the same with the default recipe (Hadamard rotation of q/k, K smoothing)
//   prepass_plain    Fp8Prepass alone, recipe off
//   prepass_default  Fp8Prepass alone, default recipe
//   prepass_rotate   Fp8Prepass alone, rotation only
//   prepass_smooth   Fp8Prepass alone, K smoothing only
// FLOPs = 4·B·N·T·S·H, halved for causal (DESIGN.md §10); ratio = cudnn_ms / impl_ms (> 1: faster
// than cuDNN bf16). The pre-passes are reported in GB/s of bf16 input read once (q, k, v)
// instead of TFLOP/s. Per shape also fp8_graph_tuned / fp8_graph (time ratio; < 1: tuning won).
// Output: JSON lines on stdout (and appended to --out=FILE): one "device" record (name, cc,
// cuDNN runtime and build versions), "graph" and "autotune" records (seconds), "check" records
// (shape, kind, impl), one "result" record per (shape, implementation) with ms, TFLOP/s or GB/s,
// ratio to cudnn and rel_l2 where computed, one "tuned_vs_graph" record per shape; "skip"
// records name what could not run and why. Human-readable tables on stderr.
//
// Usage: attn_cudnn_fp8_bench [--reps=5] [--target-ms=20] [--quick] [--out=FILE]
//          [--shape=B,N,K,H,T,S,causal]...
//   default grid: hidden 2048 (N = K = 2048/H: 32 at H=64, 16 at H=128), 16k tokens per batch
//   (B = 16384/T), T = S in {1024, 4096, 8192, 16384}, top-left causal and not, H in {64, 128};
//   --quick: T in {4096, 8192}; --shape (repeatable, GQA allowed: K divides N) replaces the grid.
// Exit status: 0 when every gated check passed, and when skipped (no CUDA device, a device below
// sm_90 -- cuDNN FP8 needs Hopper --, libcudnn not loadable, or a build without cuDNN: the reason
// is printed); 1 when a gated check failed (timings still printed); 2 on a usage or CUDA error.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/host_dtype.h"
#if defined(ATTN_HAVE_CUDNN)
#include "attn/kernels/cudnn_attention.h"
#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#define ATTN_BENCH_HAVE_CUDNN 1
#else
#define ATTN_BENCH_HAVE_CUDNN 0
#endif

namespace {

/// `s` with '"' and '\\' escaped, for a JSON string.
std::string JsonEscape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return o;
}

/// Writes JSON lines to stdout and, with --out=FILE, appends them to FILE.
class JsonLines {
 public:
  explicit JsonLines(const std::string& path) {
    if (!path.empty()) file_.open(path, std::ios::app);
  }
  void Emit(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (file_) file_ << line << "\n" << std::flush;
  }

 private:
  std::ofstream file_;
};

/// Reports a skip (stderr and a "skip" record) and returns the exit status of a skip: 0.
int Skip(JsonLines* out, const std::string& reason) {
  std::fprintf(stderr, "attn_cudnn_fp8_bench: skipped: %s\n", reason.c_str());
  out->Emit("{\"record\":\"skip\",\"bench\":\"attn_cudnn_fp8_bench\",\"reason\":\"" +
            JsonEscape(reason) + "\"}");
  return 0;
}

}  // namespace

#if ATTN_BENCH_HAVE_CUDNN
namespace {

using attn::Status;
using attn::StatusOr;
using attn::kernels::AttentionShape;
using attn::kernels::AttentionTensors;
using attn::kernels::CausalAlignment;
using attn::kernels::CudnnAttention;
using attn::kernels::CudnnFp8Inputs;
using attn::kernels::CudnnPlan;
using attn::kernels::DType;

/// Exits with status 2 naming the CUDA call that failed.
void DieOnCuda(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, expr, cudaGetErrorString(e));
  std::exit(2);
}
/// Exits with status 2 naming the call that failed and its status.
void DieOnError(const Status& s, const char* expr, const char* file, int line) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, expr, s.ToString().c_str());
  std::exit(2);
}
#define CHECK_CUDA(expr) DieOnCuda((expr), #expr, __FILE__, __LINE__)
#define CHECK_OK(expr) DieOnError((expr), #expr, __FILE__, __LINE__)

constexpr int kSampledRows = 64;       ///< query rows checked against the float64 reference
constexpr double kCudnnTol = 2e-2;     ///< relative L2 gate of the bf16 graph
constexpr double kFp8Tol = 0.10;       ///< relative L2 gate of the FP8 path, default recipe
/// The plain recipe (per-tensor E4M3 alone) is known to miss 0.10 on the outlier and key-bias
/// sets (0.25-0.8, issue 20): its error is reported, only NaN or a gross error fails.
constexpr double kPlainTol = 1.0;
constexpr float kOutlierFactor = 20.f; ///< outlier: × this; kbias: + this (channels 1, H/2, H-1)

// ---- inputs -----------------------------------------------------------------------------------

/// SplitMix64's finaliser: a 64-bit counter hash (host and device).
__host__ __device__ __forceinline__ uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// What FillBf16 does to channels 1, H/2 and H-1 of every row.
enum ChannelEdit : int { kEditNone = 0, kEditTimes = 1, kEditPlus = 2 };

/// out[i] = N(0,1) (Box-Muller on a hash of seed and i), with channels 1, H/2, H-1 of each row
/// of `head_dim` values multiplied by (kEditTimes) or shifted by (kEditPlus) kOutlierFactor,
/// rounded to bf16.
__global__ void FillBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, int64_t head_dim,
                         int edit) {
  const uint64_t key = Mix64(seed + 0x9e3779b97f4a7c15ull);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const uint64_t h = Mix64(key ^ (static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull));
    const float u1 = 1.f - static_cast<float>(h >> 40) * 0x1p-24f;  // (0, 1]
    const float u2 = static_cast<float>(h & 0xffffffull) * 0x1p-24f; // [0, 1)
    float z = sqrtf(-2.f * logf(u1)) * sinpif(2.f * u2);
    const int64_t c = i % head_dim;
    if (edit != kEditNone && (c == 1 || c == head_dim / 2 || c == head_dim - 1)) {
      z = edit == kEditTimes ? z * kOutlierFactor : z + kOutlierFactor;
    }
    out[i] = __float2bfloat16_rn(z);
  }
}

/// The input kinds of the error check (timing uses kNormal only).
enum class InputKind { kNormal, kOutlier, kKbias };
const char* KindName(InputKind k) {
  return k == InputKind::kNormal ? "normal" : (k == InputKind::kOutlier ? "outlier" : "kbias");
}

/// Enqueues FillBf16 over `n` elements of `p`.
void Fill(void* p, int64_t n, uint64_t seed, int64_t head_dim, int edit, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(4096, std::max<int64_t>(1, (n + 255) / 256));
  FillBf16<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n,
                                                              seed, head_dim, edit);
  CHECK_CUDA(cudaGetLastError());
}

// ---- shapes and options -----------------------------------------------------------------------

struct BenchShape {
  int64_t B = 0, N = 0, K = 0, H = 0, T = 0, S = 0;
  bool causal = false;

  std::string Name() const {
    std::ostringstream os;
    os << "B" << B << "_N" << N << "_K" << K << "_H" << H << "_T" << T << "_S" << S
       << (causal ? "_causal" : "");
    return os.str();
  }
  /// 4·B·N·T·S·H, halved for causal.
  double Flops() const {
    const double f = 4.0 * static_cast<double>(B) * N * static_cast<double>(T) * S * H;
    return causal ? 0.5 * f : f;
  }
  /// The bf16 problem: padded, no lengths, no lse, top-left causal or no mask, scale 1/sqrt(H).
  AttentionShape Problem() const {
    AttentionShape s;
    s.layout = attn::kernels::Layout::kPadded;
    s.dtype = DType::kBFloat16;
    s.batch = B;
    s.max_q_len = T;
    s.max_kv_len = S;
    s.num_heads = N;
    s.num_kv_heads = K;
    s.head_dim = H;
    s.mask.causal = causal ? CausalAlignment::kTopLeft : CausalAlignment::kNone;
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(H)));
    s.has_lengths = false;
    s.return_lse = false;
    return s;
  }
};

struct Options {
  int reps = 5;
  double target_ms = 20;
  bool quick = false;
  std::string out;
  std::vector<BenchShape> shapes;
};

[[noreturn]] void Usage(const std::string& what) {
  std::fprintf(stderr, "attn_cudnn_fp8_bench: %s (see the header of bench/cudnn_fp8_bench.cu)\n",
               what.c_str());
  std::exit(2);
}

/// Parses the value of --shape=B,N,K,H,T,S,causal; exits 2 on a malformed or inconsistent one.
BenchShape ParseShape(const std::string& text) {
  long long v[7] = {};
  int used = 0;
  if (std::sscanf(text.c_str(), "%lld,%lld,%lld,%lld,%lld,%lld,%lld%n", &v[0], &v[1], &v[2],
                  &v[3], &v[4], &v[5], &v[6], &used) != 7 ||
      used != static_cast<int>(text.size())) {
    Usage("bad --shape=" + text + " (want B,N,K,H,T,S,causal)");
  }
  BenchShape s;
  s.B = v[0];
  s.N = v[1];
  s.K = v[2];
  s.H = v[3];
  s.T = v[4];
  s.S = v[5];
  s.causal = v[6] != 0;
  if (s.B <= 0 || s.N <= 0 || s.K <= 0 || s.H <= 0 || s.T <= 0 || s.S <= 0 || s.N % s.K != 0) {
    Usage("bad --shape=" + text + " (positive extents, K dividing N)");
  }
  return s;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    const std::string val = eq == std::string::npos ? std::string() : a.substr(eq + 1);
    if (key == "--reps" && !val.empty()) {
      o.reps = std::max(1, std::atoi(val.c_str()));
    } else if (key == "--target-ms" && !val.empty()) {
      o.target_ms = std::max(0.1, std::atof(val.c_str()));
    } else if (a == "--quick") {
      o.quick = true;
    } else if (key == "--out" && !val.empty()) {
      o.out = val;
    } else if (key == "--shape" && !val.empty()) {
      o.shapes.push_back(ParseShape(val));
    } else {
      Usage("unknown argument " + a);
    }
  }
  if (o.shapes.empty()) {
    const std::vector<int64_t> ts = o.quick ? std::vector<int64_t>{4096, 8192}
                                            : std::vector<int64_t>{1024, 4096, 8192, 16384};
    for (int64_t h : {64, 128}) {
      for (int64_t t : ts) {
        for (bool causal : {false, true}) {
          BenchShape s;
          s.B = 16384 / t;
          s.N = s.K = 2048 / h;
          s.H = h;
          s.T = s.S = t;
          s.causal = causal;
          o.shapes.push_back(s);
        }
      }
    }
  }
  return o;
}

// ---- float64 reference on sampled rows --------------------------------------------------------

/// One sampled query row: batch entry b, query t, head n.
struct Row {
  int64_t b, t, n;
};

/// kSampledRows rows spread over batch entries and heads: entry r mod B, head (7r + r/B) mod N;
/// queries 0 and T-1 first, then hashed positions.
std::vector<Row> SampleRows(const BenchShape& bs, uint64_t seed) {
  std::vector<Row> rows;
  rows.reserve(kSampledRows);
  for (int64_t r = 0; r < kSampledRows; ++r) {
    const uint64_t h = Mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(r));
    const int64_t t = r == 0 ? 0 : (r == 1 ? bs.T - 1 : static_cast<int64_t>(h % bs.T));
    rows.push_back({r % bs.B, t, (7 * r + r / bs.B) % bs.N});
  }
  return rows;
}

/// softmax(scale·q·Kᵀ + mask)·V in double for each row of `rows`, from the bf16 bits of q
/// (B, T, N, H), k and v (B, S, K, H); query head n reads kv head n / (N/K). Rows × H values;
/// a row that sees no key is zeros.
std::vector<double> ReferenceRows(const AttentionShape& s, const std::vector<uint16_t>& q,
                                  const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                                  const std::vector<Row>& rows) {
  using attn::kernels::Bf16ToFloat;
  const int64_t H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  const int64_t T = s.max_q_len, S = s.max_kv_len, group = N / K;
  std::vector<double> out(rows.size() * H, 0.0), qd(H), logit(S);
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const int64_t kv_head = row.n / group;
    const uint16_t* q_row = &q[((row.b * T + row.t) * N + row.n) * H];
    for (int64_t d = 0; d < H; ++d) qd[d] = Bf16ToFloat(q_row[d]);
    const attn::kernels::KeyRange keys = attn::kernels::BandKeyRange(s.mask, row.t, T, S);
    if (keys.empty()) continue;
    double top = -INFINITY;
    for (int64_t j = keys.lo; j <= keys.hi; ++j) {
      const uint16_t* k_row = &k[((row.b * S + j) * K + kv_head) * H];
      double dot = 0;
      for (int64_t d = 0; d < H; ++d) dot += qd[d] * Bf16ToFloat(k_row[d]);
      logit[j] = dot * static_cast<double>(s.scale);
      top = std::max(top, logit[j]);
    }
    double* o = &out[r * H];
    double total = 0;
    for (int64_t j = keys.lo; j <= keys.hi; ++j) {
      const double p = std::exp(logit[j] - top);
      total += p;
      const uint16_t* v_row = &v[((row.b * S + j) * K + kv_head) * H];
      for (int64_t d = 0; d < H; ++d) o[d] += p * Bf16ToFloat(v_row[d]);
    }
    for (int64_t d = 0; d < H; ++d) o[d] /= total;
  }
  return out;
}

struct ErrorStats {
  double rel_l2 = NAN;     ///< ‖out − ref‖₂/‖ref‖₂ over the sampled rows
  double worst_row = NAN;  ///< the largest per-row relative L2
  bool nan = false;        ///< a NaN anywhere in the output
};

/// Compares an output (B, T, N, H), read as float through out_at(flat index), with the
/// reference of `rows`, and scans all of it for NaN. A NaN in a sampled row makes rel_l2 NaN.
template <typename OutAt>
ErrorStats Compare(const AttentionShape& s, const std::vector<Row>& rows,
                   const std::vector<double>& ref, OutAt out_at) {
  ErrorStats e;
  const int64_t H = s.head_dim, N = s.num_heads, T = s.max_q_len, n = s.q_elements();
  for (int64_t i = 0; i < n && !e.nan; ++i) e.nan = std::isnan(out_at(i));
  double err2 = 0, ref2 = 0;
  e.worst_row = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t at = ((rows[r].b * T + rows[r].t) * N + rows[r].n) * H;
    double row_err2 = 0, row_ref2 = 0;
    for (int64_t d = 0; d < H; ++d) {
      const double want = ref[r * H + d];
      const double diff = static_cast<double>(out_at(at + d)) - want;
      row_err2 += diff * diff;
      row_ref2 += want * want;
    }
    err2 += row_err2;
    ref2 += row_ref2;
    const double row = std::sqrt(row_err2 / std::max(row_ref2, 1e-300));
    if (std::isnan(row) || row > e.worst_row) e.worst_row = row;  // NaN sticks
  }
  e.rel_l2 = std::sqrt(err2 / std::max(ref2, 1e-300));
  return e;
}

// ---- device buffers ---------------------------------------------------------------------------

/// The device allocations of one shape, freed together.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  /// max(bytes, 256) bytes of device memory (256-byte aligned); exits 2 on failure.
  void* Alloc(uint64_t bytes) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, std::max<uint64_t>(bytes, 256)));
    ptrs_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

/// One input/output set of the rotation.
struct IoSet {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;  ///< bf16 inputs and output
  void *q8 = nullptr, *k8 = nullptr, *v8 = nullptr;  ///< E4M3: default-recipe pre-pass of q, k, v
  void* o8 = nullptr;                                ///< E4M3 output of fp8_graph(_tuned)
  void *scratch_q8 = nullptr, *scratch_k8 = nullptr, *scratch_v8 = nullptr;  ///< timed pre-passes
  float* scalars = nullptr;          ///< the 9 pre-pass floats (Fp8Scalar order) of q8, k8, v8
  float* scratch_scalars = nullptr;  ///< the 9 floats of the timed pre-passes
  CudnnFp8Inputs graph_in;           ///< fp8_graph: E4M3 out, the descales of `scalars` (host)

  AttentionTensors Bf16() const {
    AttentionTensors t;
    t.q = q;
    t.k = k;
    t.v = v;
    t.o = o;
    return t;
  }
  AttentionTensors E4M3() const {
    AttentionTensors t;
    t.q = q8;
    t.k = k8;
    t.v = v8;
    t.o = o8;
    return t;
  }
};

/// Bytes of one IoSet for `s`.
uint64_t SetBytes(const AttentionShape& s) {
  const uint64_t nq = s.q_elements(), nkv = s.kv_elements();
  return 2 * (2 * nq + 2 * nkv)  // q, o, k, v in bf16
         + (2 * nq + 2 * nkv)       // q8, o8, k8, v8
         + (nq + 2 * nkv);          // the timed pre-passes' q8, k8, v8
}

/// Fills set `index` with inputs of `kind` (v always normal). The seeds depend on (seed, index)
/// and the tensor only, so refilling a set with kNormal restores it exactly.
void FillSet(const IoSet& set, const AttentionShape& s, uint64_t seed, int index, InputKind kind,
             cudaStream_t stream) {
  const uint64_t base = seed + 3 * static_cast<uint64_t>(index);
  const int q_edit = kind == InputKind::kOutlier ? kEditTimes : kEditNone;
  const int k_edit = kind == InputKind::kOutlier ? kEditTimes
                                                 : (kind == InputKind::kKbias ? kEditPlus : kEditNone);
  Fill(set.q, s.q_elements(), base, s.head_dim, q_edit, stream);
  Fill(set.k, s.kv_elements(), base + 1, s.head_dim, k_edit, stream);
  Fill(set.v, s.kv_elements(), base + 2, s.head_dim, kEditNone, stream);
}

// ---- implementations and timing ---------------------------------------------------------------

/// Where a checked implementation writes its output.
enum class Output { kNone, kBf16, kE4M3 };

struct Impl {
  std::string name, detail;
  std::function<void(int set)> run;  ///< enqueues one launch on set `set`
  Output output = Output::kNone;
  double tol = 0;        ///< relative L2 gate (every input kind); 0: normal inputs, not gated
  double bytes = 0;      ///< pre-passes: bf16 bytes read once (GB/s instead of TFLOP/s)
  double rel_l2 = NAN;   ///< normal inputs, set 0 (NaN: not computed or NaN output)
  bool passed = true;    ///< every gated check of this implementation passed
  int iters = 1;
  std::vector<double> rep_ms;  ///< ms per launch of each timed repeat
};

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// A JSON number, null when not finite.
std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

/// Times every implementation of `impls` on `stream`: iters from 3 timed launches (after one
/// untimed), then 2 warm-up repeats and opt.reps timed repeats, interleaved (each implementation
/// in turn), each repeat `iters` launches rotating over the `nsets` sets.
void TimeAll(std::vector<Impl>* impls, int nsets, const Options& opt, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  int next_set = 0;
  auto timed = [&](Impl& im, int launches) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < launches; ++i) im.run(next_set++ % nsets);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms);
  };
  for (Impl& im : *impls) {
    timed(im, 1);
    const double per_launch = std::max(timed(im, 3) / 3, 1e-4);
    im.iters = std::clamp(static_cast<int>(std::ceil(opt.target_ms / per_launch)), 1, 20000);
  }
  for (int rep = -2; rep < opt.reps; ++rep) {
    for (Impl& im : *impls) {
      const double ms = timed(im, im.iters);
      if (rep >= 0) im.rep_ms.push_back(ms / im.iters);
    }
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
}

/// E4M3 byte -> float for all 256 bytes.
std::vector<float> E4M3Table() {
  std::vector<float> t(256);
  for (int b = 0; b < 256; ++b) t[b] = attn::kernels::E4M3ToFloat(static_cast<uint8_t>(b));
  return t;
}

// ---- the bench --------------------------------------------------------------------------------

class Bench {
 public:
  Bench(const Options& opt, const cudaDeviceProp& prop, CudnnAttention* cudnn,
        CudnnAttention* tuned, const std::string& tuned_why, JsonLines* out)
      : opt_(opt), prop_(prop), cudnn_(cudnn), tuned_(tuned), tuned_why_(tuned_why), out_(out),
        e4m3_(E4M3Table()) {
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Bench() { cudaStreamDestroy(stream_); }

  /// Checks and times one shape; false when a gated check failed.
  bool RunShape(const BenchShape& bs, uint64_t seed);
  /// The human-readable tables gathered so far.
  const std::vector<std::string>& report() const { return report_; }

 private:
  void SkipImpl(const BenchShape& bs, const std::string& impl, const std::string& reason) {
    out_->Emit("{\"record\":\"skip\",\"shape\":\"" + bs.Name() + "\",\"impl\":\"" + impl +
               "\",\"reason\":\"" + JsonEscape(reason) + "\"}");
    report_.push_back(bs.Name() + "  " + impl + " skipped: " + reason);
  }
  /// Plans `shape` on `c` (timing the graph build into a "graph" record); on failure reports
  /// the skip of `impl` and returns false.
  bool PlanFor(CudnnAttention* c, const BenchShape& bs, const AttentionShape& shape, bool fp8,
               const std::string& impl, CudnnPlan* plan);
  /// Runs the checks of the three input kinds on set 0 (leaving it refilled with normal
  /// inputs); false when a gated check failed.
  bool CheckAll(const BenchShape& bs, const AttentionShape& s, uint64_t seed,
                const std::vector<IoSet>& sets, std::vector<Impl>* impls);
  void EmitResults(const BenchShape& bs, int nsets, const std::vector<Impl>& impls);

  const Options& opt_;
  const cudaDeviceProp& prop_;
  CudnnAttention* cudnn_;
  CudnnAttention* tuned_;
  std::string tuned_why_;
  JsonLines* out_;
  cudaStream_t stream_ = nullptr;
  std::vector<float> e4m3_;
  std::vector<std::string> report_;
};

bool Bench::PlanFor(CudnnAttention* c, const BenchShape& bs, const AttentionShape& shape,
                    bool fp8, const std::string& impl, CudnnPlan* plan) {
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<CudnnPlan> p = c->Plan(shape, fp8);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!p.ok()) {
    SkipImpl(bs, impl, p.status().ToString());
    return false;
  }
  *plan = std::move(*p);
  out_->Emit("{\"record\":\"graph\",\"shape\":\"" + bs.Name() + "\",\"impl\":\"" + impl +
             "\",\"plan_seconds\":" + Num(seconds) + ",\"detail\":\"" +
             JsonEscape(plan->Describe()) + "\"}");
  return true;
}

bool Bench::RunShape(const BenchShape& bs, uint64_t seed) {
  using attn::kernels::Fp8Prepass;
  using attn::kernels::Fp8PrepassWorkspaceBytes;
  const AttentionShape s = bs.Problem();
  AttentionShape s_plain = s;
  s_plain.fp8.rotate = false;
  s_plain.fp8.smooth_k = false;
  AttentionShape s_default = s;
  s_default.fp8.rotate = true;
  s_default.fp8.smooth_k = true;

  // Sets: >= 3, and together >= 2x L2.
  const uint64_t set_bytes = SetBytes(s);
  const uint64_t l2 = static_cast<uint64_t>(std::max(prop_.l2CacheSize, 0));
  const int nsets = static_cast<int>(
      std::clamp<uint64_t>((2 * l2 + set_bytes - 1) / set_bytes, 3, 32));
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (static_cast<double>(nsets) * set_bytes > 0.8 * static_cast<double>(free_bytes)) {
    SkipImpl(bs, "*", "needs " + std::to_string(nsets * set_bytes >> 20) + " MiB of buffers, " +
                          std::to_string(free_bytes >> 20) + " MiB free");
    return true;
  }
  DeviceArena arena;
  const uint64_t nq = s.q_elements(), nkv = s.kv_elements();
  std::vector<IoSet> sets(nsets);
  for (int i = 0; i < nsets; ++i) {
    IoSet& st = sets[i];
    st.q = arena.Alloc(2 * nq);
    st.k = arena.Alloc(2 * nkv);
    st.v = arena.Alloc(2 * nkv);
    st.o = arena.Alloc(2 * nq);
    st.q8 = arena.Alloc(nq);
    st.k8 = arena.Alloc(nkv);
    st.v8 = arena.Alloc(nkv);
    st.o8 = arena.Alloc(nq);
    st.scratch_q8 = arena.Alloc(nq);
    st.scratch_k8 = arena.Alloc(nkv);
    st.scratch_v8 = arena.Alloc(nkv);
    st.scalars = static_cast<float*>(arena.Alloc(attn::kernels::kFp8NumScalars * sizeof(float)));
    st.scratch_scalars =
        static_cast<float*>(arena.Alloc(attn::kernels::kFp8NumScalars * sizeof(float)));
    FillSet(st, s, seed, i, InputKind::kNormal, stream_);
  }
  const int64_t pws_plain_bytes = Fp8PrepassWorkspaceBytes(s_plain);
  const int64_t pws_default_bytes = Fp8PrepassWorkspaceBytes(s_default);
  void* pws_plain = arena.Alloc(static_cast<uint64_t>(pws_plain_bytes));
  void* pws_default = arena.Alloc(static_cast<uint64_t>(pws_default_bytes));
  const int64_t pws_plain_size = std::max<int64_t>(pws_plain_bytes, 256);
  const int64_t pws_default_size = std::max<int64_t>(pws_default_bytes, 256);

  // fp8_graph's inputs: each set's default-recipe pre-pass, descales copied to the host once.
  std::vector<AttentionShape> shapes8(nsets);
  for (int i = 0; i < nsets; ++i) {
    IoSet& st = sets[i];
    CHECK_OK(Fp8Prepass(s_default, st.Bf16(), st.q8, st.k8, st.v8, st.scalars, pws_default,
                        pws_default_size, stream_));
    float host[attn::kernels::kFp8NumScalars];
    CHECK_CUDA(cudaMemcpyAsync(host, st.scalars, sizeof(host), cudaMemcpyDeviceToHost, stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    st.graph_in.out_dtype = DType::kFloat8E4M3;
    st.graph_in.q_descale = host[attn::kernels::kFp8DescaleQ];
    st.graph_in.k_descale = host[attn::kernels::kFp8DescaleK];
    st.graph_in.v_descale = host[attn::kernels::kFp8DescaleV];
    AttentionShape& s8 = shapes8[i];
    s8 = s_default;
    s8.dtype = DType::kFloat8E4M3;
    s8.fp8.q_descale = st.graph_in.q_descale;
    s8.fp8.k_descale = st.graph_in.k_descale;
    s8.fp8.v_descale = st.graph_in.v_descale;
  }

  // Plans (one per set for the E4M3 graph: each set has its own descales) and workspaces.
  CudnnPlan plan_bf16, plan_plain, plan_default;
  std::vector<CudnnPlan> plans8(nsets), plans8_tuned(nsets);
  bool have_bf16 = PlanFor(cudnn_, bs, s, false, "cudnn", &plan_bf16);
  bool have_plain = PlanFor(cudnn_, bs, s_plain, true, "fp8_plain", &plan_plain);
  bool have_default = PlanFor(cudnn_, bs, s_default, true, "fp8_default", &plan_default);
  bool have_graph = true, have_tuned = tuned_ != nullptr;
  if (!have_tuned) SkipImpl(bs, "fp8_graph_tuned", tuned_why_);
  for (int i = 0; i < nsets && have_graph; ++i) {
    have_graph = PlanFor(cudnn_, bs, shapes8[i], true, "fp8_graph", &plans8[i]);
  }
  for (int i = 0; i < nsets && have_tuned; ++i) {
    have_tuned = PlanFor(tuned_, bs, shapes8[i], true, "fp8_graph_tuned", &plans8_tuned[i]);
  }
  auto max_ws = [](const std::vector<CudnnPlan>& plans) {
    uint64_t m = 0;
    for (const CudnnPlan& p : plans) m = std::max(m, p.workspace_bytes);
    return std::max<uint64_t>(m, 256);
  };
  const uint64_t ws_bf16_size = std::max<uint64_t>(plan_bf16.workspace_bytes, 256);
  const uint64_t ws_plain_size = std::max<uint64_t>(plan_plain.workspace_bytes, 256);
  const uint64_t ws_default_size = std::max<uint64_t>(plan_default.workspace_bytes, 256);
  const uint64_t ws_graph_size = max_ws(plans8), ws_tuned_size = max_ws(plans8_tuned);
  void* ws_bf16 = have_bf16 ? arena.Alloc(ws_bf16_size) : nullptr;
  void* ws_plain = have_plain ? arena.Alloc(ws_plain_size) : nullptr;
  void* ws_default = have_default ? arena.Alloc(ws_default_size) : nullptr;
  void* ws_graph = have_graph ? arena.Alloc(ws_graph_size) : nullptr;
  void* ws_tuned = have_tuned ? arena.Alloc(ws_tuned_size) : nullptr;
  CHECK_CUDA(cudaStreamSynchronize(stream_));

  // fp8_graph_tuned: the autotune runs inside each plan's first Run, untimed here.
  for (int i = 0; i < nsets && have_tuned; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = tuned_->Run(plans8_tuned[i], sets[i].E4M3(), sets[i].graph_in, ws_tuned,
                                  ws_tuned_size, stream_);
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) {
      SkipImpl(bs, "fp8_graph_tuned", "first (autotuning) Run: " + st.ToString());
      have_tuned = false;
      break;
    }
    const attn::kernels::CudnnCounters counters = tuned_->counters();
    out_->Emit("{\"record\":\"autotune\",\"shape\":\"" + bs.Name() + "\",\"set\":" +
               std::to_string(i) + ",\"first_run_seconds\":" + Num(seconds) +
               ",\"engine\":\"" + JsonEscape(tuned_->EngineName(plans8_tuned[i])) +
               "\",\"engines_built\":" + std::to_string(tuned_->EngineCount(plans8_tuned[i])) +
               ",\"autotuned_total\":" + std::to_string(counters.autotuned) +
               ",\"autotune_failures_total\":" + std::to_string(counters.autotune_failures) +
               "}");
  }

  std::vector<Impl> impls;
  cudaStream_t stream = stream_;
  auto add = [&impls](const std::string& name, const std::string& detail, Output output,
                      double tol, std::function<void(int)> run) {
    Impl im;
    im.name = name;
    im.detail = detail;
    im.output = output;
    im.tol = tol;
    im.run = std::move(run);
    impls.push_back(std::move(im));
  };
  CudnnFp8Inputs to_bf16;
  to_bf16.out_dtype = DType::kBFloat16;
  if (have_bf16) {
    add("cudnn", plan_bf16.Describe(), Output::kBf16, kCudnnTol, [&, ws_bf16](int i) {
      CHECK_OK(cudnn_->Run(plan_bf16, sets[i].Bf16(), CudnnFp8Inputs{}, ws_bf16, ws_bf16_size,
                           stream));
    });
  }
  if (have_graph) {
    add("fp8_graph",
        plans8[0].Describe() + " (e4m3 in/out) engine " + cudnn_->EngineName(plans8[0]),
        Output::kE4M3, 0,
        [&, ws_graph](int i) {
          CHECK_OK(cudnn_->Run(plans8[i], sets[i].E4M3(), sets[i].graph_in, ws_graph,
                               ws_graph_size, stream));
        });
  }
  if (have_tuned) {
    add("fp8_graph_tuned",
        plans8_tuned[0].Describe() + " (e4m3 in/out) autotuned engine " +
            tuned_->EngineName(plans8_tuned[0]) + " of " +
            std::to_string(tuned_->EngineCount(plans8_tuned[0])),
        Output::kE4M3, 0, [&, ws_tuned](int i) {
          CHECK_OK(tuned_->Run(plans8_tuned[i], sets[i].E4M3(), sets[i].graph_in, ws_tuned,
                               ws_tuned_size, stream));
        });
  }
  if (have_plain) {
    add("fp8_plain", plan_plain.Describe() + " + " + attn::kernels::Fp8RecipeName(s_plain.fp8),
        Output::kBf16, kPlainTol, [&, ws_plain](int i) {
          CHECK_OK(cudnn_->Run(plan_plain, sets[i].Bf16(), to_bf16, ws_plain, ws_plain_size,
                               stream));
        });
  }
  if (have_default) {
    add("fp8_default",
        plan_default.Describe() + " + " + attn::kernels::Fp8RecipeName(s_default.fp8),
        Output::kBf16, kFp8Tol, [&, ws_default](int i) {
          CHECK_OK(cudnn_->Run(plan_default, sets[i].Bf16(), to_bf16, ws_default,
                               ws_default_size, stream));
        });
  }
  const double prepass_bytes = 2.0 * static_cast<double>(nq + 2 * nkv);
  add("prepass_plain", "Fp8Prepass " + attn::kernels::Fp8RecipeName(s_plain.fp8), Output::kNone,
      0, [&, pws_plain, pws_plain_size](int i) {
        const IoSet& st = sets[i];
        CHECK_OK(Fp8Prepass(s_plain, st.Bf16(), st.scratch_q8, st.scratch_k8, st.scratch_v8,
                            st.scratch_scalars, pws_plain, pws_plain_size, stream));
      });
  impls.back().bytes = prepass_bytes;
  add("prepass_default", "Fp8Prepass " + attn::kernels::Fp8RecipeName(s_default.fp8),
      Output::kNone, 0, [&, pws_default, pws_default_size](int i) {
        const IoSet& st = sets[i];
        CHECK_OK(Fp8Prepass(s_default, st.Bf16(), st.scratch_q8, st.scratch_k8, st.scratch_v8,
                            st.scratch_scalars, pws_default, pws_default_size, stream));
      });
  impls.back().bytes = prepass_bytes;
  // One measure at a time: what the rotation and the smoothing each cost.
  attn::kernels::AttentionShape s_rotate = s_default, s_smooth = s_default;
  s_rotate.fp8.smooth_k = false;
  s_smooth.fp8.rotate = false;
  add("prepass_rotate", "Fp8Prepass " + attn::kernels::Fp8RecipeName(s_rotate.fp8),
      Output::kNone, 0, [&, s_rotate, pws_plain, pws_plain_size](int i) {
        const IoSet& st = sets[i];
        CHECK_OK(Fp8Prepass(s_rotate, st.Bf16(), st.scratch_q8, st.scratch_k8, st.scratch_v8,
                            st.scratch_scalars, pws_plain, pws_plain_size, stream));
      });
  impls.back().bytes = prepass_bytes;
  add("prepass_smooth", "Fp8Prepass " + attn::kernels::Fp8RecipeName(s_smooth.fp8),
      Output::kNone, 0, [&, s_smooth, pws_default, pws_default_size](int i) {
        const IoSet& st = sets[i];
        CHECK_OK(Fp8Prepass(s_smooth, st.Bf16(), st.scratch_q8, st.scratch_k8, st.scratch_v8,
                            st.scratch_scalars, pws_default, pws_default_size, stream));
      });
  impls.back().bytes = prepass_bytes;

  // 1. correctness, 2. timing, then the records.
  const bool passed = CheckAll(bs, s, seed, sets, &impls);
  TimeAll(&impls, nsets, opt_, stream_);
  EmitResults(bs, nsets, impls);
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  return passed;
}

bool Bench::CheckAll(const BenchShape& bs, const AttentionShape& s, uint64_t seed,
                     const std::vector<IoSet>& sets, std::vector<Impl>* impls) {
  using attn::kernels::Bf16ToFloat;
  const uint64_t nq = s.q_elements(), nkv = s.kv_elements();
  const std::vector<Row> rows = SampleRows(bs, seed);
  std::vector<uint16_t> hq(nq), hk(nkv), hv(nkv), out16(nq);
  std::vector<uint8_t> out8(nq);
  const IoSet& set0 = sets[0];
  const InputKind kinds[] = {InputKind::kNormal, InputKind::kOutlier, InputKind::kKbias};
  const char* const columns[] = {"cudnn", "fp8_plain", "fp8_default"};
  bool passed = true;
  std::vector<std::string> table;
  char line[256];
  std::snprintf(line, sizeof(line), "  %-8s %12s %12s %12s", "kind", columns[0], columns[1],
                columns[2]);
  table.push_back(line);
  for (InputKind kind : kinds) {
    if (kind != InputKind::kNormal) FillSet(set0, s, seed, 0, kind, stream_);
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    CHECK_CUDA(cudaMemcpy(hq.data(), set0.q, 2 * nq, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hk.data(), set0.k, 2 * nkv, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hv.data(), set0.v, 2 * nkv, cudaMemcpyDeviceToHost));
    const std::vector<double> ref = ReferenceRows(s, hq, hk, hv, rows);
    std::string cells[3] = {"-", "-", "-"};
    for (Impl& im : *impls) {
      if (im.output == Output::kNone) continue;
      // fp8_graph's E4M3 inputs come from set 0's normal inputs: checked on those only.
      if (im.tol == 0 && kind != InputKind::kNormal) continue;
      const bool bf16 = im.output == Output::kBf16;
      void* o = bf16 ? set0.o : set0.o8;
      const uint64_t o_bytes = bf16 ? 2 * nq : nq;
      CHECK_CUDA(cudaMemsetAsync(o, 0xFF, o_bytes, stream_));  // NaN in bf16 and in E4M3
      im.run(0);
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      ErrorStats e;
      if (bf16) {
        CHECK_CUDA(cudaMemcpy(out16.data(), o, o_bytes, cudaMemcpyDeviceToHost));
        e = Compare(s, rows, ref, [&](int64_t i) { return Bf16ToFloat(out16[i]); });
      } else {
        CHECK_CUDA(cudaMemcpy(out8.data(), o, o_bytes, cudaMemcpyDeviceToHost));
        const float descale = set0.graph_in.v_descale;
        e = Compare(s, rows, ref, [&](int64_t i) { return e4m3_[out8[i]] * descale; });
      }
      const bool gated = im.tol > 0;
      const bool ok = !e.nan && e.rel_l2 <= im.tol;  // NaN rel_l2 fails
      if (gated) {
        im.passed = im.passed && ok;
        passed = passed && ok;
      }
      if (kind == InputKind::kNormal) im.rel_l2 = e.rel_l2;
      std::ostringstream os;
      os << "{\"record\":\"check\",\"shape\":\"" << bs.Name() << "\",\"kind\":\""
         << KindName(kind) << "\",\"impl\":\"" << im.name << "\",\"rows\":" << rows.size()
         << ",\"rel_l2\":" << Num(e.rel_l2) << ",\"worst_row\":" << Num(e.worst_row)
         << ",\"nan\":" << (e.nan ? "true" : "false") << ",\"gated\":"
         << (gated ? "true" : "false");
      if (gated) os << ",\"tol\":" << Num(im.tol) << ",\"passed\":" << (ok ? "true" : "false");
      os << "}";
      out_->Emit(os.str());
      for (int c = 0; c < 3; ++c) {
        if (im.name != columns[c]) continue;
        char cell[64];
        std::snprintf(cell, sizeof(cell), "%.3g%s%s", e.rel_l2, e.nan ? " NaN" : "",
                      ok ? "" : " FAIL");
        cells[c] = cell;
      }
    }
    std::snprintf(line, sizeof(line), "  %-8s %12s %12s %12s", KindName(kind), cells[0].c_str(),
                  cells[1].c_str(), cells[2].c_str());
    table.push_back(line);
  }
  FillSet(set0, s, seed, 0, InputKind::kNormal, stream_);  // timing uses normal inputs
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  std::snprintf(line, sizeof(line),
                "%s errors: rel L2 of %d rows vs float64 (gates: cudnn %.2g, fp8_* %.2g)",
                bs.Name().c_str(), kSampledRows, kCudnnTol, kFp8Tol);
  report_.push_back(line);
  report_.insert(report_.end(), table.begin(), table.end());
  return passed;
}

void Bench::EmitResults(const BenchShape& bs, int nsets, const std::vector<Impl>& impls) {
  auto find = [&impls](const char* name) -> const Impl* {
    for (const Impl& im : impls) {
      if (im.name == name) return &im;
    }
    return nullptr;
  };
  const Impl* base = find("cudnn");
  const double base_ms = base ? Median(base->rep_ms) : NAN;
  char line[320];
  std::snprintf(line, sizeof(line), "%s timing (median of %d repeats, %d buffer sets)",
                bs.Name().c_str(), opt_.reps, nsets);
  report_.push_back(line);
  for (const Impl& im : impls) {
    const double ms = Median(im.rep_ms);
    const double rate = im.bytes > 0 ? im.bytes / (ms * 1e-3) / 1e9 : bs.Flops() / (ms * 1e-3) / 1e12;
    const double ratio = base_ms / ms;
    std::ostringstream os;
    os << "{\"record\":\"result\",\"shape\":\"" << bs.Name() << "\",\"B\":" << bs.B
       << ",\"N\":" << bs.N << ",\"K\":" << bs.K << ",\"H\":" << bs.H << ",\"T\":" << bs.T
       << ",\"S\":" << bs.S << ",\"causal\":" << (bs.causal ? "true" : "false")
       << ",\"impl\":\"" << im.name << "\",\"detail\":\"" << JsonEscape(im.detail)
       << "\",\"ms\":" << Num(ms) << (im.bytes > 0 ? ",\"gb_per_s\":" : ",\"tflops\":")
       << Num(rate) << ",\"flops\":" << Num(bs.Flops()) << ",\"ratio_vs_cudnn\":" << Num(ratio);
    if (im.output != Output::kNone) os << ",\"rel_l2\":" << Num(im.rel_l2);
    if (im.tol > 0) os << ",\"passed\":" << (im.passed ? "true" : "false");
    os << ",\"iters\":" << im.iters << ",\"buffer_sets\":" << nsets << ",\"reps_ms\":[";
    for (size_t i = 0; i < im.rep_ms.size(); ++i) os << (i ? "," : "") << Num(im.rep_ms[i]);
    os << "]}";
    out_->Emit(os.str());
    std::string err = "";
    if (im.output != Output::kNone) {
      char e[64];
      std::snprintf(e, sizeof(e), "  err %.3g%s%s", im.rel_l2, im.tol > 0 ? "" : " (info)",
                    im.passed ? "" : "  FAILED");
      err = e;
    }
    std::snprintf(line, sizeof(line), "  %-16s %9.3f ms  %8.1f %-7s  x%.2f vs cudnn%s",
                  im.name.c_str(), ms, rate, im.bytes > 0 ? "GB/s" : "TFLOP/s", ratio,
                  err.c_str());
    report_.push_back(line);
  }
  const Impl* graph = find("fp8_graph");
  const Impl* tuned = find("fp8_graph_tuned");
  if (graph && tuned) {
    const double g = Median(graph->rep_ms), t = Median(tuned->rep_ms);
    out_->Emit("{\"record\":\"tuned_vs_graph\",\"shape\":\"" + bs.Name() +
               "\",\"tuned_over_graph_ms\":" + Num(t / g) + ",\"tuned_speedup\":" + Num(g / t) +
               "}");
    std::snprintf(line, sizeof(line),
                  "  fp8_graph_tuned / fp8_graph = %.3f (time; autotuned graph %.2fx as fast)",
                  t / g, g / t);
    report_.push_back(line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = Parse(argc, argv);
  JsonLines out(opt.out);
  int count = 0;
  const cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Skip(&out, std::string("no CUDA device (") +
                          (ce != cudaSuccess ? cudaGetErrorString(ce) : "device count 0") + ")");
  }
  const int device = 0;
  CHECK_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const int cc = prop.major * 10 + prop.minor;
  auto device_record = [&](const CudnnAttention* c) {
    std::ostringstream os;
    os << "{\"record\":\"device\",\"bench\":\"attn_cudnn_fp8_bench\",\"device\":\""
       << JsonEscape(prop.name) << "\",\"cc\":" << cc << ",\"sm_count\":"
       << prop.multiProcessorCount << ",\"l2_bytes\":" << prop.l2CacheSize;
    if (c != nullptr) {
      os << ",\"cudnn_runtime_version\":" << c->runtime_version()
         << ",\"cudnn_build_version\":" << CudnnAttention::BuildVersion()
         << ",\"cudnn_library\":\"" << JsonEscape(c->library_path()) << "\"";
    }
    os << "}";
    out.Emit(os.str());
  };
  if (cc < 90) {
    device_record(nullptr);
    return Skip(&out, "device " + std::string(prop.name) + " is sm_" + std::to_string(cc) +
                          "; cuDNN FP8 SDPA needs sm_90 (Hopper) or newer");
  }
  StatusOr<std::unique_ptr<CudnnAttention>> created =
      CudnnAttention::Create(device, attn::kernels::CudnnOptions{});
  if (!created.ok()) {
    device_record(nullptr);
    return Skip(&out, "cuDNN cannot be loaded: " + created.status().ToString());
  }
  std::unique_ptr<CudnnAttention> cudnn = std::move(*created);
  attn::kernels::CudnnOptions tuned_options;
  tuned_options.autotune = true;
  StatusOr<std::unique_ptr<CudnnAttention>> created_tuned =
      CudnnAttention::Create(device, tuned_options);
  std::unique_ptr<CudnnAttention> tuned;
  std::string tuned_why;
  if (created_tuned.ok()) {
    tuned = std::move(*created_tuned);
  } else {
    tuned_why = "CudnnAttention::Create(autotune): " + created_tuned.status().ToString();
  }
  device_record(cudnn.get());

  bool all_passed = true;
  {
    Bench bench(opt, prop, cudnn.get(), tuned.get(), tuned_why, &out);
    for (size_t i = 0; i < opt.shapes.size(); ++i) {
      std::fprintf(stderr, "[%zu/%zu] %s\n", i + 1, opt.shapes.size(),
                   opt.shapes[i].Name().c_str());
      all_passed = bench.RunShape(opt.shapes[i], 20000 + 1000 * static_cast<uint64_t>(i)) &&
                   all_passed;
    }
    std::fprintf(stderr, "\n");
    for (const std::string& l : bench.report()) std::fprintf(stderr, "%s\n", l.c_str());
  }
  std::fprintf(stderr, "correctness: %s\n",
               all_passed ? "all gated checks passed" : "FAILURES (see the check records)");
  out.Emit(std::string("{\"record\":\"done\",\"all_checks_passed\":") +
           (all_passed ? "true" : "false") + "}");
  return all_passed ? 0 : 1;
}

#else  // !ATTN_BENCH_HAVE_CUDNN

int main(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--out=", 0) == 0) path = a.substr(6);
  }
  JsonLines out(path);
#if defined(ATTN_CUDNN_UNAVAILABLE_REASON)
  return Skip(&out, std::string("built without cuDNN: ") + ATTN_CUDNN_UNAVAILABLE_REASON);
#else
  return Skip(&out, "built without cuDNN (ATTN_HAVE_CUDNN undefined)");
#endif
}

#endif  // ATTN_BENCH_HAVE_CUDNN
