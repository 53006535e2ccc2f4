// Checks a server response against the float64 oracle with the DESIGN.md §4 metric.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/v1/attention.grpc.pb.h"

namespace attn::loadgen {

/// Relative L2 tolerance for an output dtype: fp32 1e-5, fp16 2e-3, bf16 1e-2, fp8 6e-2.
double ToleranceFor(attention::v1::DType dtype);

/// The relative L2 tolerance a verification uses: `requested` when > 0 (--tolerance, e.g. 0.06
/// for a backend computing in FP8 while its inputs and outputs are bf16), else
/// ToleranceFor(dtype).
double ResolveTolerance(double requested, attention::v1::DType dtype);

/// Largest accepted absolute lse error.
inline constexpr double kLseTolerance = 1e-3;

/// Result of comparing one output with its reference.
struct Comparison {
  bool pass = true;
  double rel_error = 0;  // ‖out − ref‖₂ / ‖ref‖₂ (inf on NaN/inf or nonzero masked rows)
  double worst_row_rel_error = 0;  // max over rows of the same metric per row
  int64_t bad_rows = 0;            // rows failing (row error > 5·tol, or masked row not zero)
  std::string detail;              // empty when pass, else the first reason
};

/// Compares `out` with `ref` (same size; rows of `row_len` contiguous values). Passes when the
/// whole-tensor relative error is <= tol, no row's relative error exceeds 5·tol, every row whose
/// reference is all zero (masked / padding) is exactly zero, and no value is NaN or inf.
Comparison CompareOutputs(const std::vector<double>& out, const std::vector<double>& ref,
                          int64_t row_len, double tol);

/// Compares lse values: each within `abs_tol` of the reference, −inf exactly where the
/// reference is −inf, never NaN. rel_error holds the largest absolute error.
Comparison CompareLse(const std::vector<double>& lse, const std::vector<double>& ref,
                      double abs_tol);

/// Verifies `response` to the PADDED `request`: decodes q, k, v and the mask, runs the oracle on
/// the exact (dtype-rounded) inputs, decodes o (and lse when requested) and compares them.
/// o passes within ResolveTolerance(tolerance, q's dtype) (relative L2; 0: the dtype's), lse
/// within kLseTolerance whatever `tolerance` says. A response of the wrong dtype/shape/size fails
/// with the reason in `detail`.
Comparison VerifyAttend(const attention::v1::AttendRequest& request,
                        const attention::v1::AttendResponse& response, double tolerance);

}  // namespace attn::loadgen
