// The CPU reference for attention (DESIGN.md §4): float64 accumulation, threaded over
// (batch entry, query head) work items.
//
// Every semantic comes from attention_problem.h: the mask is BandKeyRange() only, lengths come
// from LengthOr() (padded) or the varlen offsets/lengths, and head h reads KV head h / (N / K).
// For each query row the band [lo, hi] is visited once to form the scaled logits in double,
// then the row max, the sum of exponentials and the weighted sum of V are taken in double
// (a two-pass, numerically stable softmax). Keys outside the band are never touched, so causal
// costs about half of dense.
//
// Results do not depend on the thread count: each work item is computed by exactly one thread
// with a fixed summation order, so 1 and 64 threads give bitwise-equal outputs.

#include "attn/kernels/cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "attn/kernels/host_dtype.h"

namespace attn::kernels {
namespace {

/// Where the results go: either the input dtype + float32 lse (CpuAttention) or float64
/// buffers (CpuAttentionF64). Exactly one of `o` / `o64` is set; lse pointers may be null.
struct OutputSink {
  void* o = nullptr;        ///< q's layout, shape.dtype elements
  double* o64 = nullptr;    ///< q's layout, double elements
  float* lse = nullptr;     ///< lse layout, float32
  double* lse64 = nullptr;  ///< lse layout, double
};

/// The rows one batch entry owns, resolved from the layout (padded or varlen).
struct EntryRows {
  int64_t q_row0 = 0;    ///< first row of q/o owned by the entry
  int64_t kv_row0 = 0;   ///< first row of k/v owned by the entry
  int64_t q_len = 0;     ///< T_b
  int64_t kv_len = 0;    ///< S_b
  int64_t q_extent = 0;  ///< rows of o the entry owns: T (padded) or T_b (varlen)
};

bool IsSupportedDType(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

std::string Str(int64_t v) { return std::to_string(v); }

/// Rounds `d` to float with round-to-odd: the truncated value with its last bit forced to 1
/// when `d` is not exactly representable. A later round-to-nearest-even from this float to a
/// format with at least 2 fewer significand bits (fp16: 11, bf16: 8, versus float's 24) then
/// equals rounding `d` directly, so the output is rounded once from float64 (no double
/// rounding at ties).
float RoundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  // Make f the value truncated toward zero (inf becomes the largest finite float).
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return BitsFloat(FloatBits(f) | 1u);
}

/// Stores `value` into element `i` of a `dtype` buffer, rounded once from double.
void StoreFromDouble(void* data, DType dtype, int64_t i, double value) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(data)[i] = static_cast<float>(value);
  } else {
    StoreFromFloat(data, dtype, i, RoundToOddFloat(value));
  }
}

/// Validates the per-entry lengths and varlen offsets against the shape.
Status ValidateLengths(const AttentionShape& s, const AttentionTensors& t) {
  const bool varlen = s.layout == Layout::kVarlen;
  if (varlen) {
    if (t.q_lengths == nullptr || t.kv_lengths == nullptr) {
      return InvalidArgument("cpu reference: varlen layout needs q_lengths and kv_lengths");
    }
    if (t.q_offsets == nullptr || t.kv_offsets == nullptr) {
      return InvalidArgument("cpu reference: varlen layout needs q_offsets and kv_offsets");
    }
    if (t.q_offsets[0] != 0 || t.kv_offsets[0] != 0) {
      return InvalidArgument(
          "cpu reference: varlen offsets must start at 0 (exclusive prefix sum)");
    }
  }
  if (!varlen && !s.has_lengths) return Status::Ok();  // full extents, pointers unused
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t tq = LengthOr(t.q_lengths, b, s.max_q_len);
    const int64_t tk = LengthOr(t.kv_lengths, b, s.max_kv_len);
    if (tq < 0 || tq > s.max_q_len) {
      return InvalidArgument("cpu reference: q_lengths[" + Str(b) + "] = " + Str(tq) +
                             " outside [0, max_q_len = " + Str(s.max_q_len) + "]");
    }
    if (tk < 0 || tk > s.max_kv_len) {
      return InvalidArgument("cpu reference: kv_lengths[" + Str(b) + "] = " + Str(tk) +
                             " outside [0, max_kv_len = " + Str(s.max_kv_len) + "]");
    }
    if (varlen) {
      if (t.q_offsets[b + 1] - t.q_offsets[b] != tq) {
        return InvalidArgument("cpu reference: q_offsets[" + Str(b + 1) + "] - q_offsets[" +
                               Str(b) + "] != q_lengths[" + Str(b) + "]");
      }
      if (t.kv_offsets[b + 1] - t.kv_offsets[b] != tk) {
        return InvalidArgument("cpu reference: kv_offsets[" + Str(b + 1) + "] - kv_offsets[" +
                               Str(b) + "] != kv_lengths[" + Str(b) + "]");
      }
    }
  }
  if (varlen) {
    if (t.q_offsets[s.batch] != s.total_q) {
      return InvalidArgument("cpu reference: q_offsets[B] = " + Str(t.q_offsets[s.batch]) +
                             " != total_q = " + Str(s.total_q));
    }
    if (t.kv_offsets[s.batch] != s.total_kv) {
      return InvalidArgument("cpu reference: kv_offsets[B] = " + Str(t.kv_offsets[s.batch]) +
                             " != total_kv = " + Str(s.total_kv));
    }
  }
  return Status::Ok();
}

