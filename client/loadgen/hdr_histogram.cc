#include "loadgen/hdr_histogram.h"

#include <algorithm>
#include <cmath>

namespace attn::loadgen {
namespace {

constexpr int64_t kLinear = int64_t{1} << HdrHistogram::kSubBucketBits;  // 2048
constexpr int64_t kHalf = kLinear / 2;                                     // 1024

int FloorLog2(uint64_t v) { return 63 - __builtin_clzll(v); }

}  // namespace

HdrHistogram::HdrHistogram() : counts_(static_cast<size_t>(BucketCount()), 0) {}

int HdrHistogram::Index(int64_t value) {
  value = std::clamp<int64_t>(value, 1, kMaxValue);
  if (value < kLinear) return static_cast<int>(value);
  const int shift = FloorLog2(static_cast<uint64_t>(value)) - (kSubBucketBits - 1);  // >= 1
  return static_cast<int>(kLinear + (shift - 1) * kHalf + ((value >> shift) - kHalf));
}

int64_t HdrHistogram::LowestEquivalent(int index) {
  if (index < kLinear) return index;
  const int64_t rel = index - kLinear;
  const int shift = static_cast<int>(rel / kHalf) + 1;
  return (kHalf + rel % kHalf) << shift;
}

int64_t HdrHistogram::HighestEquivalent(int index) {
  if (index < kLinear) return index;
  const int shift = static_cast<int>((index - kLinear) / kHalf) + 1;
  return LowestEquivalent(index) + (int64_t{1} << shift) - 1;
}

int HdrHistogram::BucketCount() { return Index(kMaxValue) + 1; }

void HdrHistogram::Record(int64_t value, int64_t count) {
  if (count <= 0) return;
  value = std::clamp<int64_t>(value, 1, kMaxValue);
  counts_[static_cast<size_t>(Index(value))] += count;
  if (count_ == 0 || value < min_) min_ = value;
  if (count_ == 0 || value > max_) max_ = value;
  count_ += count;
  sum_ += value * count;
}

void HdrHistogram::Merge(const HdrHistogram& other) {
  if (other.count_ == 0) return;
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  if (count_ == 0 || other.min_ < min_) min_ = other.min_;
  if (count_ == 0 || other.max_ > max_) max_ = other.max_;
  count_ += other.count_;
  sum_ += other.sum_;
}

void HdrHistogram::Reset() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = min_ = max_ = sum_ = 0;
}

double HdrHistogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  const double n = static_cast<double>(count_);
  int64_t rank = static_cast<int64_t>(std::ceil(std::clamp(p, 0.0, 100.0) * n / 100.0));
  rank = std::max<int64_t>(rank, 1);
  int64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) {
      const int index = static_cast<int>(i);
      const double mid =
          (static_cast<double>(LowestEquivalent(index)) + HighestEquivalent(index)) / 2.0;
      return std::clamp(mid, static_cast<double>(min_), static_cast<double>(max_));
    }
  }
  return static_cast<double>(max_);
}

}  // namespace attn::loadgen
