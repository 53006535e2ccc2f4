// CUDA IPC regions in the RegionRegistry (server/shm/region_registry.h, device_region.h) without
// a GPU: a fake opener stands in for device/ipc_region.h (its "device memory" is a host buffer
// the registry never dereferences). Covers the GPU UUID text form (common/gpu_uuid.h), the
// lease's checks in their documented order (handle sizes, offset, bytes, the UUID: INVALID_
// ARGUMENT; no opener or another GPU: FAILED_PRECONDITION; the limits shared with host
// regions: RESOURCE_EXHAUSTED; the opener's own error), ownership and bounds of device slices,
// and the release: the mapping is closed (and the release callback runs) only when the last pin
// is gone. The CUDA side itself runs in tests/python/test_cuda_ipc.py (label gpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/gpu_uuid.h"
#include "fake_device_region.h"
#include "shm/device_region.h"
#include "shm/region_registry.h"

namespace attn::shm {
namespace {

using testing::FakeOpener;
using testing::kUuid;

DeviceLeaseRequest Lease(int64_t bytes, int64_t offset = 0, std::string uuid = kUuid) {
  return testing::DeviceLease(bytes, offset, std::move(uuid));
}

TEST(GpuUuid, FormatsAndParsesTheOneForm) {
  const unsigned char raw[kGpuUuidBytes] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
                                             0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
  const std::string text = FormatGpuUuid(raw);
  EXPECT_EQ(text, "GPU-01234567-89ab-cdef-0123-456789abcdef");
  EXPECT_EQ(*CanonicalGpuUuid(text), text);
  EXPECT_EQ(*CanonicalGpuUuid("gpu-01234567-89AB-CDEF-0123-456789ABCDEF"), text);
  EXPECT_EQ(*CanonicalGpuUuid("01234567-89ab-cdef-0123-456789abcdef"), text);  // no prefix
  for (const std::string bad :
       {"", "GPU-", "GPU-01234567-89ab-cdef-0123-456789abcde", "GPU-01234567-89ab-cdef-0123-"
        "456789abcdef0", "GPU-0123456789ab-cdef-0123-456789abcdef-", "MIG-01234567-89ab-cdef-"
        "0123-456789abcdef", " GPU-01234567-89ab-cdef-0123-456789abcdef",
        "GPU-0123456g-89ab-cdef-0123-456789abcdef", "0"}) {
    const auto s = CanonicalGpuUuid(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("nvidia-smi -L"), std::string::npos);
  }
}

TEST(DeviceRegions, RefusedWithTheReasonWithoutAnOpenerButMalformedLeasesFirst) {
  RegionRegistry registry;
  EXPECT_FALSE(registry.accepts_device_regions());
  registry.SetDeviceOpener(nullptr, "built without CUDA: send bytes");
  DeviceLeaseRequest short_handle = Lease(64);
  short_handle.memory_handle.resize(63);
  const Status s = registry.RegisterDevice("a", short_handle).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cuda_ipc.memory_handle: expected 64 bytes"), std::string::npos)
      << s.message();
  DeviceLeaseRequest long_event = Lease(64);
  long_event.event_handle += "x";
  const std::string long_message = registry.RegisterDevice("a", long_event).status().message();
  EXPECT_EQ(long_message.rfind("cuda_ipc.event_handle: expected 64 bytes", 0), 0u) << long_message;
  EXPECT_NE(long_message.find("got 65"), std::string::npos) << long_message;
  EXPECT_EQ(registry.RegisterDevice("a", Lease(64, -1)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterDevice("a", Lease(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterDevice("a", Lease(64, 0, "GPU-nope")).status().code(),
            StatusCode::kInvalidArgument);
  const Status none = registry.RegisterDevice("a", Lease(64)).status();
  EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.message(), "built without CUDA: send bytes");
  EXPECT_EQ(registry.stats().regions, 0);
}

TEST(DeviceRegions, AnotherGpuTheLimitsAndTheOpenersErrorRegisterNothing) {
  auto opener = std::make_shared<FakeOpener>();
  RegionRegistry registry({2, 1000});
  registry.SetDeviceOpener(opener, "");
  EXPECT_TRUE(registry.accepts_device_regions());
  const Status other =
      registry.RegisterDevice("a", Lease(64, 0, "GPU-ffffffff-4567-89ef-0123-456789abcdef"))
          .status();
  EXPECT_EQ(other.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("this server computes on " + std::string(kUuid)),
            std::string::npos)
      << other.message();
  EXPECT_EQ(opener->opened, 0);  // refused before CUDA is asked
  EXPECT_EQ(registry.RegisterDevice("a", Lease(1001)).status().code(),
            StatusCode::kResourceExhausted);
  opener->fail = InvalidArgument("cuda_ipc.memory_handle: cudaIpcOpenMemHandle failed");
  EXPECT_EQ(registry.RegisterDevice("a", Lease(64)).status().message(),
            "cuda_ipc.memory_handle: cudaIpcOpenMemHandle failed");
  EXPECT_EQ(registry.stats().regions, 0);  // the reservation went back
  EXPECT_EQ(registry.stats().mapped_bytes, 0);
  opener->fail = Status::Ok();
  // The UUID reaches the opener in its canonical form; device and host regions share the limits.
  ASSERT_TRUE(registry.RegisterDevice("a", Lease(500, 0, "0123ABCD-4567-89ef-0123-456789abcdef"))
                  .ok());
  EXPECT_EQ(opener->last.device_uuid, kUuid);
  ASSERT_TRUE(registry.RegisterDevice("a", Lease(500)).ok());
  EXPECT_EQ(registry.RegisterDevice("a", Lease(1)).status().code(),
            StatusCode::kResourceExhausted);
  const RegistryStats st = registry.stats();
  EXPECT_EQ(st.regions, 2);
  EXPECT_EQ(st.device_regions, 2);
  EXPECT_EQ(st.mapped_bytes, 1000);
}

TEST(DeviceRegions, SlicesAreOwnedBoundedAndPinnedUntilTheLastCallEnds) {
  auto opener = std::make_shared<FakeOpener>();
  RegionRegistry registry;
  registry.SetDeviceOpener(opener, "");
  auto r = registry.RegisterDevice("alice", Lease(4096, 128));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 4096);
  EXPECT_EQ(r->server_event_handle, std::string(kCudaIpcHandleBytes, 's'));
  EXPECT_EQ(opener->last.offset, 128);
  auto pin = registry.Resolve("alice", {r->region_id, 1024, 512}, 512, true);
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  ASSERT_NE(pin->device(), nullptr);
  EXPECT_EQ(pin->data(), pin->device()->data() + 1024);
  EXPECT_TRUE(pin->CheckIntact().ok());  // device regions cannot shrink
  EXPECT_EQ(registry.Resolve("alice", {r->region_id, 4000, 97}, 97, false).status().code(),
            StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(registry.Resolve("bob", {r->region_id, 0, 16}, 16, false).status().code(),
            StatusCode::kNotFound);  // another identity's: as unknown
  // The lease ends while a call holds the pin: nothing closes until the pin goes.
  bool closed = false;
  EXPECT_TRUE(registry.Release(r->region_id, [&] { closed = true; }));
  EXPECT_EQ(registry.Resolve("alice", {r->region_id, 0, 16}, 16, false).status().code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(closed);
  EXPECT_EQ(opener->closed, 0);
  EXPECT_EQ(registry.stats().regions, 1);
  EXPECT_EQ(registry.stats().leased, 0);
  *pin = PinnedSlice();
  EXPECT_TRUE(closed);
  EXPECT_EQ(opener->closed, 1);
  EXPECT_EQ(registry.stats().regions, 0);
  EXPECT_EQ(registry.stats().device_regions, 0);
  // Unpinned: closed inside Release; an unknown id runs nothing.
  auto s = registry.RegisterDevice("alice", Lease(64));
  ASSERT_TRUE(s.ok());
  int runs = 0;
  EXPECT_TRUE(registry.Release(s->region_id, [&] { ++runs; }));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(opener->closed, 2);
  EXPECT_FALSE(registry.Release(s->region_id, [&] { ++runs; }));
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace attn::shm
