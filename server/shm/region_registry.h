// Shared-memory regions registered by co-located clients (issue 18, sequence.proto
// SharedMemoryLease and RegionSlice), of two kinds: host (a client's POSIX shm object mapped into
// the server, shm_mapping.h) and device (a client's CUDA allocation on the server's GPU opened
// through CUDA IPC by the installed DeviceRegionOpener, device_region.h). Each is named by a
// random region id, owned by the identity that registered it, and bounded by
// --max-shared-memory-regions and --max-shared-memory-bytes (both kinds together).
//
// Lifetime: Register maps the object; Release (the lease's stream ended) forgets the id at once,
// so later Resolves get NOT_FOUND, but the mapping stays until the last PinnedSlice of it is
// gone: a call that resolved a slice may go on using it after the lease ended. The limits count
// mappings that exist (registered, or released and still pinned), because those hold address
// space and guard slots. Release may name a callback that runs once the mapping is closed
// (device leases end their stream only then, so the client frees its allocation after the
// server closed its IPC mapping, never before).
//
// Shrinking: a client may ftruncate its object smaller while a call uses it; the SIGBUS guard
// (fault_guard.h) then puts zero pages under the mapping and marks it broken. A caller checks
// PinnedSlice::CheckIntact() after its last access and fails with FAILED_PRECONDITION instead of
// trusting what it read or wrote; a broken region resolves to FAILED_PRECONDITION from then on.
// Device regions cannot shrink (CheckIntact is always OK for them).
//
// Thread-safety: every method is safe from any thread. PinnedSlice is a value: copy it to share
// the pin.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>

#include "attn/common/status.h"
#include "shm/device_region.h"

namespace attn::shm {

/// Hex digits of a region id (lowercase, random: 128 bits).
inline constexpr size_t kRegionIdHexDigits = 32;

struct RegistryLimits {
  /// Regions mapped at once (every identity together); at most kMaxGuardedMappings (4096).
  int64_t max_regions = 256;
  /// Bytes mapped at once. 64 GiB: mappings cost the server address space and page tables
  /// (8 bytes per 4 KiB page touched: 128 MiB at 64 GiB), not memory (the pages are the
  /// client's shm, charged to the memory limit of whoever touched them first); far above one
  /// frontend's batches, low enough that a runaway client cannot map the whole address space.
  int64_t max_bytes = int64_t{64} << 30;
};

/// A byte range of a region (sequence.proto RegionSlice, without the proto).
struct SliceRef {
  std::string region_id;
  int64_t offset = 0;  ///< bytes from the region's start
  int64_t bytes = 0;
};

struct RegisteredRegion {
  std::string region_id;  ///< kRegionIdHexDigits lowercase hex digits
  int64_t bytes = 0;      ///< mapped size
  /// Device regions: the server event's IPC handle (DeviceRegion::server_event_handle); empty
  /// for host regions.
  std::string server_event_handle;
};

struct RegistryStats {
  int64_t regions = 0;       ///< mappings that exist (registered, or released and still pinned)
  int64_t mapped_bytes = 0;  ///< their bytes
  int64_t leased = 0;        ///< regions registered and not released
  int64_t broken_total = 0;  ///< regions found shrunk under a pin (since start)
  int64_t device_regions = 0;  ///< of `regions`: CUDA IPC mappings
};

class Region;

/// A resolved slice: `bytes()` bytes at `data()`, valid while this object (or a copy) lives,
/// even after the region's lease ended. Empty when default-built.
class PinnedSlice {
 public:
  PinnedSlice() = default;
  const uint8_t *data() const { return data_; }
  /// The same bytes for writing; nullptr unless resolved with writable = true.
  uint8_t *mutable_data() const { return writable_ ? data_ : nullptr; }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return region_ == nullptr; }
  /// OK, or FAILED_PRECONDITION "region ... shrank below its registered size" when the client
  /// shrank the object under a touched page since it was mapped (what was read is zeros, what
  /// was written is lost). Call after the last access. An empty slice is intact.
  Status CheckIntact() const;
  /// The device region the slice lies in (then data() is a device address on the server's GPU,
  /// never to be dereferenced on the host); null for host regions and empty slices.
  DeviceRegion *device() const;

