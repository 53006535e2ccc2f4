// `auto` from measurement (DESIGN.md §5): shape buckets, the calibration table (the fastest
// backend per bucket that passed parity), its JSON file format, and the calibration grid.
// Everything here is pure (no device, no backends): calibration_runner.h times real backends
// and feeds the samples to SelectFastest.
//
// A bucket is (dtype, head dim, grouping class mha|gqa|mqa, mask class, layout, length class):
// "bf16 h128 gqa br padded L2048". The length class is the grid length nearest to max(T, S) in
// log2 (ties go to the longer class), so held-out shapes between grid points map to a bucket.
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn {

/// The grid a calibration covers.
struct CalibrationGrid {
  std::vector<kernels::DType> dtypes{kernels::DType::kBFloat16};
  std::vector<int64_t> head_dims{64, 128};
  std::vector<std::string> groups{"mha", "gqa"};  ///< mha: N=K=16; gqa: N=16, K=4; mqa: K=1
  std::vector<kernels::CausalAlignment> masks{kernels::CausalAlignment::kNone,
                                              kernels::CausalAlignment::kTopLeft,
                                              kernels::CausalAlignment::kBottomRight};
  std::vector<int64_t> lengths{128, 512, 2048, 8192};  ///< T = S of each bucket's shape, sorted
};

/// "mha" (K == N), "mqa" (K == 1 < N) or "gqa".
std::string GroupClass(int64_t num_heads, int64_t num_kv_heads);

/// The bucket name of `shape` against the grid's length classes (see the file comment).
std::string BucketOf(const kernels::AttentionShape& shape, const std::vector<int64_t>& lengths);

/// One timed (backend, bucket) pair.
struct CalibrationSample {
  std::string bucket;
  std::string backend;
  bool parity_ok = false;   ///< passed the parity check against the float64 reference
  double median_us = 0;     ///< median kernel time of the timed runs (valid when parity_ok)
  std::string note;         ///< why it was excluded (parity error, unsupported, failure)
};

/// The result: per bucket, the chosen backend and every sample.
struct CalibrationTable {
  std::string device_key;   ///< device name + driver + build (CalibrationDeviceKey)
  std::vector<int64_t> lengths;                       ///< the grid's length classes
  std::map<std::string, std::string> choice;          ///< bucket -> fastest backend
  std::map<std::string, std::vector<CalibrationSample>> samples;  ///< bucket -> samples
  /// The chosen backend for `shape`'s bucket, or "" when the bucket was not calibrated.
  std::string ChoiceFor(const kernels::AttentionShape& shape, std::string* bucket) const;
};

/// Picks, per bucket, the backend with the smallest median among samples that passed parity
/// (ties: the earlier sample). Buckets where none passed get no choice. Pure.
CalibrationTable SelectFastest(const std::vector<CalibrationSample>& samples,
                               const std::vector<int64_t>& lengths, std::string device_key);

/// "NVIDIA H200|driver 13.0|<build>": what a cached table must match to be reused.
std::string CalibrationDeviceKey(const std::string& device_name, const std::string& driver,
                                 const std::string& build);

/// JSON round trip (nlohmann-json). Parse errors: INVALID_ARGUMENT with the reason.
std::string CalibrationToJson(const CalibrationTable& table);
StatusOr<CalibrationTable> CalibrationFromJson(const std::string& json);

/// File helpers: Save writes atomically (temp file + rename); Load returns NOT_FOUND when the
/// file is missing and FAILED_PRECONDITION when its device key differs from `device_key`.
Status SaveCalibration(const std::string& path, const CalibrationTable& table);
StatusOr<CalibrationTable> LoadCalibration(const std::string& path,
                                           const std::string& device_key);

/// The length timed for a length class: 3/4 of it (96, 384, 1536, 6144 for the default grid),
/// inside the class (BucketOf maps it back) and off the power-of-two lengths where the cudnn
/// backend runs a dense graph instead of its bucketed ragged one. Most requests are off those
/// points; on the H200 (2026-11-30, bench/NOTES.md) timing only on them made auto pick cudnn
/// where, for held-out Azure lengths, fused was 1.5-4.8x faster.
int64_t RepresentativeLength(int64_t length_class);

/// The representative shape of each grid bucket (B = 1, T = S = RepresentativeLength(length),
/// padded, no lengths, scale 1/sqrt(H)), in grid order.
std::vector<kernels::AttentionShape> GridShapes(const CalibrationGrid& grid);

}  // namespace attn
