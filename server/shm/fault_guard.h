// The SIGBUS guard of shared-memory mappings (issue 18): a client that maps a POSIX shm object
// it shares with the server can ftruncate it smaller at any time; the server's next touch of a
// page past the new end raises SIGBUS, which would kill the process. As Wayland compositors do
// for wl_shm pools, a SIGBUS handler finds the faulting address inside a guarded mapping,
// replaces the whole mapping with anonymous zero pages (mmap MAP_FIXED | MAP_PRIVATE |
// MAP_ANONYMOUS, same address and length) and marks it broken; the faulting access then runs
// again on zeros, and the code that used the mapping checks MappingBroken() after use and fails
// its call instead of returning what it read. A fault outside every guarded mapping (or one sent
// by kill(2)) goes to the handler that was installed before this one (its default action when it
// had none: the process dies as it would have without the guard).
//
// The table the handler reads is a fixed array of kMaxGuardedMappings slots, each a seqlock over
// [begin, end): the handler takes no lock, allocates nothing and calls only mmap(2) (a plain
// system call; not on POSIX's async-signal-safe list, but what every wl_shm implementation
// relies on) and sigaction(2).
//
// Thread-safety: every function is safe from any thread. A slot must only be unguarded once no
// thread can touch its mapping any more (the mapping is unmapped right after).
#pragma once

#include <cstddef>

#include "attn/common/status.h"

namespace attn::shm {

/// Slots in the guard table: the most mappings guarded at once in this process.
inline constexpr int kMaxGuardedMappings = 4096;

/// Installs the SIGBUS handler (once per process; later calls return the first call's result).
/// The handler installed before it, if any, receives every fault the guard does not own.
/// Errors: INTERNAL naming errno when sigaction fails.
Status InstallFaultGuard();

/// Guards the mapping [begin, begin + bytes) (bytes > 0): a SIGBUS inside it replaces it with
/// zero pages and marks the slot broken. Returns the slot (>= 0), or -1 when all
/// kMaxGuardedMappings slots are taken.
int GuardMapping(void *begin, size_t bytes);

/// Frees `slot` (from GuardMapping). Call before unmapping, once nothing touches the mapping.
void UnguardMapping(int slot);

/// True once a fault inside `slot`'s mapping has replaced it with zero pages.
bool MappingBroken(int slot);

/// Mappings guarded now (for tests).
int GuardedMappings();

}  // namespace attn::shm
