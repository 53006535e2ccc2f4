// The scrape-time gauges of Metrics (metrics.h): the sources registered with
// RegisterRequestGauges, RegisterDevicePool, RegisterKvCache and RegisterSharedMemory (summed over
// registrations) and
// the device peaks, turned into gauge families when /metrics is scraped. Private to metrics/
// (metrics.cc creates it; scrape_collector.cc computes the families).
// Thread-safety: all methods are thread-safe (one mutex; Collect calls the sources under it).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <map>
#include <mutex>
#include <vector>

#include "metrics/metrics.h"

namespace attn::metrics {

class Metrics::ScrapeCollector final : public prometheus::Collectable {
 public:
  /// Returns the id Remove takes.
  int Add(Source s);
  void Remove(int id);
  void SetPeaks(double flops, double bytes);
  /// attn_requests_in_flight/_queued, attn_device_pool_*, attn_device_peak_*, attn_kv_* (the
  /// families without samples until a source of their kind is registered).
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  /// Appends attn_shared_memory_* from the sources that have `shm`. Called with mu_ held.
  void CollectSharedMemory(std::vector<prometheus::MetricFamily>* out) const;

  mutable std::mutex mu_;
  std::map<int, Source> sources_;
  int next_id_ = 1;
  double peak_flops_ = 0;
  double peak_bytes_ = 0;
};

}  // namespace attn::metrics
