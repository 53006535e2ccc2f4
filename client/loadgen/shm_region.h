// ShmRegion: a host POSIX shared-memory region leased to the server (SequenceService.
// SharedMemoryLease, sequence.proto), through which the loadgen's packed decode APIs pass q, k,
// v and o instead of carrying their bytes in the message (--region host; issue 18 item 3).
//
// The loadgen creates the object (shm_open O_CREAT|O_EXCL, ftruncate, mmap), opens a
// SharedMemoryLease stream whose one request names it, and waits for the server's region id;
// the stream stays open for the region's life. The destructor half-closes the stream, waits for
// its end (the server has unmapped the region), unmaps and unlinks. Same machine only: the
// server opens the name in its own /dev/shm.
//
// Layout for a group of G sessions decoding one query token each (PackedLayout): four arrays
// of G rows, each starting on a 64-byte boundary: q (G, N, H), k (G, K, H), v (G, K, H),
// o (G, N, H), in the group's dtype. A packed batch whose first session is the group's row r
// uses rows [r, r + steps) of each array, so micro-batches in flight together never share rows.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "attention/v1/sequence.grpc.pb.h"

namespace attn::loadgen {

/// Byte offsets of the four arrays in a region and the bytes of one row of each.
struct PackedLayout {
  int64_t q = 0, k = 0, v = 0, o = 0;  // offsets from the region's start
  int64_t q_row = 0;                   // N * H * itemsize (also o's row)
  int64_t kv_row = 0;                  // K * H * itemsize
  int64_t bytes = 0;                   // the region's size

  /// The layout for `rows` rows of N = heads, K = kv_heads, H = head_dim of `itemsize` bytes.
  static PackedLayout For(int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          int64_t itemsize);
};

class ShmRegion {
 public:
  /// Creates a region of `bytes` (>= 1) and leases it on `stub`'s server; waits up to
  /// `timeout_ms` for the lease (then cancels it: CANCELLED). On failure returns null and sets
  /// *code (the server's refusal, e.g. NOT_FOUND for a server on another machine; INTERNAL
  /// when shm_open/ftruncate/mmap failed here) and *error ("what: why").
  static std::unique_ptr<ShmRegion> Create(attention::v1::SequenceService::Stub* stub,
                                           int64_t bytes, int64_t timeout_ms,
                                           grpc::StatusCode* code, std::string* error);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  char* data() const { return base_; }
  int64_t bytes() const { return bytes_; }
  const std::string& region_id() const { return region_id_; }
  const std::string& name() const { return name_; }

  /// Sets `slice` to [offset, offset + bytes) of this region.
  void Slice(int64_t offset, int64_t bytes, attention::v1::RegionSlice* slice) const;

 private:
  ShmRegion() = default;

  std::string name_;
  char* base_ = nullptr;
  int64_t bytes_ = 0;
  std::string region_id_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<attention::v1::SharedMemoryLeaseRequest,
                                           attention::v1::SharedMemoryLeaseResponse>>
      lease_;
};

}  // namespace attn::loadgen
