#include "metrics/scrape_collector.h"

#include <cstdint>
#include <string>
#include <utility>

namespace attn::metrics {
namespace {

prometheus::ClientMetric GaugeValue(double v, std::vector<prometheus::ClientMetric::Label> l = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(l);
  m.gauge.value = v;
  return m;
}

prometheus::MetricFamily GaugeFamily(const char* name, const char* help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

}  // namespace

int Metrics::ScrapeCollector::Add(Source s) {
  std::lock_guard<std::mutex> lock(mu_);
  sources_.emplace(next_id_, std::move(s));
  return next_id_++;
}

void Metrics::ScrapeCollector::Remove(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  sources_.erase(id);
}

void Metrics::ScrapeCollector::SetPeaks(double flops, double bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  peak_flops_ = flops;
  peak_bytes_ = bytes;
}

std::vector<prometheus::MetricFamily> Metrics::ScrapeCollector::Collect() const {
  auto in_flight = GaugeFamily("attn_requests_in_flight",
                               "Calls received and not yet finished (queued or running).");
  auto queued = GaugeFamily("attn_requests_queued", "Calls waiting for a worker thread.");
  auto pool_cap =
      GaugeFamily("attn_device_pool_capacity_bytes",
                  "Device memory pool reserved at start; without a GPU, the host memory "
                  "reserved for the KV cache (--kv-cache-bytes).");
  auto pool_used =
      GaugeFamily("attn_device_pool_used_bytes", "Device memory pool bytes currently allocated.");
  auto peak_flops =
      GaugeFamily("attn_device_peak_flops_per_second",
                  "Datasheet dense bf16/fp16 tensor peak of the device (0: unknown or cpu).");
  auto peak_bytes = GaugeFamily("attn_device_peak_bytes_per_second",
                                "Datasheet memory bandwidth of the device (0: unknown or cpu).");
  auto kv_cap = GaugeFamily("attn_kv_capacity_pages", "KV-cache pages per layout class.");
  auto kv_used = GaugeFamily("attn_kv_used_pages", "KV-cache pages in use per layout class.");
  auto kv_ratio = GaugeFamily("attn_kv_used_ratio",
                              "Bytes of KV-cache pages in use (K and V, all layout classes) over "
                              "the whole KV pool (0 when the pool is empty).");
  auto kv_seq = GaugeFamily("attn_kv_sequences", "Live sequences in the KV cache.");
  auto kv_revoked = GaugeFamily("attn_kv_sequences_revoked_total",
                                "Sequences released because their owner's last token was "
                                "revoked (token file reloaded by SIGHUP).");
  kv_revoked.type = prometheus::MetricType::Counter;
  auto kv_host_used = GaugeFamily("attn_kv_host_used_bytes",
                                  "Host memory of the KV cache outside its pages, by kind "
                                  "(replay_outputs, sequence_metadata).");
  auto kv_host_cap = GaugeFamily("attn_kv_host_capacity_bytes",
                                 "Host-memory budget of the KV cache by kind "
                                 "(--replay-cache-bytes, --sequence-metadata-bytes).");
  std::lock_guard<std::mutex> lock(mu_);
  peak_flops.metric.push_back(GaugeValue(peak_flops_));
  peak_bytes.metric.push_back(GaugeValue(peak_bytes_));
  bool any_kv = false;
  int64_t sequences = 0, revoked = 0, used_page_bytes = 0, kv_pool_bytes = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> classes;
  std::map<std::string, std::pair<int64_t, int64_t>> host;  // kind -> (used, capacity)
  int64_t in_flight_sum = 0, queued_sum = 0, cap_sum = 0, used_sum = 0;
  bool any_requests = false, any_pool = false;
  for (const auto& [id, s] : sources_) {
    if (s.in_flight) {
      any_requests = true;
      in_flight_sum += s.in_flight();
      queued_sum += s.queued ? s.queued() : 0;
    }
    if (s.pool) {
      any_pool = true;
      auto [cap, used] = s.pool();
      cap_sum += cap;
      used_sum += used;
    }
    if (s.kv) {
      any_kv = true;
      KvCacheStats st = s.kv();
      sequences += st.sequences;
      revoked += st.revoked_sequences;
      used_page_bytes += st.used_page_bytes;
      kv_pool_bytes += st.pool_bytes;
      for (const auto& c : st.classes) {
        auto& e = classes[c.layout_class];
        e.first += c.capacity_pages;
        e.second += c.used_pages;
      }
      for (const auto& h : st.host) {
        auto& e = host[h.kind];
        e.first += h.used_bytes;
        e.second += h.capacity_bytes;
      }
    }
  }
  if (any_requests) {
    in_flight.metric.push_back(GaugeValue(static_cast<double>(in_flight_sum)));
    queued.metric.push_back(GaugeValue(static_cast<double>(queued_sum)));
  }
  if (any_pool) {
    pool_cap.metric.push_back(GaugeValue(static_cast<double>(cap_sum)));
    pool_used.metric.push_back(GaugeValue(static_cast<double>(used_sum)));
  }
  if (any_kv) {
    kv_seq.metric.push_back(GaugeValue(static_cast<double>(sequences)));
    const double ratio = kv_pool_bytes > 0 ? static_cast<double>(used_page_bytes) /
                                                 static_cast<double>(kv_pool_bytes)
                                           : 0;
    kv_ratio.metric.push_back(GaugeValue(ratio));
    prometheus::ClientMetric revoked_value;
    revoked_value.counter.value = static_cast<double>(revoked);
    kv_revoked.metric.push_back(std::move(revoked_value));
    for (const auto& [name, v] : classes) {
      kv_cap.metric.push_back(GaugeValue(static_cast<double>(v.first), {{"layout_class", name}}));
      kv_used.metric.push_back(GaugeValue(static_cast<double>(v.second), {{"layout_class", name}}));
    }
    for (const auto& [kind, v] : host) {
      kv_host_used.metric.push_back(GaugeValue(static_cast<double>(v.first), {{"kind", kind}}));
      kv_host_cap.metric.push_back(GaugeValue(static_cast<double>(v.second), {{"kind", kind}}));
    }
  }
  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&in_flight, &queued, &pool_cap, &pool_used, &peak_flops, &peak_bytes, &kv_cap,
                  &kv_used, &kv_ratio, &kv_seq, &kv_revoked, &kv_host_used, &kv_host_cap}) {
    out.push_back(std::move(*f));
  }
  CollectSharedMemory(&out);
  return out;
}

