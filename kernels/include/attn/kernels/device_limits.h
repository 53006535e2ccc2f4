// Limits kernels must respect when choosing tile sizes and grids (DESIGN.md §10).
//
// With ATTN_EMULATE_L4 defined (top-level CMake option), the limits are held to an NVIDIA L4's
// (sm_89): 99 KB = 101376 bytes of opt-in dynamic shared memory per block and 58 SMs, never
// more than the device's own. Otherwise they are the device's own.
// Host-only declarations: includes no CUDA header, safe from g++ and nvcc. The implementation
// (device_limits.cc) is built only with ATTN_CUDA.
#pragma once

#include "attn/common/status.h"

namespace attn::kernels {

/// L4 (AD104, sm_89) limits.
inline constexpr int kL4MaxDynamicSmemPerBlockBytes = 101376;
inline constexpr int kL4SmCount = 58;

/// True when this translation unit was compiled with ATTN_EMULATE_L4.
#if defined(ATTN_EMULATE_L4) && ATTN_EMULATE_L4
inline constexpr bool kEmulateL4 = true;
#else
inline constexpr bool kEmulateL4 = false;
#endif

struct DeviceLimits {
  int device = 0;
  /// Opt-in maximum dynamic shared memory per block, bytes
  /// (cudaDevAttrMaxSharedMemoryPerBlockOptin); kernels above 48 KB still call
  /// cudaFuncSetAttribute(MaxDynamicSharedMemorySize).
  int max_dynamic_smem_per_block_bytes = 0;
  int sm_count = 0;            ///< multiprocessors to size grids for
  int compute_capability = 0;  ///< the device's own, major*100 + minor*10 (not emulated)
  bool emulating_l4 = false;   ///< the two limits above were clamped to the L4's
};

/// Limits for `device` (-1: current). Cheap (attribute queries); cache per device on hot paths.
/// Errors: UNAVAILABLE without a CUDA device; INTERNAL naming the cudaError_t otherwise.
StatusOr<DeviceLimits> GetDeviceLimits(int device = -1);

}  // namespace attn::kernels
