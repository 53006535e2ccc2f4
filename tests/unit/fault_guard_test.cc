// The SIGBUS guard (server/shm/fault_guard.h): a fault inside a guarded mapping becomes zero
// pages and a broken flag; a fault anywhere else goes to the handler installed before the guard,
// or, when there was none, kills the process with SIGBUS as it would have without the guard.
// The chaining cases run as death tests in a fresh process each ("threadsafe" style), so the
// guard is installed there after the test's own handler.
#include "shm/fault_guard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace attn::shm {
namespace {

/// A MAP_SHARED page of an unlinked temporary file truncated to 0 bytes after mapping: any
/// touch raises SIGBUS. Not guarded.
volatile uint8_t *FaultingPage() {
  char path[] = "/tmp/attn-fault-guard-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return nullptr;
  unlink(path);
  if (ftruncate(fd, 4096) != 0) return nullptr;
  void *p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED || ftruncate(fd, 0) != 0) return nullptr;  // now every touch faults
  close(fd);
  return static_cast<volatile uint8_t *>(p);
}

void ExitOnSigbus(int, siginfo_t *, void *) { _exit(42); }

TEST(FaultGuardDeathTest, AFaultOutsideEveryMappingReachesThePreviousHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = ExitOnSigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, nullptr);
        if (!InstallFaultGuard().ok()) _exit(1);
        volatile uint8_t *p = FaultingPage();
        if (p == nullptr) _exit(2);
        (void)p[0];
        _exit(0);  // not reached: the fault goes to ExitOnSigbus
      },
      ::testing::ExitedWithCode(42), "");
}

TEST(FaultGuardDeathTest, WithoutAPreviousHandlerTheFaultKillsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        signal(SIGBUS, SIG_DFL);
        if (!InstallFaultGuard().ok()) _exit(1);
        volatile uint8_t *p = FaultingPage();
        if (p == nullptr) _exit(2);
        (void)p[0];
        _exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(FaultGuard, AFaultInsideAGuardedMappingBecomesZeroPages) {
  ASSERT_TRUE(InstallFaultGuard().ok());
  volatile uint8_t *p = FaultingPage();
  ASSERT_NE(p, nullptr);
  const int slot = GuardMapping(const_cast<uint8_t *>(p), 4096);
  ASSERT_GE(slot, 0);
  EXPECT_FALSE(MappingBroken(slot));
  EXPECT_EQ(p[100], 0);  // faulted, remapped, read again
  EXPECT_TRUE(MappingBroken(slot));
  p[200] = 7;  // private zero pages now: writable, no fault
  EXPECT_EQ(p[200], 7);
  UnguardMapping(slot);
  EXPECT_FALSE(MappingBroken(slot));  // the slot is free again
  munmap(const_cast<uint8_t *>(p), 4096);
}

TEST(FaultGuard, SlotsAreReused) {
  const int before = GuardedMappings();
  static uint8_t a[64], b[64];
  const int sa = GuardMapping(a, sizeof a);
  const int sb = GuardMapping(b, sizeof b);
  ASSERT_GE(sa, 0);
  ASSERT_GE(sb, 0);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(GuardedMappings(), before + 2);
  UnguardMapping(sa);
  UnguardMapping(sa);  // twice: no effect
  EXPECT_EQ(GuardedMappings(), before + 1);
  const int sc = GuardMapping(a, sizeof a);
  EXPECT_EQ(sc, sa);
  UnguardMapping(sb);
  UnguardMapping(sc);
  EXPECT_EQ(GuardedMappings(), before);
}

}  // namespace
}  // namespace attn::shm