 private:
  friend class RegionRegistry;
  std::shared_ptr<const Region> region_;
  uint8_t *data_ = nullptr;
  int64_t bytes_ = 0;
  bool writable_ = false;
};

class RegionRegistry {
 public:
  /// `limits.max_regions` is capped at kMaxGuardedMappings; 0 refuses every registration.
  explicit RegionRegistry(RegistryLimits limits = {});
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry &) = delete;
  RegionRegistry &operator=(const RegionRegistry &) = delete;

  /// Maps the client's object `name` for `owner` (ShmMapping::Open) under a new random id.
  /// Errors: INVALID_ARGUMENT (bad name, bytes < 1, not a regular file, smaller than `bytes`),
  /// NOT_FOUND (no such object), PERMISSION_DENIED, RESOURCE_EXHAUSTED (the limits, naming the
  /// flag, what is mapped and what was asked; or the system's), INTERNAL. Nothing registered
  /// on error.
  StatusOr<RegisteredRegion> Register(const std::string &owner, const std::string &name,
                                      int64_t bytes);
  /// Installs the opener of device regions (call before serving). Null, the default: every
  /// device lease is refused with FAILED_PRECONDITION `why_not` (which says why this server
  /// cannot map CUDA IPC regions).
  void SetDeviceOpener(std::shared_ptr<DeviceRegionOpener> opener, std::string why_not);
  /// True when device leases can be opened (an opener is installed).
  bool accepts_device_regions() const;
  /// Opens a CUDA IPC region for `owner` under a new random id (the request's fields as
  /// sequence.proto CudaIpcRegion, UUID in any accepted form). Errors, in this order:
  /// INVALID_ARGUMENT (a handle not kCudaIpcHandleBytes long, offset < 0, bytes < 1, a malformed
  /// UUID), FAILED_PRECONDITION (no opener: `why_not`; the UUID names another GPU, both named),
  /// RESOURCE_EXHAUSTED (the limits), then the opener's (INVALID_ARGUMENT, INTERNAL). Nothing
  /// registered on error.
  StatusOr<RegisteredRegion> RegisterDevice(const std::string &owner, DeviceLeaseRequest request);
  /// Forgets `region_id` (the mapping goes when its last pin does); false when unknown.
  /// `on_closed` (may be empty; only used when true is returned) runs once the mapping is
  /// closed: inside this call when nothing pins it, else on the thread that drops the last pin.
  bool Release(const std::string &region_id, std::function<void()> on_closed = nullptr);
  /// Releases every region (shutdown); returns how many.
  int64_t ReleaseAll();

  /// The slice `slice` of `owner`'s region, pinned. `expected_bytes`: what the tensor's shape
  /// and dtype need. `writable`: the caller writes (mutable_data()). Errors: INVALID_ARGUMENT
  /// (offset < 0, bytes < 1, bytes != expected_bytes, or the range beyond the region's size,
  /// checked without overflow; the size is only named to its owner), NOT_FOUND (an unknown,
  /// released or malformed id, or another identity's region: one message for all, so
  /// existence never leaks), FAILED_PRECONDITION (the region shrank earlier).
  StatusOr<PinnedSlice> Resolve(const std::string &owner, const SliceRef &slice,
                                int64_t expected_bytes, bool writable) const;

  RegistryStats stats() const;
  const RegistryLimits &limits() const { return limits_; }

  /// What every Region shares with its registry (outlives both): the mapped totals.
  struct Usage {
    std::atomic<int64_t> regions{0};
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> broken{0};
    std::atomic<int64_t> device{0};
  };

 private:
  std::string NewRegionId();  // under mu_
  Status Reserve(int64_t bytes);
  void Unreserve(int64_t bytes);
  /// Publishes `region` (its reservation taken, its id unset) under a new id; returns the id.
  /// Takes mu_.
  std::string Insert(std::shared_ptr<Region> region);

  const RegistryLimits limits_;
  const std::shared_ptr<Usage> usage_ = std::make_shared<Usage>();
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Region>> regions_;  // id -> region
  std::random_device rd_;
  std::shared_ptr<DeviceRegionOpener> device_opener_;  // set before serving
  std::string device_why_not_ =
      "this server cannot map CUDA IPC regions (no device-region opener installed)";
};

}  // namespace attn::shm
