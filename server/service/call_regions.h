// The shared-memory slices one call uses (a packed ExtendBatch's q_region, k_region, v_region,
// o_region; sequence.proto RegionSlice): each is resolved in the caller's identity's regions
// (shm/region_registry.h) and pinned here, so the bytes stay mapped until this object goes
// (after the call's response is written), even if the region's lease ends meanwhile. After the
// call's last access to them, CheckIntact says whether a client shrank a region underneath
// (the SIGBUS guard then gave zeros): the call must not report what it computed from them.
// CUDA IPC slices (issue 18 item 3) resolve to device addresses on the server's GPU: all of one
// call's must name one region (its events order the call: device(), OnDevice()).
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "attention/v1/sequence.pb.h"
#include "attn/common/status.h"
#include "shm/region_registry.h"

namespace attn {

class CallRegions {
 public:
  /// `registry` (not owned, may be null: every region refused) must outlive this object.
  CallRegions(const shm::RegionRegistry *registry, std::string owner)
      : registry_(registry), owner_(std::move(owner)) {}

  /// The address of `slice`'s first byte, pinned for this call. `field` names the request field
  /// in errors ("q_region: ..."); `expected_bytes`: the tensor's shape times its dtype size;
  /// `writable`: the call writes the range (o_region). Errors: as RegionRegistry::Resolve
  /// (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION), prefixed with `field`;
  /// INVALID_ARGUMENT when there is no registry, when the range overlaps a range pinned
  /// before and one of the two is written (two leases of one object are not detected), or when
  /// it lies in a CUDA IPC region other than the one an earlier field of the call named. A
  /// CUDA IPC slice's address is a device address (never to be read on the host).
  StatusOr<void *> Resolve(const char *field, const attention::v1::RegionSlice &slice,
                           uint64_t expected_bytes, bool writable);
  /// The CUDA IPC region the call's device slices lie in; null when it names none.
  shm::DeviceRegion *device() const;
  /// True when `field` (as given to Resolve) was resolved into the CUDA IPC region.
  bool OnDevice(const std::string &field) const;
  /// OK, or the FAILED_PRECONDITION of the first pinned region that shrank, naming which field's.
  Status CheckIntact() const;
  /// Slices pinned so far.
  size_t pinned() const;

 private:
  const shm::RegionRegistry *const registry_;
  const std::string owner_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, shm::PinnedSlice>> pins_;  // (field, pin)
  shm::DeviceRegion *device_ = nullptr;  // pinned through pins_
};

}  // namespace attn
