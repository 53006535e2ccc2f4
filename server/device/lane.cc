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
    lane->MapStaging();
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
  // Pin and map on the lane's device (the caller's current device may be another one).
  if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  staging_ = nullptr;
  staging_device_ = nullptr;
  staging_bytes_ = 0;
  void* p = nullptr;
  if (cudaHostAlloc(&p, want, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return ResourceExhausted(who_ + ": cannot pin " + std::to_string(want) +
                             " bytes of host staging memory");
  }
  staging_ = static_cast<char*>(p);
  staging_bytes_ = want;
  MapStaging();
  return Status::Ok();
}

void Lane::MapStaging() {
  void* d = nullptr;
  if (staging_ != nullptr && cudaHostGetDevicePointer(&d, staging_, 0) == cudaSuccess) {
    staging_device_ = static_cast<char*>(d);
  } else {
    (void)cudaGetLastError();
    staging_device_ = nullptr;
  }
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
  if (graphs_on_ && trip.GraphKey(*this, &key)) return RunGraph(trip, &key, times);
  return RunDirect(trip, times);
}

Status Lane::RunDirect(RoundTrip& trip, LaneTimes* times) {
  HostMarks marks;
  marks.packing = std::chrono::steady_clock::now();
  trip.Pack(*this);
  marks.packed = std::chrono::steady_clock::now();
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
  return Finish(trip, times, marks, /*timed=*/true);
}

Status Lane::RunGraph(RoundTrip& trip, std::string* key, LaneTimes* times) {
  const auto start = std::chrono::steady_clock::now();
  ATTN_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
  // One graph trip in timing_every_ replays the graph with the event nodes (the first one of
  // a lane included, so a lane's first trips are timed).
  const bool timed =
      timing_every_ <= 1 || graph_trips_ % static_cast<uint64_t>(timing_every_) == 0;
  ++graph_trips_;
  key->push_back(timed ? 'T' : 'U');
  HostMarks marks;
  cudaGraphExec_t exec = graphs_.Find(*key);
  if (exec == nullptr) {
    bool refused = false;
    ATTN_RETURN_IF_ERROR(Capture(trip, timed, &exec, &refused));
    if (refused) return RunDirect(trip, times);  // graphs are off on this lane from now on
    graphs_.Insert(*key, exec);
    ++graphs_.counts().captures;
    marks.capture_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
  } else {
    ++graphs_.counts().replays;
  }
  marks.packing = std::chrono::steady_clock::now();
  trip.Pack(*this);  // the graph's upload reads staging when it runs, after this
  marks.packed = std::chrono::steady_clock::now();
  marks.before_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(marks.packing - start).count();
  ATTN_RETURN_IF_ERROR(Check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch"));
  marks.graph_launch_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - marks.packed)
                              .count();
  return Finish(trip, times, marks, timed);
}

// Captures the trip's Upload/Launch/Download (no Pack: capture enqueues nothing that runs), with
// the four events as external event-record nodes when `timed`. A Launch refused with
// INVALID_ARGUMENT returns it (nothing ran; the device stays healthy); a capture or instantiation
// the driver refuses sets *refused, turns graphs off on this lane and logs why.
Status Lane::Capture(RoundTrip& trip, bool timed, cudaGraphExec_t* exec, bool* refused) {
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
  auto record = [this, timed](int i) {
    if (!timed) return Status::Ok();
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

Status Lane::Finish(RoundTrip& trip, LaneTimes* times, const HostMarks& marks, bool timed) {
  const auto enqueued = std::chrono::steady_clock::now();
  ATTN_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  const auto synced = std::chrono::steady_clock::now();
  if (times != nullptr) {
    times->timed = timed;
    float* out[3] = {&times->h2d_ms, &times->kernel_ms, &times->d2h_ms};
    for (int i = 0; i < 3; ++i) {
      float ms = 0.f;
      if (timed && cudaEventElapsedTime(&ms, events_[i], events_[i + 1]) != cudaSuccess) {
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
    times->pack_ns = ns(marks.packed - marks.packing);
    times->capture_ns = marks.capture_ns;
    times->graph_launch_ns = marks.graph_launch_ns;
    times->enqueue_ns = marks.before_ns - marks.capture_ns + ns(enqueued - marks.packed);
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

void LaneSet::SetTimingEvery(int n) {
  for (auto& slot : lanes_) {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->lane->set_timing_every(n);
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
  for (auto& slot : lanes_) {
    std::unique_lock<std::mutex> lock(slot->mu, std::try_to_lock);
    if (lock.owns_lock()) return LaneLease{slot->lane.get(), std::move(lock)};
  }
  Slot* s = lanes_[next_.fetch_add(1, std::memory_order_relaxed) % lanes_.size()].get();
  return LaneLease{s->lane.get(), std::unique_lock<std::mutex>(s->mu)};
}

}  // namespace attn
