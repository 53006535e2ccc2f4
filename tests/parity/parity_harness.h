// The one parity harness (DESIGN.md §4, §10): runs a kernel family against the float64 CPU
// reference (CpuAttentionF64) over shapes × dtypes × masks × head groupings and hard inputs.
//
// A family plugs in through KernelRunner: it receives host inputs and must return host outputs,
// doing its own device allocation/copies. The harness owns input generation (fresh random
// normal per check, never zeros, plus hard sets), poisoning outputs before each run, and the
// tolerance checks:
//   ‖out − ref‖₂ / ‖ref‖₂ ≤ tol(dtype) (fp32 1e-5, fp16 2e-3, bf16 1e-2, fp8 6e-2);
//   no row's relative error worse than 5× tol; rows that see no key (or are padding) exactly 0;
//   lse within 1e-3 absolute plus 1e-6 of |lse| (float32 rounding of lse at large logits), and
//   -inf exactly where the reference is -inf; NaN never passes
//   where the reference is finite. Rows whose reference is non-finite (they see a key holding
//   NaN or ±Inf: edge_cases.h) must hold a non-finite element and are left out of the norms;
//   keys a row cannot see never make it non-finite in the reference.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn::parity {

using kernels::AttentionShape;

/// Host-side inputs of one case. Buffers hold elements of shape.dtype (q/k/v) as raw bytes.
struct HostCase {
  AttentionShape shape;
  std::vector<uint8_t> q, k, v;          ///< layouts of attention_problem.h
  std::vector<int32_t> q_lengths;        ///< (B) or empty
  std::vector<int32_t> kv_lengths;       ///< (B) or empty
  std::vector<int64_t> q_offsets;        ///< varlen: (B+1)
  std::vector<int64_t> kv_offsets;       ///< varlen: (B+1)
  std::string name;                      ///< human-readable description for failure messages
};

/// Host-side outputs. `o` has shape.dtype elements in q's layout; `lse` float32 (may be empty
/// when !shape.return_lse). The harness pre-fills both with a poison pattern.
struct HostOutputs {
  std::vector<uint8_t> o;
  std::vector<float> lse;
};

/// A kernel family under test.
struct KernelRunner {
  std::string name;
  /// Ok if the family can run the case; otherwise the reason (the case is then counted skipped).
  std::function<Status(const AttentionShape&)> supports;
  /// Runs the case; `out` arrives poisoned and sized.
  std::function<Status(const HostCase&, HostOutputs* out)> run;
  /// > 0: relative-error tolerance instead of ToleranceFor(shape.dtype), for runners whose
  /// inputs are narrower than shape.dtype (FP8 kernels fed the case's bf16/fp16 data: 6e-2).
  double tolerance = 0;
  /// > 0: lse absolute tolerance instead of 1e-3 (FP8 logits carry e4m3 rounding error).
  double lse_tolerance = 0;
  /// Rows that see exactly one key must return that key's value bit for bit (DESIGN.md §4:
  /// cpu, naive, fused and the paged kernels; not fp8, which quantises v, nor cuDNN).
  bool exact_single_key = false;
};

/// Kinds of input values.
enum class InputKind {
  kNormal,          ///< N(0, 1)
  kLogitsTimes8,    ///< q scaled by 8: sharp softmax
  kOutlierChannels, ///< a few head-dim channels ×20 in q and k (float32: two channels ×5,
                    ///< as larger logits are too ill-conditioned for its 1e-5 tolerance)
  kHuge,            ///< values near the dtype's large end (bounded so logits stay finite)
  kTiny,            ///< values ~1e-3 (fp16 subnormal neighbourhood for products)
  kKeyBias,         ///< k = N(0, 1) + 20 on three head-dim channels (a per-channel bias, as
                    ///< LLM key caches have; float32: +5 on two); not in StandardGrid
};
const char* InputKindName(InputKind kind);

/// Builds a case with fresh random inputs (seeded) for `shape`; lengths drawn when
/// shape.has_lengths or varlen (some zero-length kv entries when `allow_empty`).
HostCase MakeCase(const AttentionShape& shape, InputKind kind, uint64_t seed, bool allow_empty);

/// Result of checking one case.
struct CaseResult {
  std::string name;
  bool skipped = false;
  std::string skip_reason;
  bool passed = false;
  double rel_l2 = 0;         ///< ‖out − ref‖₂ / ‖ref‖₂
  double worst_row_rel = 0;  ///< worst per-row relative error
  double worst_lse_abs = 0;  ///< worst |lse − ref| beyond 1e-6 of |ref|
  std::string failure;       ///< first violated check, empty when passed
};

/// Tolerance for a dtype (DESIGN.md §4).
double ToleranceFor(kernels::DType dtype);

/// Runs `runner` on `c` and checks it against CpuAttentionF64.
CaseResult RunCase(const KernelRunner& runner, const HostCase& c);

/// The standard grid: shapes × dtypes × masks (none, top-left, bottom-right, windows) ×
/// groupings (K = N, N/4, 1) × padded/varlen × T≠S, T=1, non-multiple-of-tile lengths,
/// zero-length keys, and the hard input kinds. `dtypes` restricts the dtypes; `head_dims` the
/// head dims (empty = {64}).
struct GridOptions {
  std::vector<kernels::DType> dtypes{kernels::DType::kFloat32, kernels::DType::kFloat16,
                                     kernels::DType::kBFloat16};
  std::vector<int64_t> head_dims{64};
  bool include_varlen = true;
  bool include_hard_inputs = true;
  uint64_t seed = 1234;
};
std::vector<HostCase> StandardGrid(const GridOptions& options);

/// Runs every case; returns the results (skipped cases included).
std::vector<CaseResult> RunGrid(const KernelRunner& runner, const std::vector<HostCase>& cases);

/// Runs the cases `runner` supports and returns only their results; `*skipped` (if not null)
/// gets the number left out because `runner.supports` refused them.
std::vector<CaseResult> RunSupported(const KernelRunner& runner,
                                     const std::vector<HostCase>& cases, int* skipped);

/// "P passed, F failed (first failures: ...)" for a report line.
std::string Summarize(const std::vector<CaseResult>& results, int max_failures = 5);

/// Writes results as JSON lines-friendly text (one object per case) for records.
std::string ResultsToJson(const std::string& runner_name, const std::vector<CaseResult>& results);

}  // namespace attn::parity
