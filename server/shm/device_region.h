// CUDA IPC regions (issue 18 item 3; sequence.proto CudaIpcRegion): a client's device allocation
// on the server's GPU, registered in the same RegionRegistry as host regions (kind = device),
// with the same ids, owners, limits, bounds checks and pins. This header is the seam only: no
// CUDA types (device addresses are plain pointers, events opaque `void *` standing for
// cudaEvent_t). The CUDA side is device/ipc_region.h; the composition root (startup/
// cuda_ipc_opener.h) installs an opener over it when the KV cache is on the GPU, so a server
// without one (no CUDA, no device, --kv-device=cpu) refuses device leases with
// FAILED_PRECONDITION and its reason.
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attn/common/status.h"

namespace attn::shm {

/// Bytes of cudaIpcMemHandle_t and of cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;

/// A device lease as the registry checked it (sequence.proto SharedMemoryLeaseRequest with
/// cuda_ipc): handles of kCudaIpcHandleBytes, offset >= 0, bytes >= 1, the UUID canonical and
/// the opener's.
struct DeviceLeaseRequest {
  std::string memory_handle;  ///< cudaIpcMemHandle_t bytes
  int64_t offset = 0;         ///< bytes from the allocation's base to the region's first byte
  int64_t bytes = 0;          ///< the region's size
  std::string device_uuid;    ///< "GPU-" + 8-4-4-4-12 lowercase hex (common/gpu_uuid.h)
  std::string event_handle;   ///< cudaIpcEventHandle_t bytes of the client's event
};

/// One opened CUDA IPC region: the mapping, the client's event, and the server's own event with
/// the stream that orders its records. Destroying it closes all of them (cudaIpcCloseMemHandle
/// after the stream drained); the registry does so when the last pin of a released region goes.
class DeviceRegion {
 public:
  virtual ~DeviceRegion() = default;
  /// Device address (in the server's address space) of the region's first byte.
  virtual uint8_t *data() const = 0;
  /// The region's size in bytes.
  virtual int64_t bytes() const = 0;
  /// The client's event (a cudaEvent_t): a stream waits on it before reading inputs.
  virtual void *client_event() const = 0;
  /// The IPC handle of the server's event (kCudaIpcHandleBytes), for the lease response.
  virtual const std::string &server_event_handle() const = 0;
  /// Enqueues zeroing `bytes` bytes at device address `at` (inside the region) on the region's
  /// stream. Errors: INTERNAL naming the CUDA call.
  virtual Status Zero(uint8_t *at, int64_t bytes) = 0;
  /// After a call's last access to the region (its copies done or enqueued on the region's
  /// stream): records the server's event on that stream and waits for it, so the call's
  /// response implies the writes are complete. Errors: INTERNAL naming the CUDA call.
  virtual Status SignalWritten() = 0;
};

/// Opens device leases on the server's GPU.
class DeviceRegionOpener {
 public:
  virtual ~DeviceRegionOpener() = default;
  /// The server's GPU in common/gpu_uuid.h form; leases naming another are refused.
  virtual const std::string &device_uuid() const = 0;
  /// Opens the allocation and the client's event, makes the server's event, and checks that
  /// [offset, offset + bytes) lies inside the allocation. Errors: INVALID_ARGUMENT (a handle
  /// or event CUDA cannot open here, naming CUDA's error; the range beyond the allocation, both
  /// sizes named), INTERNAL (the server's own event or stream cannot be made). Nothing stays
  /// open on error.
  virtual StatusOr<std::unique_ptr<DeviceRegion>> Open(const DeviceLeaseRequest &request) = 0;
};

}  // namespace attn::shm
