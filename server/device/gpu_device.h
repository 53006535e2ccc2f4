// Opening the GPU (DESIGN.md §2): how many CUDA devices there are, and the facts about the one
// the server uses (for GetServerInfo, metrics and the startup log). CUDA builds only.
#pragma once

#include <cstdint>
#include <string>

#include "attn/common/status.h"

namespace attn {

/// Facts about the device, for GetServerInfo and reports.
struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;  ///< compute capability major.minor
  int minor = 0;
  uint64_t total_memory_bytes = 0;
  int sm_count = 0;
};

/// Number of CUDA devices (0 when there is no device or no driver) and why, when 0.
int CudaDeviceCount(std::string* why_none);

/// Reads the properties of CUDA device `device`. Errors: UNAVAILABLE when it does not exist.
StatusOr<DeviceInfo> OpenDevice(int device);

}  // namespace attn
