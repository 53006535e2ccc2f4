// A stand-in libcudnn for cudnn_library_test: exports only cudnnGetVersion(), returning the
// FAKE_CUDNN_VERSION it was compiled with (e.g. 91400 for 9.14.0). Never used for compute.
#include <cstddef>

extern "C" __attribute__((visibility("default"))) size_t cudnnGetVersion() {
  return FAKE_CUDNN_VERSION;
}
