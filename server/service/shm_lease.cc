// SequenceServiceImpl's SharedMemoryLease (sequence.proto): one bidi stream per shared-memory
// region. The first message names the client's POSIX shm object, or carries a CUDA IPC region
// (cuda_ipc: the allocation's and the client event's handles); the server maps it
// (shm/region_registry.h, for the caller's identity) and writes the one response with the
// region id (and, for CUDA IPC, the server event's handle); later messages are read and
// ignored. A CUDA IPC lease's stream is finished only once the server closed its mapping (the
// last call that pinned the region is done), so a client that saw the end may free the
// allocation. The region is released exactly once when the
// stream ends: the client closes its side (OK), cancels or vanishes (its connection ends), the
// server ends leases for shutdown (EndStreams: UNAVAILABLE) or the identity's token is revoked
// (RevokeIdentities: UNAUTHENTICATED). A call that resolved a slice of the region keeps using it
// until it is done (the registry unmaps at the last pin).
//
// Registered raw (ByteBuffer in and out, like ExtendStream) so that a first message that does
// not parse is answered INVALID_ARGUMENT instead of looking like the client's half-close. Leases
// are not counted as calls in flight (an open lease is no load; it would hold every drain to
// its timeout): they are ended by EndStreams and counted once in attn_requests_total when they
// end.
#include <spdlog/spdlog.h>

#include <functional>
#include <string>

#include "service/grpc_status.h"
#include "service/sequence_service.h"
#include "service/stream_end_status.h"

