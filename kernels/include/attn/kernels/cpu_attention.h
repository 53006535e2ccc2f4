// The CPU reference: every semantic of DESIGN.md §4, float64 accumulation, threaded.
//
// Inputs and outputs live in host memory with the layouts of attention_problem.h.
// Supported dtypes for q/k/v/o: kFloat32, kFloat16, kBFloat16. lse is float32.
// Thread-safety: reentrant; each call uses its own threads (up to `num_threads`, 0 = hardware).
#pragma once

#include <functional>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn::kernels {

/// Asked by the computing threads between chunks of rows (about every 2^20 multiply-adds, a
/// millisecond or so): returning true stops the computation, which returns CANCELLED with the
/// outputs partly written. Called concurrently from several threads: must be thread-safe and
/// cheap. Empty: never stops. The kernels know nothing of why (a client gone, a deadline).
using StopCheck = std::function<bool()>;

/// Checks that the CPU reference can run `shape` (dtype, head counts, sizes); reason if not.
Status CpuSupports(const AttentionShape& shape);

/// Computes attention into t.o (input dtype, rounded once from float64) and t.lse (float32, when
/// shape.return_lse). Rows past q_lengths[b] and rows with no key are zero (lse -inf).
/// Errors: INVALID_ARGUMENT if CpuSupports fails or a required pointer is null.
/// `should_stop` (may be empty): see StopCheck; when it says stop, returns CANCELLED.
Status CpuAttention(const AttentionShape& shape, const AttentionTensors& t, int num_threads = 0,
                    const StopCheck& should_stop = {});

/// Same computation with float64 outputs: `o` has q's layout (double), `lse` (nullable) has the
/// lse layout (double). Used as the parity harness's reference and by tests.
Status CpuAttentionF64(const AttentionShape& shape, const AttentionTensors& t, double* o,
                       double* lse, int num_threads = 0);

}  // namespace attn::kernels
