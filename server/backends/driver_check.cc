#include "backends/driver_check.h"

namespace attn {
namespace {

// Oldest driver branch per CUDA major version (NVIDIA's CUDA toolkit release notes, "CUDA
// Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility").
std::string DriverBranchFor(int cuda_major) {
  switch (cuda_major) {
    case 11: return "R450";
    case 12: return "R525";
    case 13: return "R580";
    default: return cuda_major > 13 ? "a driver for CUDA " + std::to_string(cuda_major) : "";
  }
}

}  // namespace

std::string CudaVersionString(int encoded) {
  if (encoded <= 0) return "none";
  return std::to_string(encoded / 1000) + "." + std::to_string((encoded % 1000) / 10);
}

Status CheckCudaDriver(int driver_version, int runtime_version) {
  const int need_major = runtime_version / 1000;
  if (driver_version <= 0) {
    return FailedPrecondition("no NVIDIA driver found (cudaDriverGetVersion returned " +
                              std::to_string(driver_version) + "); this build needs CUDA " +
                              std::to_string(need_major) + " (" + DriverBranchFor(need_major) +
                              " or newer)");
  }
  if (driver_version / 1000 < need_major) {
    return FailedPrecondition(
        "NVIDIA driver too old: it supports CUDA " + CudaVersionString(driver_version) +
        ", this server was built with CUDA " + CudaVersionString(runtime_version) +
        " and needs a driver for CUDA " + std::to_string(need_major) + ".x (" +
        DriverBranchFor(need_major) + " or newer; on GKE a version whose default driver is " +
        DriverBranchFor(need_major) + "+, see deploy/README.md)");
  }
  return Status::Ok();
}

}  // namespace attn
