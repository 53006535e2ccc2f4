#include "shm/region_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/client_text.h"
#include "shm/fault_guard.h"
#include "shm/shm_mapping.h"

namespace attn::shm {

// One registered region: its mapping and who owns it. Gives its mapped bytes back to the usage
// totals when the last pin (or the registry's entry) lets it go.
class Region {
 public:
  Region(std::string id, std::string owner, std::unique_ptr<ShmMapping> mapping,
         std::shared_ptr<RegionRegistry::Usage> usage)
      : id_(std::move(id)),
        owner_(std::move(owner)),
        mapping_(std::move(mapping)),
        usage_(std::move(usage)) {}
  ~Region() {
    usage_->regions.fetch_sub(1);
    usage_->bytes.fetch_sub(mapping_->bytes());
  }
  const std::string &id() const { return id_; }
  const std::string &owner() const { return owner_; }
  const ShmMapping &mapping() const { return *mapping_; }
  /// FAILED_PRECONDITION when the mapping broke (counted and logged the first time).
  Status Intact() const {
    if (!mapping_->broken()) return Status::Ok();
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
  const std::string id_;
  const std::string owner_;
  const std::unique_ptr<ShmMapping> mapping_;
  const std::shared_ptr<RegionRegistry::Usage> usage_;
  mutable std::atomic<bool> reported_{false};
};

Status PinnedSlice::CheckIntact() const {
  return region_ == nullptr ? Status::Ok() : region_->Intact();
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

StatusOr<RegisteredRegion> RegionRegistry::Register(const std::string &owner,
                                                    const std::string &name, int64_t bytes) {
  ATTN_RETURN_IF_ERROR(ValidateShmName(name));
  if (bytes < 1) return InvalidArgument("bytes: expected >= 1, got " + std::to_string(bytes));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ATTN_RETURN_IF_ERROR(Reserve(bytes));
  }
  auto mapping = ShmMapping::Open(name, bytes);
  if (!mapping.ok()) {
    usage_->regions.fetch_sub(1);
    usage_->bytes.fetch_sub(bytes);
    return mapping.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  RegisteredRegion out{NewRegionId(), bytes};
  // From here the Region gives the reservation back when it goes.
  regions_.emplace(out.region_id,
                   std::make_shared<const Region>(out.region_id, owner, std::move(*mapping),
                                                  usage_));
  return out;
}

bool RegionRegistry::Release(const std::string &region_id) {
  std::shared_ptr<const Region> gone;  // unmapped (if unpinned) after the lock is dropped
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) return false;
  gone = std::move(it->second);
  regions_.erase(it);
  return true;
}

int64_t RegionRegistry::ReleaseAll() {
  std::unordered_map<std::string, std::shared_ptr<const Region>> gone;
  std::lock_guard<std::mutex> lock(mu_);
  gone.swap(regions_);
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
  const int64_t size = region->mapping().bytes();
  if (slice.offset > size || slice.bytes > size - slice.offset) {  // no overflow: both <= size
    return InvalidArgument("region slice [" + std::to_string(slice.offset) + ", +" +
                           std::to_string(slice.bytes) + ") lies beyond region " + region->id() +
                           " of " + std::to_string(size) + " bytes");
  }
  ATTN_RETURN_IF_ERROR(region->Intact());
  PinnedSlice pinned;
  pinned.data_ = region->mapping().data() + slice.offset;
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
  std::lock_guard<std::mutex> lock(mu_);
  s.leased = static_cast<int64_t>(regions_.size());
  return s;
}

}  // namespace attn::shm
