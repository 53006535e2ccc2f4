#include "attn/kernels/cudnn_version.h"

namespace attn::kernels {

std::string CudnnVersionString(int64_t version) {
  if (version <= 0) return "unknown";
  return std::to_string(version / 10000) + "." + std::to_string((version / 100) % 100) + "." +
         std::to_string(version % 100);
}

// NVIDIA's rule (cuDNN Backend Developer Guide, "Compatibility" / "cuDNN API Compatibility",
// https://docs.nvidia.com/deeplearning/cudnn/latest/developer/forward-compatibility.html, the
// same text in the 9.5.1 and 9.6.0 guides): since cuDNN 7,
//   - a patch release x.y.z is forward and backward compatible with applications built against
//     another patch release x.y.w of the same major and minor version;
//   - minor releases are backward compatible: cuDNN x.y runs applications built against x.z
//     for z <= y; an application built against x.z is not guaranteed to work with x.y, z > y;
//   - nothing is guaranteed across major versions.
// So: same major required, runtime minor >= build minor, patch levels ignored.
Status CheckCudnnVersion(int64_t build_version, int64_t runtime_version) {
  if (runtime_version <= 0) {
    return FailedPrecondition("cuDNN runtime version unknown (libcudnn.so.9 not loaded)");
  }
  const std::string both = "runtime cuDNN " + CudnnVersionString(runtime_version) +
                           ", headers this server was built against " +
                           CudnnVersionString(build_version);
  if (CudnnMajor(runtime_version) != CudnnMajor(build_version)) {
    return FailedPrecondition(both +
                              ": cuDNN guarantees no compatibility across major "
                              "versions (the runtime's major must equal the build's)");
  }
  if (CudnnMinor(runtime_version) < CudnnMinor(build_version)) {
    return FailedPrecondition(
        both +
        ": cuDNN minor releases are only backward compatible (a runtime x.y serves "
        "builds against x.z for z <= y, patch levels aside); use a runtime cuDNN " +
        std::to_string(CudnnMajor(build_version)) + "." +
        std::to_string(CudnnMinor(build_version)) + " or newer within major " +
        std::to_string(CudnnMajor(build_version)) +
        " (--cudnn-library), or rebuild against older headers (scripts/cudnn_pins.txt)");
  }
  return Status::Ok();
}

}  // namespace attn::kernels
