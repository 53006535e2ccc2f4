#include "service/load_report.h"

#include <utility>

#include "kv_cache/sequence_id.h"
#include "service/sequence_service.h"

namespace attn {

LoadReporter::LoadReporter(SequenceStore *sequences, int64_t max_queue_requests, int worker_threads)
    : sequences_(sequences),
      max_queue_requests_(max_queue_requests),
      worker_threads_(worker_threads),
      address_(sequences != nullptr ? sequences->options().replica_address : std::string()),
      tag_hex_(sequences != nullptr ? ReplicaTagHex(sequences->options().replica_tag)
                                    : std::string()) {}

void LoadReporter::SetQueueDepthSource(Source queued) {
  std::lock_guard<std::mutex> lock(mu_);
  queued_ = std::move(queued);
}

void LoadReporter::AddInFlightSource(Source in_flight) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.push_back(std::move(in_flight));
}

void LoadReporter::FillReplica(attention::v1::ReplicaInfo *info) const {
  info->set_address(address_);
  info->set_replica_tag(tag_hex_);
}

void LoadReporter::Fill(attention::v1::GetLoadResponse *r) const {
  FillReplica(r->mutable_replica());
  r->set_draining(draining());
  {
    std::lock_guard<std::mutex> lock(mu_);
    r->set_requests_queued(queued_ ? queued_() : 0);
    int64_t in_flight = 0;
    for (const Source &s : in_flight_) in_flight += s();
    r->set_requests_in_flight(in_flight);
  }
  r->set_max_queue_requests(max_queue_requests_);
  r->set_worker_threads(worker_threads_);
  if (sequences_ == nullptr) return;
  // The same numbers as GetServerInfo.kv_cache (FillKvCacheInfo), reshaped.
  attention::v1::KvCacheInfo kv;
  FillKvCacheInfo(*sequences_, &kv);
  r->set_sequences(kv.sequences());
  r->set_kv_pool_bytes(kv.pool_bytes());
  r->set_kv_pool_used_bytes(kv.pool_used_bytes());
  r->mutable_kv_classes()->Swap(kv.mutable_classes());
}

}  // namespace attn
