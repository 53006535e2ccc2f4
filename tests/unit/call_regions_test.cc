// CallRegions (server/service/call_regions.h): a packed call's region fields resolved in the
// caller's regions, errors naming the field, pins that keep a released region's bytes, the
// check after the call that names the field whose region shrank, and CUDA IPC slices (a fake
// opener: one device region per call, which fields are on it, host slices beside it).
#include "service/call_regions.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "fake_device_region.h"
#include "shm_test_object.h"

namespace attn {
namespace {

using shm::testing::ShmObject;

attention::v1::RegionSlice Slice(const std::string &id, int64_t offset, int64_t bytes) {
  attention::v1::RegionSlice s;
  s.set_region_id(id);
  s.set_offset(offset);
  s.set_bytes(bytes);
  return s;
}

TEST(CallRegions, ResolvesPinsAndNamesTheField) {
  ShmObject obj(8192);
  ASSERT_TRUE(obj.ok());
  obj.view()[4096] = 5;
  shm::RegionRegistry registry;
  auto r = registry.Register("alice", obj.name(), 8192);
  ASSERT_TRUE(r.ok());
  CallRegions call(&registry, "alice");
  auto q = call.Resolve("q_region", Slice(r->region_id, 4096, 16), 16, false);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(static_cast<uint8_t *>(*q)[0], 5);
  auto o = call.Resolve("o_region", Slice(r->region_id, 0, 4096), 4096, true);
  ASSERT_TRUE(o.ok());
  static_cast<uint8_t *>(*o)[1] = 6;
  EXPECT_EQ(obj.view()[1], 6);
  const Status big = call.Resolve("k_region", Slice(r->region_id, 0, 4096), 4097, false).status();
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message().rfind("k_region: ", 0), 0u) << big.message();
  const Status huge =
      call.Resolve("v_region", Slice(r->region_id, 0, 1), uint64_t{1} << 63, false).status();
  EXPECT_EQ(huge.code(), StatusCode::kInvalidArgument);
  CallRegions bob(&registry, "bob");
  const Status foreign = bob.Resolve("q_region", Slice(r->region_id, 0, 16), 16, false).status();
  EXPECT_EQ(foreign.code(), StatusCode::kNotFound);
  EXPECT_EQ(foreign.message().rfind("q_region: ", 0), 0u);
  EXPECT_EQ(call.pinned(), 2u);  // failures pin nothing
  ASSERT_TRUE(registry.Release(r->region_id));
  EXPECT_EQ(static_cast<uint8_t *>(*q)[0], 5);  // still mapped for this call
  EXPECT_TRUE(call.CheckIntact().ok());
}

TEST(CallRegions, AnOutputRangeMustNotOverlapAnother) {
  ShmObject obj(8192);
  ASSERT_TRUE(obj.ok());
  shm::RegionRegistry registry;
  auto r = registry.Register("a", obj.name(), 8192);
  ASSERT_TRUE(r.ok());
  CallRegions call(&registry, "a");
  ASSERT_TRUE(call.Resolve("q_region", Slice(r->region_id, 0, 1024), 1024, false).ok());
  ASSERT_TRUE(call.Resolve("k_region", Slice(r->region_id, 512, 1024), 1024, false).ok());
  const Status s = call.Resolve("o_region", Slice(r->region_id, 1535, 16), 16, true).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("o_region: overlaps k_region"), std::string::npos) << s.message();
  EXPECT_TRUE(call.Resolve("o_region", Slice(r->region_id, 1536, 16), 16, true).ok());
  EXPECT_FALSE(call.Resolve("v_region", Slice(r->region_id, 1540, 4), 4, false).ok());
}

TEST(CallRegions, NoRegistryRefusesEveryField) {
  CallRegions call(nullptr, "a");
  const Status s = call.Resolve("q_region", Slice(std::string(32, 'a'), 0, 16), 16, false).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(CallRegions, CheckIntactNamesTheShrunkField) {
  ShmObject in(4096), out(4096);
  ASSERT_TRUE(in.ok() && out.ok());
  shm::RegionRegistry registry;
  auto a = registry.Register("a", in.name(), 4096);
  auto b = registry.Register("a", out.name(), 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  CallRegions call(&registry, "a");
  auto q = call.Resolve("q_region", Slice(a->region_id, 0, 4096), 4096, false);
  auto o = call.Resolve("o_region", Slice(b->region_id, 0, 4096), 4096, true);
  ASSERT_TRUE(q.ok() && o.ok());
  ASSERT_TRUE(out.Truncate(0));
  static_cast<volatile uint8_t *>(*o)[0] = 1;  // faults once, then writes to zero pages
  const Status s = call.CheckIntact();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message().rfind("o_region: region ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("shrank below its registered size"), std::string::npos);
}

TEST(CallRegions, DeviceSlicesOfOneCallLieInOneRegion) {
  ShmObject host(4096);
  ASSERT_TRUE(host.ok());
  auto opener = std::make_shared<shm::testing::FakeOpener>();
  shm::RegionRegistry registry;
  registry.SetDeviceOpener(opener, "");
  auto d1 = registry.RegisterDevice("a", shm::testing::DeviceLease(8192));
  auto d2 = registry.RegisterDevice("a", shm::testing::DeviceLease(8192));
  auto h = registry.Register("a", host.name(), 4096);
  ASSERT_TRUE(d1.ok() && d2.ok() && h.ok());
  CallRegions call(&registry, "a");
  EXPECT_EQ(call.device(), nullptr);
  auto q = call.Resolve("packed.q_region", Slice(d1->region_id, 0, 1024), 1024, false);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_NE(call.device(), nullptr);
  EXPECT_EQ(static_cast<uint8_t *>(*q), call.device()->data());  // a device address
  ASSERT_TRUE(call.Resolve("packed.k_region", Slice(h->region_id, 0, 1024), 1024, false).ok());
  const Status second =
      call.Resolve("packed.v_region", Slice(d2->region_id, 0, 1024), 1024, false).status();
  EXPECT_EQ(second.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(second.message().find("packed.v_region: names a second CUDA IPC region"),
            std::string::npos)
      << second.message();
  ASSERT_TRUE(call.Resolve("packed.v_region", Slice(d1->region_id, 1024, 1024), 1024, false).ok());
  // o overlapping q in the device region is refused as in a host region.
  EXPECT_FALSE(call.Resolve("packed.o_region", Slice(d1->region_id, 512, 1024), 1024, true).ok());
  ASSERT_TRUE(call.Resolve("packed.o_region", Slice(d1->region_id, 2048, 1024), 1024, true).ok());
  EXPECT_TRUE(call.OnDevice("packed.q_region"));
  EXPECT_FALSE(call.OnDevice("packed.k_region"));  // host shared memory
  EXPECT_TRUE(call.OnDevice("packed.v_region"));
  EXPECT_TRUE(call.OnDevice("packed.o_region"));
  EXPECT_FALSE(call.OnDevice("packed.nothing"));
  EXPECT_TRUE(call.CheckIntact().ok());
  EXPECT_EQ(call.pinned(), 4u);
}

}  // namespace
}  // namespace attn
