#include "shm/region_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/client_text.h"
#include "common/gpu_uuid.h"
#include "shm/fault_guard.h"
#include "shm/shm_mapping.h"

namespace attn::shm {

// One registered region: its mapping (host) or its CUDA IPC region (device), and who owns it.
// Gives its bytes back to the usage totals when the last pin (or the registry's entry) lets it
// go, then runs the release callback, if any (after the mapping is closed).
class Region {
 public:
  Region(std::string owner, std::unique_ptr<ShmMapping> mapping,
         std::shared_ptr<RegionRegistry::Usage> usage)
      : owner_(std::move(owner)), mapping_(std::move(mapping)), usage_(std::move(usage)) {}
  Region(std::string owner, std::unique_ptr<DeviceRegion> device,
         std::shared_ptr<RegionRegistry::Usage> usage)
      : owner_(std::move(owner)), device_(std::move(device)), usage_(std::move(usage)) {
    usage_->device.fetch_add(1);
  }
  ~Region() {
    const int64_t n = bytes();
    if (device_ != nullptr) usage_->device.fetch_sub(1);
    mapping_.reset();
    device_.reset();  // cudaIpcCloseMemHandle
    usage_->regions.fetch_sub(1);
    usage_->bytes.fetch_sub(n);
    if (on_closed_) on_closed_();
  }
  const std::string &id() const { return id_; }
  const std::string &owner() const { return owner_; }
  uint8_t *data() const { return device_ != nullptr ? device_->data() : mapping_->data(); }
  int64_t bytes() const { return device_ != nullptr ? device_->bytes() : mapping_->bytes(); }
  DeviceRegion *device() const { return device_.get(); }
  /// FAILED_PRECONDITION when the host mapping broke (counted and logged the first time).
  Status Intact() const {
    if (mapping_ == nullptr || !mapping_->broken()) return Status::Ok();
    if (!reported_.exchange(true)) {
      usage_->broken.fetch_add(1);
      spdlog::warn(
          "shared-memory region {} (\"{}\", identity \"{}\") shrank below its registered size "
          "of {} bytes: the server now reads zeros there; its calls fail with "
          "FAILED_PRECONDITION",
          id_, EchoClientText(mapping_->name()), EchoClientText(owner_), mapping_->bytes());
    }
    return FailedPrecondition("region " + id_ + " (\"" + EchoClientText(mapping_->name()) +
                              "\") shrank below its registered size of " +
                              std::to_string(mapping_->bytes()) +
                              " bytes (the client truncated the shared-memory object): what "
                              "the server read from it or wrote to it is lost; open a new lease");
  }

