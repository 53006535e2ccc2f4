// arch_probe_test: the probe reports the architecture this build targeted on this device.
//   ATTN_EXPECT_ARCH=890 (build with CMAKE_CUDA_ARCHITECTURES exactly "89"): the probe must
//   report 890 on any device (on Hopper the driver JIT-compiles the compute_89 PTX).
//   Otherwise: the probe must equal the device's compute capability (major*100 + minor*10).
// Also checks GetDeviceLimits (L4 limits under ATTN_EMULATE_L4).
#include "attn/kernels/arch_probe.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "attn/kernels/device_limits.h"

namespace attn::kernels {
namespace {

bool HaveDevice() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

#define ATTN_SKIP_WITHOUT_DEVICE() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped"

TEST(ArchProbe, ReportsTargetedArchitecture) {
  ATTN_SKIP_WITHOUT_DEVICE();
  const StatusOr<ArchProbeResult> r = ProbeCudaArch();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::printf("probe: __CUDA_ARCH__=%d arch_specific=%d device_cc=%d\n", r->cuda_arch,
              r->arch_specific ? 1 : 0, r->device_cc);
  if (const char* path = std::getenv("ATTN_PROBE_OUT")) {
    std::ofstream(path) << "{\"probe_arch\": " << r->cuda_arch
                        << ", \"arch_specific\": " << (r->arch_specific ? "true" : "false")
                        << ", \"device_cc\": " << r->device_cc << "}\n";
  }
#if defined(ATTN_EXPECT_ARCH)
  EXPECT_EQ(r->cuda_arch, ATTN_EXPECT_ARCH)
      << "the sm_89-only build must run its compute_89 image (PTX JIT on newer devices)";
#else
  EXPECT_EQ(r->cuda_arch, r->device_cc)
      << "the probe ran an image compiled for another architecture than the device's";
#endif
}

TEST(DeviceLimits, RespectsEmulationMode) {
  ATTN_SKIP_WITHOUT_DEVICE();
  const StatusOr<DeviceLimits> l = GetDeviceLimits();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::printf("limits: smem/block %d bytes, %d SMs, cc %d, emulating_l4=%d\n",
              l->max_dynamic_smem_per_block_bytes, l->sm_count, l->compute_capability,
              l->emulating_l4 ? 1 : 0);
  EXPECT_GT(l->max_dynamic_smem_per_block_bytes, 0);
  EXPECT_GT(l->sm_count, 0);
  EXPECT_EQ(l->emulating_l4, kEmulateL4);
  if (kEmulateL4) {
    EXPECT_LE(l->max_dynamic_smem_per_block_bytes, kL4MaxDynamicSmemPerBlockBytes);
    EXPECT_LE(l->sm_count, kL4SmCount);
  }
}

}  // namespace
}  // namespace attn::kernels
