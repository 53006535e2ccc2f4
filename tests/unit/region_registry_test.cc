// RegionRegistry (server/shm/region_registry.h): registration and its errors, the limits,
// ownership (another identity's region is NOT_FOUND exactly as an unknown one), slice bounds
// without overflow, a pin outliving its lease's release, and a client that truncates its object
// under the server (the SIGBUS guard: zeros, no crash, FAILED_PRECONDITION).
#include "shm/region_registry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "shm/fault_guard.h"
#include "shm/shm_mapping.h"
#include "shm_test_object.h"

namespace attn::shm {
namespace {

using testing::ShmObject;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::string Replace(std::string s, const std::string &from, const std::string &to) {
  const size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(ShmName, AcceptsOnlySlashAndTheCharacterSet) {
  EXPECT_TRUE(ValidateShmName("/a").ok());
  EXPECT_TRUE(ValidateShmName("/Frontend_0.q-k-v").ok());
  EXPECT_TRUE(ValidateShmName("/" + std::string(200, 'x')).ok());
  for (const std::string &bad : std::vector<std::string>{"", "/", "a", "//a", "/a/b", "/a b", "/a\n", "/é", "/.", "/..",
                                "/a*", "/" + std::string(201, 'x')}) {
    const Status s = ValidateShmName(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("[A-Za-z0-9._-]"), std::string::npos) << s.message();
  }
}

TEST(RegionRegistry, RegistersAndResolvesTheClientsBytes) {
  ShmObject obj(8192);
  ASSERT_TRUE(obj.ok());
  for (int i = 0; i < 8192; ++i) obj.view()[i] = static_cast<uint8_t>(i * 7);
  RegionRegistry registry;
  auto r = registry.Register("alice", obj.name(), 8192);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->region_id.size(), kRegionIdHexDigits);
  EXPECT_EQ(r->region_id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(r->bytes, 8192);
  auto in = registry.Resolve("alice", {r->region_id, 100, 50}, 50, false);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->mutable_data(), nullptr);  // not resolved for writing
  for (int i = 0; i < 50; ++i) ASSERT_EQ(in->data()[i], static_cast<uint8_t>((100 + i) * 7));
  auto out = registry.Resolve("alice", {r->region_id, 4096, 4096}, 4096, true);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  out->mutable_data()[0] = 0xab;  // the server's write is the client's byte
  EXPECT_EQ(obj.view()[4096], 0xab);
  EXPECT_TRUE(in->CheckIntact().ok());
  const RegistryStats st = registry.stats();
  EXPECT_EQ(st.regions, 1);
  EXPECT_EQ(st.leased, 1);
  EXPECT_EQ(st.mapped_bytes, 8192);
}

TEST(RegionRegistry, TwoRegistrationsOfOneObjectGetDistinctIds) {
  ShmObject obj(4096);
  ASSERT_TRUE(obj.ok());
  RegionRegistry registry;
  auto a = registry.Register("alice", obj.name(), 4096);
  auto b = registry.Register("alice", obj.name(), 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->region_id, b->region_id);
}

TEST(RegionRegistry, RegisterErrors) {
  ShmObject obj(4096);
  ASSERT_TRUE(obj.ok());
  RegionRegistry registry;
  EXPECT_EQ(registry.Register("a", "/attn-unit-no-such-object", 16).status().code(),
            StatusCode::kNotFound);
  const Status small = registry.Register("a", obj.name(), 4097).status();
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("4096 bytes, fewer than the 4097"), std::string::npos)
      << small.message();
  EXPECT_EQ(registry.Register("a", obj.name(), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register("a", "no-slash", 16).status().code(),
            StatusCode::kInvalidArgument);
  const std::string dir = "/attn-unit-dir-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(("/dev/shm" + dir).c_str(), 0700), 0);
  EXPECT_EQ(registry.Register("a", dir, 16).status().code(), StatusCode::kInvalidArgument);
  rmdir(("/dev/shm" + dir).c_str());
  const RegistryStats st = registry.stats();
  EXPECT_EQ(st.regions, 0);  // nothing stays reserved after a failure
  EXPECT_EQ(st.mapped_bytes, 0);
}

TEST(RegionRegistry, AnotherIdentitysRegionIsNotFoundLikeAnUnknownOne) {
  ShmObject obj(4096);
  ASSERT_TRUE(obj.ok());
  RegionRegistry registry;
  auto r = registry.Register("alice", obj.name(), 4096);
  ASSERT_TRUE(r.ok());
  const std::string unknown(32, 'f');
  const Status foreign = registry.Resolve("bob", {r->region_id, 0, 16}, 16, false).status();
  const Status missing = registry.Resolve("bob", {unknown, 0, 16}, 16, false).status();
  EXPECT_EQ(foreign.code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_EQ(Replace(foreign.message(), r->region_id, "ID"),
            Replace(missing.message(), unknown, "ID"));
  // Even out of bounds: the foreign region's size is never revealed.
  EXPECT_EQ(registry.Resolve("bob", {r->region_id, 4096, 16}, 16, false).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(registry.Resolve("", {r->region_id, 0, 16}, 16, false).status().code(),
            StatusCode::kNotFound);
  EXPECT_TRUE(registry.Resolve("alice", {r->region_id, 0, 16}, 16, false).ok());
}

TEST(RegionRegistry, SliceBoundsWithoutOverflow) {
  ShmObject obj(4096);
  ASSERT_TRUE(obj.ok());
  RegionRegistry registry;
  auto r = registry.Register("a", obj.name(), 4096);
  ASSERT_TRUE(r.ok());
  const std::string id = r->region_id;
  struct Case {
    int64_t offset, bytes, expected;
    StatusCode code;
  };
  const Case cases[] = {
      {0, 4096, 4096, StatusCode::kOk},
      {4095, 1, 1, StatusCode::kOk},
      {-1, 16, 16, StatusCode::kInvalidArgument},
      {0, 0, 0, StatusCode::kInvalidArgument},
      {0, -5, -5, StatusCode::kInvalidArgument},
      {0, 16, 32, StatusCode::kInvalidArgument},  // not what the tensor needs
      {4096, 1, 1, StatusCode::kInvalidArgument},
      {4000, 97, 97, StatusCode::kInvalidArgument},
      {0, 4097, 4097, StatusCode::kInvalidArgument},
      {kMax, 1, 1, StatusCode::kInvalidArgument},
      {1, kMax, kMax, StatusCode::kInvalidArgument},  // offset + bytes overflows int64
      {kMax, kMax, kMax, StatusCode::kInvalidArgument},
  };
  for (const Case &c : cases) {
    auto s = registry.Resolve("a", {id, c.offset, c.bytes}, c.expected, false);
    EXPECT_EQ(s.status().code(), c.code) << c.offset << " +" << c.bytes << ": "
                                         << s.status().ToString();
  }
}

TEST(RegionRegistry, LimitsOnRegionsAndBytes) {
  ShmObject obj(8192);
  ASSERT_TRUE(obj.ok());
  RegionRegistry registry({/*max_regions=*/2, /*max_bytes=*/12288});
  auto a = registry.Register("a", obj.name(), 8192);
  auto b = registry.Register("b", obj.name(), 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  const Status regions = registry.Register("c", obj.name(), 1).status();
  EXPECT_EQ(regions.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(regions.message().find("--max-shared-memory-regions"), std::string::npos);
  ASSERT_TRUE(registry.Release(b->region_id));
  const Status bytes = registry.Register("c", obj.name(), 4097).status();
  EXPECT_EQ(bytes.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(bytes.message().find("--max-shared-memory-bytes"), std::string::npos);
  EXPECT_TRUE(registry.Register("c", obj.name(), 4096).ok());
  RegionRegistry off({0, 1 << 20});
  EXPECT_EQ(off.Register("a", obj.name(), 1).status().code(), StatusCode::kResourceExhausted);
}

TEST(RegionRegistry, APinOutlivesTheRelease) {
  ShmObject obj(4096);
  ASSERT_TRUE(obj.ok());
  obj.view()[10] = 42;
  RegionRegistry registry({1, 1 << 20});
  const int guarded = GuardedMappings();
  auto r = registry.Register("a", obj.name(), 4096);
  ASSERT_TRUE(r.ok());
  auto pin = registry.Resolve("a", {r->region_id, 0, 4096}, 4096, true);
  ASSERT_TRUE(pin.ok());
  EXPECT_TRUE(registry.Release(r->region_id));
  EXPECT_FALSE(registry.Release(r->region_id));  // once
  EXPECT_EQ(registry.Resolve("a", {r->region_id, 0, 16}, 16, false).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(pin->data()[10], 42);  // still mapped
  pin->mutable_data()[11] = 43;
  EXPECT_EQ(obj.view()[11], 43);
  RegistryStats st = registry.stats();
  EXPECT_EQ(st.leased, 0);
  EXPECT_EQ(st.regions, 1);  // counted against the limits while pinned
  EXPECT_EQ(registry.Register("a", obj.name(), 16).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(GuardedMappings(), guarded + 1);
  *pin = PinnedSlice();  // the last pin: unmapped now
  st = registry.stats();
  EXPECT_EQ(st.regions, 0);
  EXPECT_EQ(st.mapped_bytes, 0);
  EXPECT_EQ(GuardedMappings(), guarded);
  EXPECT_TRUE(registry.Register("a", obj.name(), 16).ok());
}

TEST(RegionRegistry, ATruncatedObjectReadsZerosAndFailsTheCall) {
  constexpr int64_t kBytes = 64 * 1024;
  ShmObject obj(kBytes);
  ASSERT_TRUE(obj.ok());
  for (int64_t i = 0; i < kBytes; ++i) obj.view()[i] = 1;
  RegionRegistry registry;
  auto r = registry.Register("a", obj.name(), kBytes);
  ASSERT_TRUE(r.ok());
  auto in = registry.Resolve("a", {r->region_id, 0, kBytes}, kBytes, false);
  auto out = registry.Resolve("a", {r->region_id, 0, kBytes}, kBytes, true);
  ASSERT_TRUE(in.ok() && out.ok());
  EXPECT_EQ(in->data()[0], 1);  // touched before the attack: mapped
  ASSERT_TRUE(obj.Truncate(0));
  // Without the guard this read raises SIGBUS and kills the test.
  const volatile uint8_t *p = in->data();
  int64_t sum = 0;
  for (int64_t i = 0; i < kBytes; ++i) sum += p[i];
  EXPECT_EQ(sum, 0);  // zero pages everywhere, even the page read before the truncation
  out->mutable_data()[kBytes - 1] = 9;  // a write no longer reaches the client; no crash
  const Status s = in->CheckIntact();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("shrank below its registered size"), std::string::npos);
  EXPECT_EQ(out->CheckIntact().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.Resolve("a", {r->region_id, 0, 16}, 16, false).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.stats().broken_total, 1);  // counted once per region
}

TEST(RegionRegistry, AnUntouchedRegionIsIntact) {
  ShmObject obj(4096);
  ASSERT_TRUE(obj.ok());
  RegionRegistry registry;
  auto r = registry.Register("a", obj.name(), 4096);
  ASSERT_TRUE(r.ok());
  auto pin = registry.Resolve("a", {r->region_id, 0, 4096}, 4096, false);
  ASSERT_TRUE(pin.ok());
  EXPECT_TRUE(pin->CheckIntact().ok());
  EXPECT_TRUE(PinnedSlice().CheckIntact().ok());
}

}  // namespace
}  // namespace attn::shm