/// Rows owned by batch entry `b` (lengths already validated).
EntryRows RowsOf(const AttentionShape& s, const AttentionTensors& t, int64_t b) {
  EntryRows r;
  if (s.layout == Layout::kVarlen) {
    r.q_row0 = t.q_offsets[b];
    r.kv_row0 = t.kv_offsets[b];
    r.q_len = t.q_lengths[b];
    r.kv_len = t.kv_lengths[b];
    r.q_extent = r.q_len;
  } else {
    r.q_row0 = b * s.max_q_len;
    r.kv_row0 = b * s.max_kv_len;
    r.q_len = s.has_lengths ? LengthOr(t.q_lengths, b, s.max_q_len) : s.max_q_len;
    r.kv_len = s.has_lengths ? LengthOr(t.kv_lengths, b, s.max_kv_len) : s.max_kv_len;
    r.q_extent = s.max_q_len;
  }
  return r;
}

/// Index of lse for (entry rows r, head h, row i): (B, N, T) padded, (N, total_q) varlen.
int64_t LseIndex(const AttentionShape& s, const EntryRows& r, int64_t b, int64_t h, int64_t i) {
  if (s.layout == Layout::kVarlen) return h * s.total_q + r.q_row0 + i;
  return (b * s.num_heads + h) * s.max_q_len + i;
}

/// Per-thread scratch, reused across work items.
struct Scratch {
  std::vector<double> k;       ///< (S_b, H) keys of the KV head, in double
  std::vector<double> v;       ///< (S_b, H) values of the KV head, in double
  std::vector<double> q;       ///< (H) current query row
  std::vector<double> logits;  ///< (S_b) scaled logits of the current row's band
  std::vector<double> acc;     ///< (H) weighted sum of V
};

/// Multiply-adds (roughly) between two StopCheck calls.
constexpr int64_t kStopCheckWork = int64_t{1} << 20;

/// Cancellation shared by the threads of one call: `check` is asked once per chunk of work;
/// once it said stop, `stopped` tells every thread.
struct StopState {
  const StopCheck* check = nullptr;  ///< null or empty: never stops
  std::atomic<bool> stopped{false};
  /// Called by a thread after `work` more multiply-adds; true when the call must stop.
  bool Poll(int64_t* work) {
    if (check == nullptr || !*check) return false;
    if (stopped.load(std::memory_order_relaxed)) return true;
    if (*work < kStopCheckWork) return false;
    *work = 0;
    if ((*check)()) stopped.store(true);
    return stopped.load(std::memory_order_relaxed);
  }
};

