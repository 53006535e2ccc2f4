#include "service/call_regions.h"

#include <limits>
#include <utility>

namespace attn {

StatusOr<void *> CallRegions::Resolve(const char *field, const attention::v1::RegionSlice &slice,
                                      uint64_t expected_bytes, bool writable) {
  const std::string prefix = std::string(field) + ": ";
  if (registry_ == nullptr) {
    return InvalidArgument(prefix + "this server has no shared-memory regions");
  }
  if (expected_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgument(prefix + "the tensor needs " + std::to_string(expected_bytes) +
                           " bytes, more than any region holds");
  }
  auto pin = registry_->Resolve(owner_, {slice.region_id(), slice.offset(), slice.bytes()},
                                static_cast<int64_t>(expected_bytes), writable);
  if (!pin.ok()) return Status(pin.status().code(), prefix + pin.status().message());
  void *data = writable ? static_cast<void *>(pin->mutable_data())
                        : const_cast<uint8_t *>(pin->data());
  std::lock_guard<std::mutex> lock(mu_);
  shm::DeviceRegion *dev = pin->device();
  if (dev != nullptr && device_ != nullptr && device_ != dev) {
    return InvalidArgument(prefix + "names a second CUDA IPC region; the CUDA IPC slices of "
                           "one call must all lie in one region (its events order the call)");
  }
  for (const auto &[other, p] : pins_) {
    // A range written while another is read (or written) in the same mapping: refused.
    const bool either_written = writable || p.mutable_data() != nullptr;
    const bool overlap = pin->data() < p.data() + p.bytes() && p.data() < pin->data() + pin->bytes();
    if (either_written && overlap) {
      return InvalidArgument(prefix + "overlaps " + other +
                             " in the same region; an output range must not share bytes with "
                             "another range of the call");
    }
  }
  if (dev != nullptr) device_ = dev;
  pins_.emplace_back(field, std::move(*pin));
  return data;
}

Status CallRegions::CheckIntact() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto &[field, pin] : pins_) {
    Status s = pin.CheckIntact();
    if (!s.ok()) return Status(s.code(), field + ": " + s.message());
  }
  return Status::Ok();
}

shm::DeviceRegion *CallRegions::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

bool CallRegions::OnDevice(const std::string &field) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto &[name, pin] : pins_) {
    if (name == field) return pin.device() != nullptr;
  }
  return false;
}

size_t CallRegions::pinned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pins_.size();
}

}  // namespace attn
