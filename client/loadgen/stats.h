// Exact order statistics over recorded samples.
#pragma once

#include <cstdint>
#include <vector>

namespace attn::loadgen {

/// The p-th percentile (0 <= p <= 100) of ascending `sorted` by the nearest-rank method: the
/// smallest sample such that at least p% of the samples are <= it (p = 0 gives the minimum,
/// p = 100 the maximum). Returns 0 for an empty vector.
double Percentile(const std::vector<double>& sorted, double p);

/// Count, mean and exact percentiles of a set of samples.
struct Summary {
  int64_t count = 0;
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

/// Summarises `samples` (any order; taken by value and sorted).
Summary Summarize(std::vector<double> samples);

}  // namespace attn::loadgen
