// A lane: the one unit every GPU executor moves bytes and launches work with (DESIGN.md §2,
// §7). A lane is a CUDA stream, four timing events and a pinned host staging buffer; it shares
// its owner's FaultLatch. One round trip on a lane (RoundTrip) is, in stream order:
//
//   pack (host) -> event 0 -> upload (H2D) -> event 1 -> launch -> event 2 -> download (D2H)
//   -> event 3 -> synchronise -> times from the events -> finish (host, copies out)
//
// so the times of the copies and of the kernels come from CUDA events on the one stream. A
// LaneSet holds the lanes of one executor; a call takes a free one (Acquire) and holds it from
// packing its inputs until its outputs are copied out, so calls on different lanes overlap.
// Callers may pack request bytes straight into the held lane's staging (staging()), which is
// what lets a caller do one host copy each way.
//
// CUDA graphs (issue 18 item 4): a trip that names its whole round trip by a key
// (RoundTrip::GraphKey) on a lane with graphs on is captured once (stream capture of the same
// Upload/Launch/Download calls, the four events as external event-record nodes) and replayed
// from the lane's GraphCache on every later trip with that key: one cudaGraphLaunch instead of
// a copy, two to four kernel launches, a copy and four event records, and no host gaps between
// the nodes on the device. Such a trip's device buffer is the lane's scratch (ReserveScratch),
// so the addresses its graph names stay put; growing the scratch or the staging drops the
// lane's graphs.
// Device timing of replays (--kv-timing-every): a graph's four event-record nodes cost ~4 us
// of cudaGraphLaunch and ~11 us of the trip on an H200 (bench/graph_launch_bench.cu, device call
// G2), while plain stream event records cost nothing measurable. So with set_timing_every(n > 1)
// a key has two graphs: one with the event nodes, replayed on one graph trip in n (the lane's
// count), and one without, whose trips report no device times (LaneTimes::timed false). Plain
// launches (graphs off, or a trip without a key) are always timed.
// CUDA builds only. Thread-safety: a Lane is used by the one caller that holds its lease;
// LaneSet::Acquire is thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attn/common/status.h"
#include "device/device_pool.h"
#include "device/fault_latch.h"
#include "device/graph_cache.h"

namespace attn {

/// Device time of one round trip's phases, in milliseconds (CUDA events, ~0.5 µs resolution),
/// and the host's time in the trip, in nanoseconds (steady clock): packing the inputs, enqueuing
/// the copies and launches (or the graph launch; a capture included), waiting in
/// cudaStreamSynchronize, and reading the events and unpacking the outputs (Finish); a trip
/// that captured its graph has the capture and instantiation in capture_ns, not in enqueue_ns;
/// graph_launch_ns is the cudaGraphLaunch call alone (part of enqueue_ns; 0 for plain launches).
/// `timed` false: a graph replayed without its event nodes (see the file comment); the three
/// device times are then 0 and mean "not measured".
struct LaneTimes {
  float h2d_ms = 0.f;
  float kernel_ms = 0.f;
  float d2h_ms = 0.f;
  int64_t pack_ns = 0, enqueue_ns = 0, wait_ns = 0, finish_ns = 0, capture_ns = 0;
  int64_t graph_launch_ns = 0;
  bool timed = true;
};

class Lane;

/// The four steps of one round trip, implemented by each executor (see the file comment).
/// Upload/Launch/Download enqueue on the lane's stream; Pack and Finish are host work.
class RoundTrip {
 public:
  virtual ~RoundTrip() = default;
  /// Host work before the first event (e.g. packing inputs into lane.staging()).
  virtual void Pack(Lane& lane) { (void)lane; }
  /// Enqueues the host-to-device copies (use lane.Check on every CUDA call).
  virtual Status Upload(Lane& lane) = 0;
  /// Enqueues the kernels. INVALID_ARGUMENT: refused, the device stays healthy; INTERNAL: a
  /// device fault (latched).
  virtual Status Launch(Lane& lane) = 0;
  /// Enqueues the device-to-host copies.
  virtual Status Download(Lane& lane) = 0;
  /// After the stream synchronised: copies outputs out of staging to the caller.
  virtual void Finish(Lane& lane) { (void)lane; }
  /// True when the trip may run as a CUDA graph, with `key` set to a string that determines
  /// every node Upload, Launch and Download enqueue: each copy's addresses and size, each
  /// kernel, its grid, block, shared memory and every argument that is not read from the
  /// uploaded bytes. Two trips with one key must enqueue the same work (only the bytes in
  /// staging differ). Default: false (never a graph).
  virtual bool GraphKey(Lane& lane, std::string* key) {
    (void)lane;
    (void)key;
    return false;
  }
};

class Lane {
 public:
  /// Graphs kept per lane: a decode workload uses a handful at a time (one per batch size and
  /// 64-token band of the longest sequence).
  static constexpr size_t kGraphsPerLane = 32;
  /// Makes a stream and four events on `device` and pins `staging_bytes` (0: no staging).
  /// `growable`: ReserveStaging may grow the buffer (by doubling). `latch` (not owned,
  /// outlives the lane) is the owner's fault latch; `who` names the owner in errors.
  /// Errors: INTERNAL when the stream or an event cannot be made; RESOURCE_EXHAUSTED when the
  /// staging buffer cannot be pinned.
  static StatusOr<std::unique_ptr<Lane>> Create(int device, uint64_t staging_bytes, bool growable,
                                                FaultLatch* latch, const std::string& who);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  /// Pinned host staging buffer (null when staging_bytes() is 0).
  char* staging() const { return staging_; }
  /// The staging buffer's address for kernels (cudaHostGetDevicePointer; the same as
  /// staging() under unified addressing), or null when the buffer is not mapped: a kernel may
  /// then write its small outputs there itself instead of a download.
  char* staging_on_device() const { return staging_device_; }
  uint64_t staging_bytes() const { return staging_bytes_; }
  bool growable() const { return growable_; }
  /// Makes staging at least `bytes` long (doubling from max(current, 1 MiB)); the contents are
  /// lost when it grows. Errors: RESOURCE_EXHAUSTED when pinning fails or the lane is not
  /// growable and too small.
  Status ReserveStaging(uint64_t bytes);
  /// The lane's device scratch (null until ReserveScratch): the device buffer of trips that
  /// run as graphs. ReserveScratch makes it at least `bytes` (doubling from 64 KiB), carved
  /// from `pool` (not owned; outlives the lane); growing it drops the lane's graphs.
  /// Errors: RESOURCE_EXHAUSTED from the pool (the old scratch is kept).
  char* scratch() const { return static_cast<char*>(scratch_.data()); }
  Status ReserveScratch(DevicePool* pool, uint64_t bytes);
  /// Turns replaying graphs on or off (off by default; off drops the cached graphs).
  void set_graphs(bool on);
  bool graphs() const { return graphs_on_; }
  /// Graph trips run with device timing once in `n` (>= 1; 1, the default: every trip); the
  /// others replay the key's graph without event nodes (see the file comment).
  void set_timing_every(int n) { timing_every_ = n < 1 ? 1 : n; }
  int timing_every() const { return timing_every_; }
  const GraphCounts& graph_counts() const { return graphs_.counts(); }

