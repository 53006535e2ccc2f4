#include "device/ipc_region.h"

#include <cuda.h>
#include <spdlog/spdlog.h>

#include <cstring>

#include "common/gpu_uuid.h"

namespace attn {
namespace {

// cuMemGetAddressRange (the _v2 ABI, current since CUDA 3.2), found at run time.
using MemGetAddressRangeFn = CUresult (*)(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);

StatusOr<MemGetAddressRangeFn> AddressRangeFn() {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn,
                                                         CUDART_VERSION, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    return Internal(std::string("CUDA IPC: the driver's cuMemGetAddressRange is not available (") +
                    cudaGetErrorString(e) + "): the allocation's size cannot be checked");
  }
  return reinterpret_cast<MemGetAddressRangeFn>(fn);
}

std::string CudaText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Why cudaIpcOpen*Handle usually fails, for the client's error message.
constexpr const char *kOpenCauses =
    " (usual causes: a stale handle or an allocation already freed, a handle this server's own "
    "process exported, memory not allocated by cudaMalloc/cuMemAlloc (e.g. PyTorch's "
    "expandable segments), or processes that cannot share device memory: another GPU, "
    "another IPC namespace, a different user or container without hostIPC; see README "
    "\"CUDA IPC regions\")";

}  // namespace

StatusOr<std::string> CudaDeviceUuid(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable("CUDA device " + std::to_string(device) + " not found");
  }
  static_assert(sizeof(prop.uuid.bytes) == kGpuUuidBytes, "cudaUUID_t is 16 bytes");
  return FormatGpuUuid(reinterpret_cast<const unsigned char *>(prop.uuid.bytes));
}

StatusOr<std::unique_ptr<IpcRegion>> IpcRegion::Open(int device, const std::string &memory_handle,
                                                     int64_t offset, int64_t bytes,
                                                     const std::string &event_handle) {
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  if (memory_handle.size() != sizeof(mh) || event_handle.size() != sizeof(eh)) {
    return InvalidArgument("CUDA IPC handles are " + std::to_string(sizeof(mh)) +
                           " bytes; got a memory handle of " +
                           std::to_string(memory_handle.size()) + " and an event handle of " +
                           std::to_string(event_handle.size()));
  }
  std::memcpy(&mh, memory_handle.data(), sizeof(mh));
  std::memcpy(&eh, event_handle.data(), sizeof(eh));
  auto range = AddressRangeFn();
  if (!range.ok()) return range.status();
  // From here the destructor closes whatever was opened.
  std::unique_ptr<IpcRegion> r(new IpcRegion(device));
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("CUDA IPC: cudaSetDevice(" + std::to_string(device) + "): " + CudaText(e));
  }
  void *base = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&base, mh, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return InvalidArgument("cuda_ipc.memory_handle: cudaIpcOpenMemHandle failed, " + CudaText(e) +
                           kOpenCauses);
  }
  r->base_ = static_cast<uint8_t *>(base);
  CUdeviceptr at = 0;
  size_t size = 0;
  if (CUresult e = (*range)(&at, &size, reinterpret_cast<CUdeviceptr>(base)); e != CUDA_SUCCESS) {
    return InvalidArgument("cuda_ipc.memory_handle: cuMemGetAddressRange on the opened "
                           "allocation failed (CUresult " + std::to_string(static_cast<int>(e)) +
                           "): its size cannot be checked");
  }
  // The mapping starts at the allocation's base; count from the mapped address all the same.
  const int64_t alloc = static_cast<int64_t>(size) -
                        static_cast<int64_t>(reinterpret_cast<CUdeviceptr>(base) - at);
  r->allocation_bytes_ = alloc;
  if (offset > alloc || bytes > alloc - offset) {
    return InvalidArgument("cuda_ipc: the region [" + std::to_string(offset) + ", +" +
                           std::to_string(bytes) + ") lies beyond the allocation of " +
                           std::to_string(alloc) + " bytes");
  }
  r->offset_ = offset;
  r->bytes_ = bytes;
  if (cudaError_t e = cudaIpcOpenEventHandle(&r->client_event_, eh); e != cudaSuccess) {
    (void)cudaGetLastError();
    r->client_event_ = nullptr;
    return InvalidArgument("cuda_ipc.event_handle: cudaIpcOpenEventHandle failed, " + CudaText(e) +
                           " (the event must be created with cudaEventInterprocess | "
                           "cudaEventDisableTiming on the same GPU)" + kOpenCauses);
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&r->stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    r->stream_ = nullptr;
    return Internal("CUDA IPC: cudaStreamCreateWithFlags: " + CudaText(e));
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&r->server_event_,
                                               cudaEventDisableTiming | cudaEventInterprocess);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    r->server_event_ = nullptr;
    return Internal("CUDA IPC: cudaEventCreateWithFlags (interprocess): " + CudaText(e));
  }
  cudaIpcEventHandle_t out;
  if (cudaError_t e = cudaIpcGetEventHandle(&out, r->server_event_); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("CUDA IPC: cudaIpcGetEventHandle: " + CudaText(e));
  }
  r->server_event_handle_.assign(reinterpret_cast<const char *>(&out), sizeof(out));
  return r;
}

IpcRegion::~IpcRegion() {
  (void)cudaSetDevice(device_);
  cudaError_t first = cudaSuccess;
  auto note = [&first](cudaError_t e) {
    if (e != cudaSuccess && first == cudaSuccess) first = e;
  };
  if (stream_ != nullptr) {
    note(cudaStreamSynchronize(stream_));
    note(cudaStreamDestroy(stream_));
  }
  if (server_event_ != nullptr) note(cudaEventDestroy(server_event_));
  if (client_event_ != nullptr) note(cudaEventDestroy(client_event_));
  if (base_ != nullptr) note(cudaIpcCloseMemHandle(base_));
  if (first != cudaSuccess) {
    (void)cudaGetLastError();
    spdlog::warn("CUDA IPC region of {} bytes: closing it failed ({})", bytes_, CudaText(first));
  }
}

Status IpcRegion::Zero(uint8_t *at, int64_t bytes) {
  (void)cudaSetDevice(device_);
  if (cudaError_t e = cudaMemsetAsync(at, 0, static_cast<size_t>(bytes), stream_);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("CUDA IPC: cudaMemsetAsync (zero rows of failed steps): " + CudaText(e));
  }
  return Status::Ok();
}

Status IpcRegion::SignalWritten() {
  (void)cudaSetDevice(device_);
  if (cudaError_t e = cudaEventRecord(server_event_, stream_); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("CUDA IPC: cudaEventRecord (the server's event): " + CudaText(e));
  }
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("CUDA IPC: cudaStreamSynchronize (the region's stream): " + CudaText(e));
  }
  return Status::Ok();
}

}  // namespace attn
