// CUDA IPC on the server's GPU (issue 18 item 3; sequence.proto CudaIpcRegion): a client's
// device allocation opened with cudaIpcOpenMemHandle, the client's interprocess event opened
// with cudaIpcOpenEventHandle, and the server's own interprocess event (cudaEventInterprocess |
// cudaEventDisableTiming, exported with cudaIpcGetEventHandle) recorded on a stream of the
// region's own. The allocation's size is read with the driver's cuMemGetAddressRange (reached
// through cudaGetDriverEntryPointByVersion: the server does not link libcuda, so a CUDA build
// still starts on a machine without a driver) and the region [offset, offset + bytes) must lie
// inside it. This file knows nothing of the registry (shm/ is not below device/); the
// composition root adapts it (startup/cuda_ipc_opener.h).
// CUDA builds only. Thread-safety: an IpcRegion may be used from any thread (CUDA's API is
// thread-safe; the methods hold no state of their own besides what Open made).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "attn/common/status.h"

namespace attn {

/// The UUID of CUDA device `device` in common/gpu_uuid.h form ("GPU-..."). Errors: UNAVAILABLE
/// when the device does not exist.
StatusOr<std::string> CudaDeviceUuid(int device);

class IpcRegion {
 public:
  /// Opens `memory_handle` (cudaIpcMemHandle_t bytes) and `event_handle` (cudaIpcEventHandle_t
  /// bytes) on CUDA device `device` and checks [offset, offset + bytes) against the allocation
  /// (offset >= 0, bytes >= 1: the caller checked). Errors: INVALID_ARGUMENT (a handle of the
  /// wrong size, one CUDA cannot open, naming CUDA's error and the usual causes; the range
  /// beyond the allocation), INTERNAL (the driver entry point, the server's event or stream).
  /// Nothing stays open on error.
  static StatusOr<std::unique_ptr<IpcRegion>> Open(int device, const std::string &memory_handle,
                                                   int64_t offset, int64_t bytes,
                                                   const std::string &event_handle);
  /// Drains the region's stream, then closes the server's stream and event, the client's event
  /// and the mapping (cudaIpcCloseMemHandle). Errors are logged (a faulted device), not thrown.
  ~IpcRegion();
  IpcRegion(const IpcRegion &) = delete;
  IpcRegion &operator=(const IpcRegion &) = delete;

  /// Device address of the region's first byte (the mapping's base + offset).
  uint8_t *data() const { return base_ + offset_; }
  int64_t bytes() const { return bytes_; }
  /// The allocation's size as the driver reports it (>= offset + bytes).
  int64_t allocation_bytes() const { return allocation_bytes_; }
  cudaEvent_t client_event() const { return client_event_; }
  /// cudaIpcEventHandle_t bytes of the server's event.
  const std::string &server_event_handle() const { return server_event_handle_; }
  /// cudaMemsetAsync(at, 0, bytes) on the region's stream. Errors: INTERNAL naming the call.
  Status Zero(uint8_t *at, int64_t bytes);
  /// Records the server's event on the region's stream, then synchronises the stream.
  /// Errors: INTERNAL naming the call.
  Status SignalWritten();

 private:
  explicit IpcRegion(int device) : device_(device) {}

  const int device_;
  uint8_t *base_ = nullptr;  // cudaIpcOpenMemHandle's address (closed in the destructor)
  int64_t offset_ = 0, bytes_ = 0, allocation_bytes_ = 0;
  cudaEvent_t client_event_ = nullptr;
  cudaEvent_t server_event_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::string server_event_handle_;
};

}  // namespace attn