 private:
  friend class RegionRegistry;
  std::string id_;  // set by Insert before the region is published, constant after
  const std::string owner_;
  std::unique_ptr<ShmMapping> mapping_;   // host regions
  std::unique_ptr<DeviceRegion> device_;  // device regions
  const std::shared_ptr<RegionRegistry::Usage> usage_;
  mutable std::atomic<bool> reported_{false};
  // Set by Release under the registry's lock, before the registry's reference goes.
  mutable std::function<void()> on_closed_;
};

Status PinnedSlice::CheckIntact() const {
  return region_ == nullptr ? Status::Ok() : region_->Intact();
}

DeviceRegion *PinnedSlice::device() const {
  return region_ == nullptr ? nullptr : region_->device();
}

RegionRegistry::RegionRegistry(RegistryLimits limits)
    : limits_{std::min<int64_t>(limits.max_regions, kMaxGuardedMappings), limits.max_bytes} {}

RegionRegistry::~RegionRegistry() { ReleaseAll(); }

std::string RegionRegistry::NewRegionId() {
  static constexpr char kHex[] = "0123456789abcdef";
  for (;;) {
    std::string id;
    id.reserve(kRegionIdHexDigits);
    while (id.size() < kRegionIdHexDigits) {
      const uint32_t r = static_cast<uint32_t>(rd_());
      for (int i = 7; i >= 0; --i) id.push_back(kHex[(r >> (4 * i)) & 0xf]);
    }
    if (regions_.count(id) == 0) return id;
  }
}

Status RegionRegistry::Reserve(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t regions = usage_->regions.load();
  const int64_t mapped = usage_->bytes.load();
  if (regions + 1 > limits_.max_regions) {
    return ResourceExhausted("shared-memory regions: " + std::to_string(regions) +
                             " mapped, at most " + std::to_string(limits_.max_regions) +
                             " (--max-shared-memory-regions); end a lease first");
  }
  if (bytes > limits_.max_bytes - mapped) {
    return ResourceExhausted("shared-memory bytes: " + std::to_string(mapped) + " mapped + " +
                             std::to_string(bytes) + " asked > " +
                             std::to_string(limits_.max_bytes) +
                             " (--max-shared-memory-bytes); end a lease or ask for less");
  }
  usage_->regions.fetch_add(1);
  usage_->bytes.fetch_add(bytes);
  return Status::Ok();
}

void RegionRegistry::Unreserve(int64_t bytes) {
  usage_->regions.fetch_sub(1);
  usage_->bytes.fetch_sub(bytes);
}

std::string RegionRegistry::Insert(std::shared_ptr<Region> region) {
  std::lock_guard<std::mutex> lock(mu_);
  region->id_ = NewRegionId();
  std::string id = region->id_;
  regions_.emplace(id, std::move(region));
  return id;
}

StatusOr<RegisteredRegion> RegionRegistry::Register(const std::string &owner,
                                                    const std::string &name, int64_t bytes) {
  ATTN_RETURN_IF_ERROR(ValidateShmName(name));
  if (bytes < 1) return InvalidArgument("bytes: expected >= 1, got " + std::to_string(bytes));
  ATTN_RETURN_IF_ERROR(Reserve(bytes));
  auto mapping = ShmMapping::Open(name, bytes);
  if (!mapping.ok()) {
    Unreserve(bytes);
    return mapping.status();
  }
  // From here the Region gives the reservation back when it goes.
  RegisteredRegion out;
  out.bytes = bytes;
  out.region_id = Insert(std::make_shared<Region>(owner, std::move(*mapping), usage_));
  return out;
}

void RegionRegistry::SetDeviceOpener(std::shared_ptr<DeviceRegionOpener> opener,
                                     std::string why_not) {
  std::lock_guard<std::mutex> lock(mu_);
  device_opener_ = std::move(opener);
  device_why_not_ = std::move(why_not);
}

bool RegionRegistry::accepts_device_regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_opener_ != nullptr;
}

StatusOr<RegisteredRegion> RegionRegistry::RegisterDevice(const std::string &owner,
                                                          DeviceLeaseRequest request) {
  // The request's own form first (what no device is needed to judge), then this server.
  for (const auto &[field, handle] :
       {std::pair<const char *, const std::string *>{"cuda_ipc.memory_handle",
                                                     &request.memory_handle},
        {"cuda_ipc.event_handle", &request.event_handle}}) {
    if (handle->size() != kCudaIpcHandleBytes) {
      return InvalidArgument(std::string(field) + ": expected " +
                             std::to_string(kCudaIpcHandleBytes) + " bytes (a CUDA IPC handle), "
                             "got " + std::to_string(handle->size()));
    }
  }
  if (request.offset < 0) {
    return InvalidArgument("cuda_ipc.offset: expected >= 0, got " +
                           std::to_string(request.offset));
  }
  if (request.bytes < 1) {
    return InvalidArgument("bytes: expected >= 1, got " + std::to_string(request.bytes));
  }
  auto uuid = CanonicalGpuUuid(request.device_uuid);
  if (!uuid.ok()) return Status(uuid.status().code(), "cuda_ipc." + uuid.status().message());
  request.device_uuid = *uuid;
  std::shared_ptr<DeviceRegionOpener> opener;
  std::string why_not;
  {
    std::lock_guard<std::mutex> lock(mu_);
    opener = device_opener_;
    why_not = device_why_not_;
  }
  if (opener == nullptr) return FailedPrecondition(why_not);
  if (request.device_uuid != opener->device_uuid()) {
    return FailedPrecondition("cuda_ipc.device_uuid: the allocation is on " +
                              request.device_uuid + ", this server computes on " +
                              opener->device_uuid() +
                              " (CUDA IPC needs both on one GPU: lease on the server of that GPU, "
                              "or send the tensors as bytes or host shared memory)");
  }
  ATTN_RETURN_IF_ERROR(Reserve(request.bytes));
  auto device = opener->Open(request);
  if (!device.ok()) {
    Unreserve(request.bytes);
    return device.status();
  }
  RegisteredRegion out;
  out.bytes = request.bytes;
  out.server_event_handle = (*device)->server_event_handle();
  out.region_id = Insert(std::make_shared<Region>(owner, std::move(*device), usage_));
  return out;
}

