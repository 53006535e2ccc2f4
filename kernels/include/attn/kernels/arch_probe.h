// Architecture probe (DESIGN.md §10): which compiled image of our kernels the running device
// actually executes. A one-thread kernel writes __CUDA_ARCH__ as compiled for the device, so a
// build with CMAKE_CUDA_ARCHITECTURES=89 run on an H200 reports 890 (the driver JIT-compiled
// the compute_89 PTX), while the default build (89;90a) reports 900 there (sm_90a image).
// Host-only declarations: includes no CUDA header, safe from g++ and nvcc. Built only with
// ATTN_CUDA.
#pragma once

#include "attn/common/status.h"

namespace attn::kernels {

/// What the probe kernel saw on the device.
struct ArchProbeResult {
  int cuda_arch = 0;           ///< __CUDA_ARCH__ of the image that ran, e.g. 890, 900
  bool arch_specific = false;  ///< compiled for an arch-specific target (e.g. sm_90a)
  int device_cc = 0;           ///< the device's own compute capability, major*100 + minor*10
};

/// Runs the probe on `device` (-1: the current device). Diagnostic, not a hot path: it
/// allocates, launches and synchronises. The current device is restored.
/// Errors: UNAVAILABLE when there is no CUDA device; INTERNAL naming the cudaError_t otherwise
/// (e.g. cudaErrorNoKernelImageForDevice when no compiled image fits the device).
StatusOr<ArchProbeResult> ProbeCudaArch(int device = -1);

}  // namespace attn::kernels