namespace attn {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;

// State under mu_: reading_/writing_ (an operation is outstanding; never both), finished_
// (Finish was called, exactly once), first_read_ (the first message arrived), ending_/revoked_
// (end after the outstanding write), region_id_ (registered and not yet released).
class SequenceServiceImpl::LeaseReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  LeaseReactor(SequenceServiceImpl *service, grpc::CallbackServerContext *context)
      : service_(service), context_(context) {
    const grpc::Status admitted = service_->gate_->Admit(*context, nullptr, &owner_);
    if (admitted.ok() && service_->shm_regions_ != nullptr && !service_->draining_.load()) {
      std::lock_guard<std::mutex> registry(service_->leases_mu_);
      service_->leases_.insert(this);
      registered_ = true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!admitted.ok()) {
      End(admitted);
    } else if (service_->shm_regions_ == nullptr) {
      End(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                       "this server has no shared-memory registry"));
    } else if (!registered_) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       "server is draining for shutdown: new shared-memory leases are refused; "
                       "open the lease on another replica"));
    } else if (service_->ending_streams_.load()) {
      End(ShuttingDown());
    } else if (!finished_) {  // EndLeases may have ended it already
      reading_ = true;
      StartRead(&in_);
    }
  }
  void OnReadDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
    if (finished_) return;  // ended while the read was out
    if (!ok) return End(context_->IsCancelled() ? ClientGone() : grpc::Status::OK);
    if (first_read_) {  // later messages are ignored
      reading_ = true;
      StartRead(&in_);
      return;
    }
    first_read_ = true;
    pb::SharedMemoryLeaseRequest request;
    if (!grpc::SerializationTraits<pb::SharedMemoryLeaseRequest>::Deserialize(&in_, &request)
             .ok()) {
      return End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the first message of this stream is not a valid "
                              "attention.v1.SharedMemoryLeaseRequest"));
    }
    StatusOr<shm::RegisteredRegion> region = Internal("lease not registered");
    if (request.has_cuda_ipc()) {
      if (!request.name().empty()) {
        return End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "name and cuda_ipc are both set: a lease is on a host object "
                                "or on a CUDA IPC region, not both"));
      }
      const pb::CudaIpcRegion &c = request.cuda_ipc();
      region = service_->shm_regions_->RegisterDevice(
          owner_, {c.memory_handle(), c.offset(), request.bytes(), c.device_uuid(),
                   c.event_handle()});
      device_ = region.ok();
    } else {
      region = service_->shm_regions_->Register(owner_, request.name(), request.bytes());
    }
    if (!region.ok()) {
      spdlog::debug("SharedMemoryLease refused: {}", region.status().ToString());
      return End(ToGrpc(region.status()));
    }
    region_id_ = region->region_id;
    pb::SharedMemoryLeaseResponse response;
    response.set_region_id(region->region_id);
    response.set_bytes(region->bytes);
    response.set_cuda_event_handle(region->server_event_handle);
    bool own = false;
    if (!grpc::SerializationTraits<pb::SharedMemoryLeaseResponse>::Serialize(response, &out_,
                                                                             &own)
             .ok()) {
      return End(grpc::Status(grpc::StatusCode::INTERNAL, "lease response not serialised"));
    }
    writing_ = true;
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (finished_) return;
    if (!ok) {
      return End(context_->IsCancelled()
                     ? ClientGone()
                     : grpc::Status(grpc::StatusCode::CANCELLED, "lease response write failed"));
    }
    if (ending_) return End(ShuttingDown());
    if (revoked_) return End(Revoked());
    reading_ = true;
    StartRead(&in_);
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseRegion(nullptr);  // at once: the client is gone
    if (!writing_) End(ClientGone());  // else when the write completes (not ok)
  }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ReleaseRegion(nullptr);
    }
    if (registered_) {
      std::lock_guard<std::mutex> registry(service_->leases_mu_);
      service_->leases_.erase(this);
    }
    delete this;
  }
  /// EndStreams: finish now unless the response is being written (then right after it).
  /// Called with the service's leases_mu_ held (so this reactor outlives the call).
  void EndForShutdown() {
    std::lock_guard<std::mutex> lock(mu_);
    ending_ = true;
    if (!writing_) End(ShuttingDown());
  }
  /// RevokeIdentities: as EndForShutdown with UNAUTHENTICATED when the lease is `identity`'s;
  /// true when it is. Called with the service's leases_mu_ held.
  bool EndIfOwnedBy(const std::string &identity) {
    if (owner_ != identity) return false;  // owner_ is constant once registered
    std::lock_guard<std::mutex> lock(mu_);
    revoked_ = true;
    if (!writing_) End(Revoked());
    return true;
  }

 private:
  static grpc::Status ShuttingDown() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "server is shutting down: this shared-memory lease is closed and its "
                        "region released");
  }
  static grpc::Status Revoked() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the token of this lease's identity was revoked: the lease is closed "
                        "and its region released");
  }
  grpc::Status ClientGone() const { return stream_end::ClientGone(*context_); }
  /// Forgets the region (once); calls that pinned it keep it mapped until they are done.
  /// `on_closed` (may be null) runs once the mapping is closed; true when it was handed over
  /// (it will run, maybe inside this call), false when there was no region to release.
  /// Called with mu_ held.
  bool ReleaseRegion(std::function<void()> on_closed) {
    if (region_id_.empty()) return false;
    const bool released = service_->shm_regions_->Release(region_id_, on_closed);
    region_id_.clear();
    return released && on_closed != nullptr;
  }
  /// Releases the region, counts the stream and finishes it once: a CUDA IPC lease only when
  /// its mapping is closed (on the thread that drops the last pin, if a call still holds one).
  /// Called with mu_ held. Nothing touches `this` after Finish (OnDone may delete it).
  void End(const grpc::Status &st) {
    if (finished_) return;
    finished_ = true;
    std::function<void()> finish = [this, st] {
      service_->Observe(metrics::Method::kSharedMemoryLease,
                        static_cast<StatusCode>(st.error_code()), start_);
      Finish(st);
    };
    if (!ReleaseRegion(device_ ? finish : nullptr)) finish();
  }

  SequenceServiceImpl *const service_;
  grpc::CallbackServerContext *const context_;
  const Clock::time_point start_ = Clock::now();
  std::string owner_;  // set once in the constructor
  grpc::ByteBuffer in_, out_;
  std::mutex mu_;
  std::string region_id_;
  bool reading_ = false, writing_ = false, finished_ = false, first_read_ = false;
  bool ending_ = false, revoked_ = false;
  bool registered_ = false;  // in service_->leases_ (set in the constructor only)
  bool device_ = false;      // the region is a CUDA IPC region (set once, under mu_)
};

void SequenceServiceImpl::EndLeases() {
  std::lock_guard<std::mutex> registry(leases_mu_);
  for (LeaseReactor *lease : leases_) lease->EndForShutdown();
}

int64_t SequenceServiceImpl::RevokeLeases(const std::string &identity) {
  int64_t ended = 0;
  std::lock_guard<std::mutex> registry(leases_mu_);
  for (LeaseReactor *lease : leases_) ended += lease->EndIfOwnedBy(identity) ? 1 : 0;
  return ended;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> *
SequenceServiceImpl::SharedMemoryLease(grpc::CallbackServerContext *context) {
  return new LeaseReactor(this, context);
}

}  // namespace attn