void Metrics::ScrapeCollector::CollectSharedMemory(
    std::vector<prometheus::MetricFamily>* out) const {
  auto regions = GaugeFamily("attn_shared_memory_regions",
                             "Host shared-memory regions mapped (leased, or released and still "
                             "used by a call).");
  auto bytes = GaugeFamily("attn_shared_memory_bytes", "Bytes of the mapped shared-memory regions.");
  auto leases = GaugeFamily("attn_shared_memory_leases",
                            "Shared-memory regions whose SharedMemoryLease stream is open.");
  auto broken = GaugeFamily("attn_shared_memory_broken_total",
                            "Shared-memory regions whose client shrank the object under the "
                            "server (calls using them failed with FAILED_PRECONDITION).");
  broken.type = prometheus::MetricType::Counter;
  bool any = false;
  SharedMemoryStats sum;
  for (const auto& [id, s] : sources_) {
    if (!s.shm) continue;
    any = true;
    const SharedMemoryStats st = s.shm();
    sum.regions += st.regions;
    sum.bytes += st.bytes;
    sum.leases += st.leases;
    sum.broken_total += st.broken_total;
  }
  if (any) {
    regions.metric.push_back(GaugeValue(static_cast<double>(sum.regions)));
    bytes.metric.push_back(GaugeValue(static_cast<double>(sum.bytes)));
    leases.metric.push_back(GaugeValue(static_cast<double>(sum.leases)));
    prometheus::ClientMetric total;
    total.counter.value = static_cast<double>(sum.broken_total);
    broken.metric.push_back(std::move(total));
  }
  for (auto* f : {&regions, &bytes, &leases, &broken}) out->push_back(std::move(*f));
}

}  // namespace attn::metrics
