// An HDR-style latency histogram: log-linear buckets with a fixed relative precision.
//
// Values are integers (the load generator records microseconds) in [1, kMaxValue] (1 µs .. 1 h);
// smaller values are recorded as 1 and larger ones as kMaxValue. Values below 2048 have their
// own bucket (exact); above, each power-of-two range [2^k, 2^(k+1)) is split into 1024 equal
// sub-buckets, so any recorded value is known to within 1/1024 (< 0.1 %, i.e. ~3 significant
// digits). Memory is fixed (~23 k counters) whatever the number of samples.
#pragma once

#include <cstdint>
#include <vector>

namespace attn::loadgen {

class HdrHistogram {
 public:
  static constexpr int64_t kMaxValue = int64_t{3600} * 1000 * 1000;  // 1 h in µs
  static constexpr int kSubBucketBits = 11;                          // 2048 linear sub-buckets

  HdrHistogram();

  /// Records `value` (clamped to [1, kMaxValue]) `count` times.
  void Record(int64_t value, int64_t count = 1);
  /// Adds every sample of `other`.
  void Merge(const HdrHistogram& other);
  void Reset();

  int64_t count() const { return count_; }
  /// Exact minimum/maximum/mean of the recorded (clamped) values; 0 when empty.
  int64_t min() const { return count_ ? min_ : 0; }
  int64_t max() const { return count_ ? max_ : 0; }
  double mean() const { return count_ ? static_cast<double>(sum_) / count_ : 0; }

  /// The p-th percentile (0..100) by the nearest-rank method, reported as the midpoint of the
  /// bucket holding that sample (clamped to the exact min/max): within 1/2048 of the exact
  /// nearest-rank value relative to it. 0 when empty.
  double Percentile(double p) const;

  /// Bucket index of `value` and the [lowest, highest] values sharing that bucket.
  static int Index(int64_t value);
  static int64_t LowestEquivalent(int index);
  static int64_t HighestEquivalent(int index);
  static int BucketCount();

 private:
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t min_ = 0;
  int64_t max_ = 0;
  int64_t sum_ = 0;  // µs over at most ~2.5e9 hours of samples: no overflow in practice
};

}  // namespace attn::loadgen
