#include "shm/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

namespace attn::shm {
namespace {

// One guarded mapping. `seq` is the slot's seqlock: odd while the slot is being (re)written, so
// the handler skips it; the handler reads begin/end between two equal even values of `seq`.
// end == 0: the slot is free.
struct Slot {
  std::atomic<uint32_t> seq{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> broken{false};
};

static_assert(std::atomic<uintptr_t>::is_always_lock_free, "the handler needs lock-free atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the handler needs lock-free atomics");

Slot g_slots[kMaxGuardedMappings];
// Slots [0, g_high) may be in use: the handler scans no further.
std::atomic<int> g_high{0};
// Allocation state, outside the handler's view (taken under g_alloc_mu only).
std::mutex g_alloc_mu;
bool g_in_use[kMaxGuardedMappings];
int g_guarded = 0;
// The SIGBUS disposition before ours: written once, before our handler is installed.
struct sigaction g_previous;

/// Writes a slot's range under its seqlock (writers are serialised by g_alloc_mu).
void WriteSlot(Slot &s, uintptr_t begin, uintptr_t end) {
  const uint32_t q = s.seq.load(std::memory_order_relaxed);
  s.seq.store(q + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.begin.store(begin, std::memory_order_relaxed);
  s.end.store(end, std::memory_order_relaxed);
  s.broken.store(false, std::memory_order_relaxed);
  s.seq.store(q + 2, std::memory_order_release);
}

/// The slot whose stable range holds `addr`, or -1. Async-signal-safe.
int FindSlot(uintptr_t addr) {
  const int high = g_high.load(std::memory_order_acquire);
  for (int i = 0; i < high; ++i) {
    Slot &s = g_slots[i];
    const uint32_t q1 = s.seq.load(std::memory_order_acquire);
    if (q1 & 1u) continue;
    const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
    const uintptr_t end = s.end.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != q1) continue;
    if (end != 0 && addr >= begin && addr < end) return i;
  }
  return -1;
}

/// Hands a fault the guard does not own to the previous disposition. Async-signal-safe.
void Chain(int sig, siginfo_t *info, void *context) {
  const bool from_fault = info != nullptr && info->si_code > 0;  // not kill(2) / sigqueue(3)
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction != nullptr) g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN && !from_fault) return;  // an ignored SIGBUS from a peer
  if (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN) {
    // The default action, as without the guard: restore it and let the signal come again (a
    // fault re-executes the access when the handler returns; a sent signal is raised again and
    // delivered once this handler returns, SIGBUS being blocked while it runs).
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, nullptr);
    if (!from_fault) raise(SIGBUS);
    return;
  }
  g_previous.sa_handler(sig);
}

void OnSigbus(int sig, siginfo_t *info, void *context) {
  const int saved_errno = errno;
  const int slot = (info != nullptr && info->si_code > 0)
                       ? FindSlot(reinterpret_cast<uintptr_t>(info->si_addr))
                       : -1;
  if (slot >= 0) {
    Slot &s = g_slots[slot];
    const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
    const uintptr_t end = s.end.load(std::memory_order_relaxed);
    // Zero pages over the whole mapping (the object may have shrunk anywhere); a second fault
    // in the same mapping on another thread maps them again, which is harmless.
    void *p = mmap(reinterpret_cast<void *>(begin), end - begin, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      s.broken.store(true, std::memory_order_release);
      errno = saved_errno;
      return;
    }
  }
  Chain(sig, info, context);
  errno = saved_errno;
}

Status Install() {
  if (sigaction(SIGBUS, nullptr, &g_previous) != 0) {
    return Internal(std::string("sigaction(SIGBUS) query failed: ") + std::strerror(errno));
  }
  struct sigaction ours;
  std::memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = OnSigbus;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  if (sigaction(SIGBUS, &ours, nullptr) != 0) {
    return Internal(std::string("sigaction(SIGBUS) failed: ") + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Status InstallFaultGuard() {
  static const Status installed = Install();
  return installed;
}

int GuardMapping(void *begin, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(begin);
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  for (int i = 0; i < kMaxGuardedMappings; ++i) {
    if (g_in_use[i]) continue;
    g_in_use[i] = true;
    ++g_guarded;
    WriteSlot(g_slots[i], b, b + bytes);
    if (i >= g_high.load(std::memory_order_relaxed)) {
      g_high.store(i + 1, std::memory_order_release);
    }
    return i;
  }
  return -1;
}

void UnguardMapping(int slot) {
  if (slot < 0 || slot >= kMaxGuardedMappings) return;
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  if (!g_in_use[slot]) return;
  WriteSlot(g_slots[slot], 0, 0);
  g_in_use[slot] = false;
  --g_guarded;
}

bool MappingBroken(int slot) {
  if (slot < 0 || slot >= kMaxGuardedMappings) return false;
  return g_slots[slot].broken.load(std::memory_order_acquire);
}

int GuardedMappings() {
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  return g_guarded;
}

}  // namespace attn::shm