bool RegionRegistry::Release(const std::string &region_id, std::function<void()> on_closed) {
  std::shared_ptr<const Region> gone;  // unmapped (if unpinned) after the lock is dropped
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(region_id);
    if (it == regions_.end()) return false;
    gone = std::move(it->second);
    regions_.erase(it);
    gone->on_closed_ = std::move(on_closed);
  }
  return true;  // `gone` goes here: the mapping closes now unless a call still pins it
}

int64_t RegionRegistry::ReleaseAll() {
  std::unordered_map<std::string, std::shared_ptr<const Region>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(regions_);
  }
  return static_cast<int64_t>(gone.size());
}

StatusOr<PinnedSlice> RegionRegistry::Resolve(const std::string &owner, const SliceRef &slice,
                                              int64_t expected_bytes, bool writable) const {
  // What needs no lookup first: these errors say nothing about the region.
  if (slice.offset < 0) {
    return InvalidArgument("region offset: expected >= 0, got " + std::to_string(slice.offset));
  }
  if (slice.bytes < 1) {
    return InvalidArgument("region bytes: expected >= 1, got " + std::to_string(slice.bytes));
  }
  if (slice.bytes != expected_bytes) {
    return InvalidArgument("region bytes: the tensor's shape and dtype need " +
                           std::to_string(expected_bytes) + " bytes, the slice has " +
                           std::to_string(slice.bytes));
  }
  std::shared_ptr<const Region> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(slice.region_id);
    if (it != regions_.end() && it->second->owner() == owner) region = it->second;
  }
  if (region == nullptr) {
    return NotFound("no shared-memory region \"" + EchoClientText(slice.region_id) +
                    "\" for this identity (unknown, or its lease ended)");
  }
  const int64_t size = region->bytes();
  if (slice.offset > size || slice.bytes > size - slice.offset) {  // no overflow: both <= size
    return InvalidArgument("region slice [" + std::to_string(slice.offset) + ", +" +
                           std::to_string(slice.bytes) + ") lies beyond region " + region->id() +
                           " of " + std::to_string(size) + " bytes");
  }
  ATTN_RETURN_IF_ERROR(region->Intact());
  PinnedSlice pinned;
  pinned.data_ = region->data() + slice.offset;
  pinned.bytes_ = slice.bytes;
  pinned.writable_ = writable;
  pinned.region_ = std::move(region);
  return pinned;
}

RegistryStats RegionRegistry::stats() const {
  RegistryStats s;
  s.regions = usage_->regions.load();
  s.mapped_bytes = usage_->bytes.load();
  s.broken_total = usage_->broken.load();
  s.device_regions = usage_->device.load();
  std::lock_guard<std::mutex> lock(mu_);
  s.leased = static_cast<int64_t>(regions_.size());
  return s;
}

}  // namespace attn::shm