  /// Ok for cudaSuccess; else clears CUDA's last error, latches "what: error" and returns
  /// INTERNAL (the latch's error prefix + cause).
  Status Check(cudaError_t err, const char* what);
  /// Runs `trip` (see the file comment; cudaSetDevice(device) first); `times` (may be null)
  /// gets the event times. A Launch error waits for the stream (so the caller's buffers may go
  /// back) and latches when INTERNAL. The caller checks the latch (FaultLatch::Faulted) before
  /// it allocates the trip's device buffers. Errors: as the steps return; INTERNAL naming the
  /// CUDA call for a failed event, copy or synchronisation (latched).
  /// With graphs on and trip.GraphKey true, the trip runs as a captured graph (see the file
  /// comment); a capture the driver refuses turns graphs off on this lane (logged once) and
  /// the trip runs as plain launches.
  Status Run(RoundTrip& trip, LaneTimes* times);

 private:
  Lane(int device, bool growable, FaultLatch* latch, std::string who)
      : device_(device), growable_(growable), latch_(latch), who_(std::move(who)) {}
  Status Record(int i);
  /// Sets staging_device_ for the current staging_ (null when it cannot be mapped).
  void MapStaging();
  // Run's parts: the plain launches, and the graph of `key` (captured first on a miss).
  Status RunDirect(RoundTrip& trip, LaneTimes* times);
  Status RunGraph(RoundTrip& trip, std::string* key, LaneTimes* times);
  /// `timed`: with the four events as event-record nodes.
  Status Capture(RoundTrip& trip, bool timed, cudaGraphExec_t* exec, bool* refused);
  /// Waits for the trip, reads its events (when `timed`) and runs trip.Finish; `packing` and
  /// `packed` are when Pack started and ended; `before_ns` the host time spent on the trip
  /// before Pack (finding the graph), `capture_ns` the part of it that captured one.
  struct HostMarks {
    std::chrono::steady_clock::time_point packing, packed;
    int64_t before_ns = 0, capture_ns = 0, graph_launch_ns = 0;
  };
  Status Finish(RoundTrip& trip, LaneTimes* times, const HostMarks& marks, bool timed);

  const int device_;
  const bool growable_;
  FaultLatch* const latch_;
  const std::string who_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[4] = {nullptr, nullptr, nullptr, nullptr};
  char* staging_ = nullptr;
  char* staging_device_ = nullptr;
  uint64_t staging_bytes_ = 0;
  DeviceAllocation scratch_;
  bool graphs_on_ = false;
  int timing_every_ = 1;
  uint64_t graph_trips_ = 0;  // graph trips since the lane was made (the timing sample's count)
  GraphCache graphs_{kGraphsPerLane};
};

/// A held lane: the lane and the lock that keeps it the caller's.
struct LaneLease {
  Lane* lane = nullptr;
  std::unique_lock<std::mutex> lock;
};

/// The lanes of one executor and the fault latch they share.
class LaneSet {
 public:
  /// See FaultLatch for the two prefixes.
  LaneSet(std::string error_prefix, std::string faulted_prefix)
      : latch_(std::move(error_prefix), std::move(faulted_prefix)) {}
  /// Adds `count` lanes (>= 1) made by Lane::Create with these arguments. Call before use.
  Status Add(int count, int device, uint64_t staging_bytes, bool growable, const std::string& who);
  /// Takes the first free lane in order (so a caller alone keeps reusing lane 0 and its
  /// captured graphs: each lane captures its own), else waits for one (rotating which).
  LaneLease Acquire();
  FaultLatch& latch() { return latch_; }
  const FaultLatch& latch() const { return latch_; }
  size_t size() const { return lanes_.size(); }
  /// set_graphs on every lane.
  void SetGraphs(bool on);
  /// set_timing_every on every lane.
  void SetTimingEvery(int n);
  /// The lanes' graph counters, summed (takes each lane's lock).
  GraphCounts SumGraphCounts();

 private:
  struct Slot {
    std::mutex mu;
    std::unique_ptr<Lane> lane;
  };
  FaultLatch latch_;
  std::vector<std::unique_ptr<Slot>> lanes_;
  std::atomic<size_t> next_{0};
};

}  // namespace attn
