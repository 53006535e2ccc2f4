#include "device/lane.h"

#include <algorithm>

namespace attn {

StatusOr<std::unique_ptr<Lane>> Lane::Create(int device, uint64_t staging_bytes, bool growable,
                                             FaultLatch* latch, const std::string& who) {
  std::unique_ptr<Lane> lane(new Lane(device, growable, latch, who));
  if (cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal(who + ": cannot use device " + std::to_string(device));
  }
  if (cudaStreamCreateWithFlags(&lane->stream_, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    lane->stream_ = nullptr;
    return Internal(who + ": cannot create a stream on device " + std::to_string(device));
  }
  for (cudaEvent_t& e : lane->events_) {
    if (cudaEventCreate(&e) != cudaSuccess) {
      (void)cudaGetLastError();
      e = nullptr;
      return Internal(who + ": cannot create a timing event on device " + std::to_string(device));
    }
  }
  if (staging_bytes > 0) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, staging_bytes, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      return ResourceExhausted(who + ": cannot pin " + std::to_string(staging_bytes) +
                               " bytes of host staging memory");
    }
    lane->staging_ = static_cast<char*>(p);
    lane->staging_bytes_ = staging_bytes;
  }
  return lane;
}

Lane::~Lane() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : events_) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
}

Status Lane::ReserveStaging(uint64_t bytes) {
  if (bytes <= staging_bytes_) return Status::Ok();
  if (!growable_) {
    return ResourceExhausted(who_ + ": " + std::to_string(bytes) + " bytes do not fit the " +
                             std::to_string(staging_bytes_) + "-byte staging buffer");
  }
  uint64_t want = std::max<uint64_t>(staging_bytes_ * 2, 1u << 20);
  while (want < bytes) want *= 2;
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  staging_ = nullptr;
  staging_bytes_ = 0;
  void* p = nullptr;
  if (cudaHostAlloc(&p, want, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return ResourceExhausted(who_ + ": cannot pin " + std::to_string(want) +
                             " bytes of host staging memory");
  }
  staging_ = static_cast<char*>(p);
  staging_bytes_ = want;
  return Status::Ok();
}

Status Lane::Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return latch_->Trip(std::string(what) + ": " + cudaGetErrorString(err));
}

Status Lane::Record(int i) {
  return Check(cudaEventRecord(events_[i], stream_), "cudaEventRecord");
}

Status Lane::Run(RoundTrip& trip, LaneTimes* times) {
  trip.Pack(*this);
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  ATTN_RETURN_IF_ERROR(Record(0));
  ATTN_RETURN_IF_ERROR(trip.Upload(*this));
  ATTN_RETURN_IF_ERROR(Record(1));
  Status launched = trip.Launch(*this);
  if (!launched.ok()) {
    // A refused launch (INVALID_ARGUMENT) leaves the device healthy: wait for the copies already
    // enqueued so the caller's buffers can go back; INTERNAL is a device fault.
    (void)cudaStreamSynchronize(stream_);
    if (launched.code() == StatusCode::kInternal) latch_->Latch(launched.message());
    return launched;
  }
  ATTN_RETURN_IF_ERROR(Record(2));
  ATTN_RETURN_IF_ERROR(trip.Download(*this));
  ATTN_RETURN_IF_ERROR(Record(3));
  ATTN_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  if (times != nullptr) {
    float* out[3] = {&times->h2d_ms, &times->kernel_ms, &times->d2h_ms};
    for (int i = 0; i < 3; ++i) {
      float ms = 0.f;
      if (cudaEventElapsedTime(&ms, events_[i], events_[i + 1]) != cudaSuccess) {
        (void)cudaGetLastError();  // timing only: never fails the call
        ms = 0.f;
      }
      *out[i] = ms;
    }
  }
  trip.Finish(*this);
  return Status::Ok();
}

Status LaneSet::Add(int count, int device, uint64_t staging_bytes, bool growable,
                    const std::string& who) {
  for (int i = 0; i < std::max(1, count); ++i) {
    auto lane = Lane::Create(device, staging_bytes, growable, &latch_, who);
    if (!lane.ok()) return lane.status();
    auto slot = std::make_unique<Slot>();
    slot->lane = std::move(*lane);
    lanes_.push_back(std::move(slot));
  }
  return Status::Ok();
}

LaneLease LaneSet::Acquire() {
  const size_t n = lanes_.size();
  const size_t start = next_.fetch_add(1, std::memory_order_relaxed) % n;
  for (size_t k = 0; k < n; ++k) {
    Slot* s = lanes_[(start + k) % n].get();
    std::unique_lock<std::mutex> lock(s->mu, std::try_to_lock);
    if (lock.owns_lock()) return LaneLease{s->lane.get(), std::move(lock)};
  }
  Slot* s = lanes_[start].get();
  return LaneLease{s->lane.get(), std::unique_lock<std::mutex>(s->mu)};
}

}  // namespace attn
