// cuDNN version numbers and the runtime-vs-build check of the cudnn family (DESIGN.md §5, §11).
//
// cuDNN 9 encodes versions as major·10000 + minor·100 + patch (9.19.0 -> 91900), the value of
// CUDNN_VERSION in cudnn_version.h and of cudnnGetVersion() at run time. The cudnn family is
// compiled against one cuDNN's headers (the build version) and loads libcudnn.so.9 at run time
// (dlopen, found by the search of cudnn_library.h), so the two can differ.
// Pure functions; thread-safe; compiled in every build (CPU-only too) so they are unit-tested.
#pragma once

#include <cstdint>
#include <string>

#include "attn/common/status.h"

namespace attn::kernels {

/// "9.19.0" for 91900; "unknown" for values <= 0.
std::string CudnnVersionString(int64_t version);

/// Major version (9 for 91900).
inline int64_t CudnnMajor(int64_t version) { return version / 10000; }

/// Minor version (19 for 91900).
inline int64_t CudnnMinor(int64_t version) { return (version / 100) % 100; }

/// Whether a runtime cuDNN may serve graphs built with the frontend against `build_version`'s
/// headers, by NVIDIA's API compatibility rule (cited in cudnn_version.cc): Ok when the runtime
/// has the same major version and a minor version >= the build's; the patch level does not
/// matter (9.19.0 serves a 9.19.1 build). Otherwise FAILED_PRECONDITION naming both versions
/// and the rule. A runtime version <= 0 (library not loaded) is FAILED_PRECONDITION too.
Status CheckCudnnVersion(int64_t build_version, int64_t runtime_version);

}  // namespace attn::kernels
