// Test doubles for CUDA IPC regions without a GPU (shm/device_region.h): a "device" region over
// a host buffer (never dereferenced by the registry; tests may read it as the bytes the server's
// device copies would have touched) and an opener for one fixed GPU UUID that counts opens and
// closes and can be told to fail. Used by device_region_registry_test.cc and call_regions_test.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/common/status.h"
#include "shm/device_region.h"

namespace attn::shm::testing {

inline constexpr char kUuid[] = "GPU-0123abcd-4567-89ef-0123-456789abcdef";

/// A region of `bytes` host bytes; increments *closed when destroyed; counts Zero calls.
class FakeRegion final : public DeviceRegion {
 public:
  FakeRegion(int64_t bytes, int *closed) : buf_(static_cast<size_t>(bytes)), closed_(closed) {}
  ~FakeRegion() override { ++*closed_; }
  uint8_t *data() const override { return const_cast<uint8_t *>(buf_.data()); }
  int64_t bytes() const override { return static_cast<int64_t>(buf_.size()); }
  void *client_event() const override { return const_cast<int *>(&event_); }
  const std::string &server_event_handle() const override { return handle_; }
  Status Zero(uint8_t *, int64_t) override { return Status::Ok(); }
  Status SignalWritten() override { return Status::Ok(); }

 private:
  std::vector<uint8_t> buf_;
  int *closed_;
  int event_ = 0;
  const std::string handle_ = std::string(kCudaIpcHandleBytes, 's');
};

/// Opens FakeRegions for kUuid; `fail` (when not OK) is returned instead.
class FakeOpener final : public DeviceRegionOpener {
 public:
  const std::string &device_uuid() const override { return uuid_; }
  StatusOr<std::unique_ptr<DeviceRegion>> Open(const DeviceLeaseRequest &r) override {
    ++opened;
    last = r;
    if (!fail.ok()) return fail;
    return std::unique_ptr<DeviceRegion>(new FakeRegion(r.bytes, &closed));
  }
  int opened = 0, closed = 0;
  Status fail;
  DeviceLeaseRequest last;

 private:
  const std::string uuid_ = kUuid;
};

/// A well-formed device lease of `bytes` at `offset` on `uuid`.
inline DeviceLeaseRequest DeviceLease(int64_t bytes, int64_t offset = 0,
                                      std::string uuid = kUuid) {
  return {std::string(kCudaIpcHandleBytes, 'm'), offset, bytes, std::move(uuid),
          std::string(kCudaIpcHandleBytes, 'e')};
}

}  // namespace attn::shm::testing
