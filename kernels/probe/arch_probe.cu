// The architecture probe kernel: reports __CUDA_ARCH__ of the image the device runs.
#include <cuda_runtime.h>

#include <string>

#include "attn/kernels/arch_probe.h"

namespace attn::kernels {
namespace {

__global__ void ArchProbeKernel(int* out) {
#if defined(__CUDA_ARCH__)
  out[0] = __CUDA_ARCH__;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_SPECIFIC__) || \
    defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
  out[1] = 1;
#else
  out[1] = 0;
#endif
#endif
}

Status FromCuda(cudaError_t e, const char* what) {
  return Internal(std::string("arch probe: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

/// Launches the probe on the current device and copies its two ints to `h`.
Status RunProbeKernel(int h[2]) {
  int* d = nullptr;
  cudaError_t e = cudaMalloc(&d, 2 * sizeof(int));
  if (e != cudaSuccess) return FromCuda(e, "cudaMalloc");
  ArchProbeKernel<<<1, 1>>>(d);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(h, d, 2 * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return e == cudaSuccess ? Status::Ok() : FromCuda(e, "probe kernel launch / copy");
}

}  // namespace

StatusOr<ArchProbeResult> ProbeCudaArch(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Unavailable(std::string("arch probe: no CUDA device (") +
                       (e != cudaSuccess ? cudaGetErrorName(e) : "0 devices") + ")");
  }
  int previous = 0;
  if ((e = cudaGetDevice(&previous)) != cudaSuccess) return FromCuda(e, "cudaGetDevice");
  if (device < 0) device = previous;
  if ((e = cudaSetDevice(device)) != cudaSuccess) return FromCuda(e, "cudaSetDevice");
  ArchProbeResult r;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  r.device_cc = major * 100 + minor * 10;
  int h[2] = {0, 0};
  const Status status = RunProbeKernel(h);
  cudaSetDevice(previous);
  if (!status.ok()) return status;
  r.cuda_arch = h[0];
  r.arch_specific = h[1] != 0;
  return r;
}

}  // namespace attn::kernels
