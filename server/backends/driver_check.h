// NVIDIA driver check at start (DESIGN.md §12): a CUDA 13 build needs a driver that supports
// CUDA 13 (R580 or newer). cudaDriverGetVersion() gives the CUDA version the installed driver
// supports, encoded as 1000 * major + 10 * minor (13000 = 13.0); 0 means no driver.
// The check itself is pure so it is unit-tested without a GPU; backend_factory.cc calls it with
// the live numbers before opening the device, and refuses the GPU backends with its reason.
#pragma once

#include <string>

#include "attn/common/status.h"

namespace attn {

/// "13.0" for 13000; "none" for <= 0.
std::string CudaVersionString(int encoded);

/// OK when a driver supporting CUDA `driver_version` can run code built with CUDA runtime
/// `runtime_version` (both encoded as above): the driver's major version must be at least the
/// runtime's (CUDA minor-version compatibility covers the rest). FAILED_PRECONDITION otherwise,
/// with both versions and the driver branch to install (R580+ for CUDA 13, R525+ for CUDA 12).
Status CheckCudaDriver(int driver_version, int runtime_version);

}  // namespace attn