/// Computes one (batch entry b, query head h) work item: every row of o and lse it owns.
/// Returns early (rows left unwritten) when `stop` says so.
void RunWorkItem(const AttentionShape& s, const AttentionTensors& t, const OutputSink& out,
                 int64_t b, int64_t h, Scratch* sc, StopState* stop, int64_t* work) {
  const EntryRows r = RowsOf(s, t, b);
  const int64_t H = s.head_dim;
  const int64_t N = s.num_heads;
  const int64_t K = s.num_kv_heads;
  const int64_t kv_head = h / (N / K);
  const double scale = static_cast<double>(s.scale);

  // Which keys any row of this entry can see: convert only those K/V rows to double.
  int64_t need_lo = r.kv_len;
  int64_t need_hi = -1;
  for (int64_t i = 0; i < r.q_len; ++i) {
    const KeyRange kr = BandKeyRange(s.mask, i, r.q_len, r.kv_len);
    if (kr.empty()) continue;
    need_lo = std::min(need_lo, kr.lo);
    need_hi = std::max(need_hi, kr.hi);
  }
  if (need_hi >= need_lo) {
    sc->k.resize(static_cast<size_t>(r.kv_len * H));
    sc->v.resize(static_cast<size_t>(r.kv_len * H));
    for (int64_t j = need_lo; j <= need_hi; ++j) {
      const int64_t src = ((r.kv_row0 + j) * K + kv_head) * H;
      for (int64_t d = 0; d < H; ++d) {
        sc->k[j * H + d] = LoadAsFloat(t.k, s.dtype, src + d);
        sc->v[j * H + d] = LoadAsFloat(t.v, s.dtype, src + d);
      }
    }
    sc->logits.resize(static_cast<size_t>(r.kv_len));
  }
  sc->q.resize(static_cast<size_t>(H));
  sc->acc.resize(static_cast<size_t>(H));

  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < r.q_extent; ++i) {
    if (stop->Poll(work)) return;
    const int64_t o_base = ((r.q_row0 + i) * N + h) * H;
    // Rows past T_b (padding) and rows with no key in their band: zeros and lse = -inf.
    const KeyRange kr = BandKeyRange(s.mask, i, r.q_len, r.kv_len);
    double lse = neg_inf;
    if (kr.empty()) {
      std::fill(sc->acc.begin(), sc->acc.end(), 0.0);
    } else {
      for (int64_t d = 0; d < H; ++d) sc->q[d] = LoadAsFloat(t.q, s.dtype, o_base + d);
      // Pass 1: scaled logits over the band and their max.
      double m = neg_inf;
      for (int64_t j = kr.lo; j <= kr.hi; ++j) {
        const double* kj = &sc->k[j * H];
        double dot = 0.0;
        for (int64_t d = 0; d < H; ++d) dot += sc->q[d] * kj[d];
        const double logit = scale * dot;
        sc->logits[j] = logit;
        m = std::max(m, logit);
      }
      // Pass 2: p_j = exp(logit_j - m) (all <= 1, the max is exactly 1), sum and Σ p_j v_j.
      std::fill(sc->acc.begin(), sc->acc.end(), 0.0);
      double sum = 0.0;
      for (int64_t j = kr.lo; j <= kr.hi; ++j) {
        const double p = std::exp(sc->logits[j] - m);
        sum += p;
        const double* vj = &sc->v[j * H];
        for (int64_t d = 0; d < H; ++d) sc->acc[d] += p * vj[d];
      }
      *work += (kr.hi - kr.lo + 1) * (2 * H + 8);  // two dot/axpy passes plus exp per key
      const double inv = 1.0 / sum;  // sum >= 1, never 0
      for (int64_t d = 0; d < H; ++d) sc->acc[d] *= inv;
      lse = m + std::log(sum);
    }
    for (int64_t d = 0; d < H; ++d) {
      if (out.o64 != nullptr) {
        out.o64[o_base + d] = sc->acc[d];
      } else {
        StoreFromDouble(out.o, s.dtype, o_base + d, sc->acc[d]);
      }
    }
    if (out.lse != nullptr || out.lse64 != nullptr) {
      const int64_t li = LseIndex(s, r, b, h, i);
      if (out.lse != nullptr) out.lse[li] = static_cast<float>(lse);
      if (out.lse64 != nullptr) out.lse64[li] = lse;
    }
  }
}

