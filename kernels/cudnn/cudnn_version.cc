#include "attn/kernels/cudnn_version.h"

namespace attn::kernels {

std::string CudnnVersionString(int64_t version) {
  if (version <= 0) return "unknown";
  return std::to_string(version / 10000) + "." + std::to_string((version / 100) % 100) + "." +
         std::to_string(version % 100);
}

Status CheckCudnnVersion(int64_t build_version, int64_t runtime_version) {
  if (runtime_version <= 0) {
    return FailedPrecondition("cuDNN runtime version unknown (libcudnn.so.9 not loaded)");
  }
  if (CudnnMajor(runtime_version) != CudnnMajor(build_version)) {
    return FailedPrecondition("runtime cuDNN " + CudnnVersionString(runtime_version) +
                              " has another major version than the build's headers (" +
                              CudnnVersionString(build_version) + ")");
  }
  if (runtime_version < build_version) {
    return FailedPrecondition(
        "runtime cuDNN " + CudnnVersionString(runtime_version) + " is older than the " +
        CudnnVersionString(build_version) +
        " this server was built against; put a cuDNN >= the build's first on LD_LIBRARY_PATH, "
        "or rebuild against the older headers (-DCUDNN_INCLUDE_DIR=...)");
  }
  return Status::Ok();
}

}  // namespace attn::kernels
