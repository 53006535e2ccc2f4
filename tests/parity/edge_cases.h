// Edge cases drawn from public bug reports of other attention libraries (issue 14), as
// parity-harness cases every family runs (DESIGN.md §4):
//   - large magnitudes: every element of q, k, v equal to a large constant (bf16 133120, fp16
//     200, fp32 1e6) with S = 1 (the output must be v exactly: the runner's exact_single_key
//     check), S = 2 and S = 128 (k constant, v random normal);
//   - very negative finite logits (q = +C, k = −C + noise);
//   - NaN and ±Inf in K and V at keys that some rows cannot see: causally masked (top-left and
//     bottom-right, one tile and several), outside a sliding window, past kv_lengths (padding);
//     rows that cannot see them must equal the reference, rows that can must be non-finite;
//   - single-key rows (S = 1; causal row 0);
//   - very wide windows: 2^31, 2^32, 2^40 and INT64_MAX on both causal alignments and without
//     one, T ≠ S both ways (a window narrowed to 32 bits turns "unbounded" into 0 or negative).
#pragma once

#include <cstdint>
#include <vector>

#include "parity_harness.h"

namespace attn::parity {

struct EdgeOptions {
  std::vector<kernels::DType> dtypes{kernels::DType::kFloat16, kernels::DType::kBFloat16};
  std::vector<int64_t> head_dims{64};
  bool include_nonfinite = true;  ///< the NaN/±Inf rows (off for runners that document them)
  uint64_t seed = 4141;
};

/// The edge cases for every dtype × head dim of `options`.
std::vector<HostCase> EdgeCases(const EdgeOptions& options);

}  // namespace attn::parity