/// Validates everything, then runs all (b, h) work items on up to `num_threads` threads.
Status Run(const AttentionShape& s, const AttentionTensors& t, const OutputSink& out,
           int num_threads, const StopCheck& should_stop) {
  ATTN_RETURN_IF_ERROR(CpuSupports(s));
  // Buffers may be null only when they hold no elements (e.g. every kv length is 0).
  const bool has_q = s.q_elements() > 0;
  if ((has_q && t.q == nullptr) || (s.kv_elements() > 0 && (t.k == nullptr || t.v == nullptr))) {
    return InvalidArgument("cpu reference: q, k and v must be non-null");
  }
  if (has_q && out.o == nullptr && out.o64 == nullptr) {
    return InvalidArgument("cpu reference: output o must be non-null");
  }
  ATTN_RETURN_IF_ERROR(ValidateLengths(s, t));

  const int64_t items = s.batch * s.num_heads;
  if (items == 0) return Status::Ok();
  int64_t threads =
      num_threads > 0 ? num_threads : static_cast<int64_t>(std::thread::hardware_concurrency());
  threads = std::max<int64_t>(1, std::min(threads, items));

  StopState stop;
  stop.check = &should_stop;
  try {
    std::atomic<int64_t> next{0};
    auto worker = [&]() {
      Scratch scratch;
      int64_t work = 0;
      for (int64_t w = next.fetch_add(1); w < items && !stop.stopped.load();
           w = next.fetch_add(1)) {
        RunWorkItem(s, t, out, w / s.num_heads, w % s.num_heads, &scratch, &stop, &work);
      }
    };
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads - 1));
    try {
      for (int64_t i = 1; i < threads; ++i) pool.emplace_back(worker);
    } catch (const std::system_error&) {
      // Could not start more threads: the ones running plus this one finish the work.
    }
    worker();
    for (std::thread& th : pool) th.join();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("cpu reference: out of host memory for scratch buffers");
  } catch (const std::exception& e) {
    return Internal(std::string("cpu reference: ") + e.what());
  }
  if (stop.stopped.load()) {
    return Status(StatusCode::kCancelled, "cpu reference: stopped before the end (caller gone)");
  }
  return Status::Ok();
}

}  // namespace

Status CpuSupports(const AttentionShape& s) {
  if (!IsSupportedDType(s.dtype)) {
    return InvalidArgument(std::string("cpu reference: dtype ") + DTypeName(s.dtype) +
                           " is not supported (float32, float16, bfloat16 only)");
  }
  if (s.layout != Layout::kPadded && s.layout != Layout::kVarlen) {
    return InvalidArgument("cpu reference: unknown layout " + Str(static_cast<int>(s.layout)));
  }
  if (s.mask.causal != CausalAlignment::kNone && s.mask.causal != CausalAlignment::kTopLeft &&
      s.mask.causal != CausalAlignment::kBottomRight) {
    return InvalidArgument("cpu reference: unknown causal alignment " +
                           Str(static_cast<int>(s.mask.causal)));
  }
  if (s.num_heads <= 0 || s.num_kv_heads <= 0) {
    return InvalidArgument("cpu reference: num_heads (" + Str(s.num_heads) +
                           ") and num_kv_heads (" + Str(s.num_kv_heads) + ") must be positive");
  }
  if (s.num_heads % s.num_kv_heads != 0) {
    return InvalidArgument("cpu reference: num_heads (" + Str(s.num_heads) +
                           ") must be a multiple of num_kv_heads (" + Str(s.num_kv_heads) + ")");
  }
  if (s.head_dim <= 0) {
    return InvalidArgument("cpu reference: head_dim (" + Str(s.head_dim) + ") must be positive");
  }
  if (s.batch < 0 || s.max_q_len < 0 || s.max_kv_len < 0) {
    return InvalidArgument("cpu reference: batch, max_q_len and max_kv_len must be >= 0");
  }
  if (s.layout == Layout::kVarlen && (s.total_q < 0 || s.total_kv < 0)) {
    return InvalidArgument("cpu reference: varlen total_q and total_kv must be >= 0");
  }
  if (!std::isfinite(s.scale) || s.scale == 0.f) {
    return InvalidArgument(
        "cpu reference: scale must be finite and non-zero (callers resolve "
        "the default 1/sqrt(head_dim) first)");
  }
  return Status::Ok();
}

Status CpuAttention(const AttentionShape& shape, const AttentionTensors& t, int num_threads,
                    const StopCheck& should_stop) {
  if (shape.return_lse && t.lse == nullptr && shape.lse_elements() > 0) {
    return InvalidArgument("cpu reference: return_lse is set but lse is null");
  }
  OutputSink out;
  out.o = t.o;
  out.lse = shape.return_lse ? t.lse : nullptr;
  return Run(shape, t, out, num_threads, should_stop);
}

Status CpuAttentionF64(const AttentionShape& shape, const AttentionTensors& t, double* o,
                       double* lse, int num_threads) {
  if (o == nullptr && shape.q_elements() > 0) {
    return InvalidArgument("cpu reference: float64 output o must be non-null");
  }
  OutputSink out;
  out.o64 = o;
  out.lse64 = lse;
  return Run(shape, t, out, num_threads, StopCheck{});
}

}  // namespace attn::kernels
