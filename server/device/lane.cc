#include "device/lane.h"

#include <spdlog/spdlog.h>

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
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  graphs_.Clear();  // before the events and buffers their nodes name
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
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
  graphs_.Clear();  // their copies name the old buffer
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

Status Lane::ReserveScratch(DevicePool* pool, uint64_t bytes) {
  if (scratch_.data() != nullptr && bytes <= scratch_.bytes()) return Status::Ok();
  uint64_t want = std::max<uint64_t>(scratch_.bytes() * 2, 64u << 10);
  while (want < bytes) want *= 2;
  StatusOr<DeviceAllocation> grown = pool->Allocate(want);
  if (!grown.ok()) return grown.status();
  graphs_.Clear();  // their nodes name the old scratch
  scratch_ = std::move(*grown);
  return Status::Ok();
}

void Lane::set_graphs(bool on) {
  graphs_on_ = on;
  if (!on) graphs_.Clear();
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
  std::string key;
  if (graphs_on_ && trip.GraphKey(*this, &key)) return RunGraph(trip, key, times);
  return RunDirect(trip, times);
}

Status Lane::RunDirect(RoundTrip& trip, LaneTimes* times) {
  const auto packing = std::chrono::steady_clock::now();
  trip.Pack(*this);
  const auto packed = std::chrono::steady_clock::now();
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
  return Finish(trip, times, packing, packed, 0);
}

Status Lane::RunGraph(RoundTrip& trip, const std::string& key, LaneTimes* times) {
  const auto start = std::chrono::steady_clock::now();
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  cudaGraphExec_t exec = graphs_.Find(key);
  if (exec == nullptr) {
    bool refused = false;
    ATTN_RETURN_IF_ERROR(Capture(trip, &exec, &refused));
    if (refused) return RunDirect(trip, times);  // graphs are off on this lane from now on
    graphs_.Insert(key, exec);
    ++graphs_.counts().captures;
  } else {
    ++graphs_.counts().replays;
  }
  const auto packing = std::chrono::steady_clock::now();
  trip.Pack(*this);  // the graph's upload reads staging when it runs, after this
  const auto packed = std::chrono::steady_clock::now();
  ATTN_RETURN_IF_ERROR(Check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch"));
  return Finish(trip, times, packing, packed,
                std::chrono::duration_cast<std::chrono::nanoseconds>(packing - start).count());
}

// Captures the trip's Upload/Launch/Download (no Pack: capture enqueues nothing that runs) with
// the four events as external event-record nodes. A Launch refused with INVALID_ARGUMENT
// returns it (nothing ran; the device stays healthy); a capture or instantiation the driver
// refuses sets *refused, turns graphs off on this lane and logs why.
Status Lane::Capture(RoundTrip& trip, cudaGraphExec_t* exec, bool* refused) {
  *exec = nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  auto refuse = [&](const char* what, cudaError_t err) {
    (void)cudaGetLastError();
    spdlog::warn("{}: CUDA graphs turned off on this lane: {} failed ({}); trips run as plain "
                 "launches",
                 who_, what, cudaGetErrorString(err));
    set_graphs(false);
    *refused = true;
    return Status::Ok();
  };
  if (e != cudaSuccess) return refuse("cudaStreamBeginCapture", e);
  auto record = [this](int i) {
    return Check(cudaEventRecordWithFlags(events_[i], stream_, cudaEventRecordExternal),
                 "cudaEventRecordWithFlags (capture)");
  };
  Status st = record(0);
  if (st.ok()) st = trip.Upload(*this);
  if (st.ok()) st = record(1);
  if (st.ok()) st = trip.Launch(*this);
  if (st.ok()) st = record(2);
  if (st.ok()) st = trip.Download(*this);
  if (st.ok()) st = record(3);
  cudaGraph_t graph = nullptr;
  e = cudaStreamEndCapture(stream_, &graph);
  if (!st.ok()) {
    // Nothing was enqueued for real; the refused launch is the caller's error.
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (st.code() == StatusCode::kInternal) latch_->Latch(st.message());
    return st;
  }
  if (e != cudaSuccess) return refuse("cudaStreamEndCapture", e);
  e = cudaGraphInstantiate(exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    *exec = nullptr;
    return refuse("cudaGraphInstantiate", e);
  }
  return Status::Ok();
}

Status Lane::Finish(RoundTrip& trip, LaneTimes* times,
                    std::chrono::steady_clock::time_point packing,
                    std::chrono::steady_clock::time_point packed, int64_t before_ns) {
  const auto enqueued = std::chrono::steady_clock::now();
  ATTN_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  const auto synced = std::chrono::steady_clock::now();
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
  if (times != nullptr) {
    auto ns = [](std::chrono::steady_clock::duration d) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    };
    times->pack_ns = ns(packed - packing);
    times->enqueue_ns = before_ns + ns(enqueued - packed);
    times->wait_ns = ns(synced - enqueued);
    times->finish_ns = ns(std::chrono::steady_clock::now() - synced);
  }
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

void LaneSet::SetGraphs(bool on) {
  for (auto& slot : lanes_) {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->lane->set_graphs(on);
  }
}

GraphCounts LaneSet::SumGraphCounts() {
  GraphCounts sum;
  for (auto& slot : lanes_) {
    std::lock_guard<std::mutex> lock(slot->mu);
    const GraphCounts& c = slot->lane->graph_counts();
    sum.replays += c.replays;
    sum.captures += c.captures;
    sum.evictions += c.evictions;
    sum.dropped += c.dropped;
  }
  return sum;
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
