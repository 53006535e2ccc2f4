// The memory this process may use (its cgroup's limit or the host's RAM), and the default gRPC
// transport quota derived from it (--grpc-memory-bytes).
//
// Why the quota scales: when gRPC's ResourceQuota is exhausted its reclaimers cancel open
// streams at random (RST_STREAM ENHANCE_YOUR_CALM, seen by clients as RESOURCE_EXHAUSTED
// "Received RST_STREAM with error code 11") and send GOAWAY to idle connections (UNAVAILABLE
// on their next call): legitimate load loses calls. A fixed 1 GiB quota did this on an H200 host
// to 64 sessions prefilling 4096 tokens at once (64 x ~50 MB requests; bench/NOTES.md, device
// call 6), though the host had 128 GiB. A quarter of the process's memory keeps the bound
// (a hostile client cannot make the transport take all of it) and fits such bursts.
#pragma once

#include <cstdint>
#include <string_view>

namespace attn {

/// Bytes in a cgroup memory limit file: v2 `memory.max` ("max" or a count) or v1
/// `memory.limit_in_bytes` (a count; values at or above 2^62 mean unlimited). Returns the
/// limit, or -1 when the text says unlimited or is not a count.
int64_t ParseCgroupMemoryLimit(std::string_view text);

/// MemTotal of /proc/meminfo text ("MemTotal:  131072000 kB"), in bytes; -1 when absent.
int64_t ParseMemTotal(std::string_view meminfo);

/// The smallest of this process's cgroup limit (v2 /sys/fs/cgroup/memory.max, else v1
/// /sys/fs/cgroup/memory/memory.limit_in_bytes) and the host's MemTotal, in bytes; -1 when
/// none can be read.
int64_t ProcessMemoryLimit();

/// The default --grpc-memory-bytes for a process limited to `memory_limit` bytes (-1:
/// unknown): a quarter of it rounded down to whole MiB (whole GiB from 4 GiB on), never below
/// 1 GiB (the fixed default before) nor below
/// 2 x `max_message_bytes` (the largest request must fit; server/main.cc refuses less).
int64_t DefaultGrpcMemoryBytes(int64_t memory_limit, int64_t max_message_bytes);

}  // namespace attn
