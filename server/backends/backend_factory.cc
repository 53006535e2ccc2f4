#include "backends/backend_factory.h"

#include <spdlog/spdlog.h>

#include "backends/calibration_setup.h"
#include "backends/cpu_backend.h"
#include "backends/cudnn_setup.h"
#include "backends/unavailable_backend.h"
#if defined(ATTN_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "backends/driver_check.h"
#include "backends/fused_backend.h"
#include "backends/gpu_context.h"
#include "backends/naive_backend.h"
#endif

namespace attn {

StatusOr<BuiltBackends> BuildBackends(const ServerConfig& config) {
  BuiltBackends built;
  built.registry = std::make_unique<BackendRegistry>();
  built.registry->Add(std::make_unique<CpuBackend>(config.cpu_threads_per_call), /*auto_rank=*/100);
#if defined(ATTN_HAVE_CUDA)
  std::string why;
  std::shared_ptr<GpuContext> gpu;
  // Driver check first (backends/driver_check.h): a too-old driver refuses the GPU backends
  // with the reason rather than failing later in a kernel launch.
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  built.facts.cuda_driver_version = CudaVersionString(driver);
  const Status driver_ok = driver > 0 ? CheckCudaDriver(driver, CUDART_VERSION) : Status::Ok();
  if (driver > 0) {
    spdlog::info("NVIDIA driver supports CUDA {}; this server was built with CUDA {}",
                 CudaVersionString(driver), CudaVersionString(CUDART_VERSION));
  }
  if (driver <= 0) {
    // No libcuda at all: say so (CUDA's own error for this case reads "CUDA driver version is
    // insufficient for CUDA runtime version", which suggests an old driver instead).
    why = "no NVIDIA driver on this machine, so no GPU";
    spdlog::info("{} (this server was built with CUDA {})", why,
                 CudaVersionString(CUDART_VERSION));
  } else if (!driver_ok.ok()) {
    why = driver_ok.message();
    spdlog::error("{}", why);
  } else if (CudaDeviceCount(&why) > 0) {
    auto ctx = GpuContext::Create(config.device, config.gpu_memory_fraction,
                                  static_cast<uint64_t>(config.pinned_staging_bytes));
    if (ctx.ok()) {
      gpu = *ctx;
      const DeviceInfo& d = gpu->info();
      spdlog::info("GPU {}: {} (sm_{}{}), {} SMs, {:.1f} GiB; pool {:.1f} GiB", d.index, d.name,
                   d.major, d.minor, d.sm_count, d.total_memory_bytes / 1073741824.0,
                   gpu->pool().capacity() / 1073741824.0);
      built.facts.device_name = d.name;
      built.facts.compute_capability = std::to_string(d.major) + "." + std::to_string(d.minor);
      built.facts.device_memory_bytes = static_cast<int64_t>(d.total_memory_bytes);
      GpuContext* raw = gpu.get();
      built.facts.pool_usage = [raw] {
        return std::make_pair(static_cast<int64_t>(raw->pool().capacity()),
                              static_cast<int64_t>(raw->pool().used()));
      };
      built.gpu_holder = gpu;
      built.gpu = raw;
    } else {
      why = "GPU initialisation failed: " + ctx.status().ToString();
      spdlog::warn("{}", why);
    }
  }
  if (!gpu) spdlog::info("GPU backends unavailable: {}", why);
  // Auto's order follows the H200 benchmark (bench/NOTES.md): fused is several times faster
  // than naive wherever it supports the request; naive covers fp32; cpu covers the rest.
  built.registry->Add(std::make_unique<FusedBackend>(gpu, why), /*auto_rank=*/10);
  built.registry->Add(std::make_unique<NaiveBackend>(
                          gpu, why, static_cast<uint64_t>(config.naive_workspace_bytes)),
                      /*auto_rank=*/50);
  AddCudnnAndFp8Backends(config, gpu, why, &built);
#else
  built.registry->Add(std::make_unique<UnavailableBackend>(
                          "fused", "this server was built without CUDA",
                          "FlashAttention-2 tensor-core kernel (needs a CUDA build)"),
                      /*auto_rank=*/-1);
  built.registry->Add(std::make_unique<UnavailableBackend>(
                          "naive", "this server was built without CUDA",
                          "cuBLAS GEMM + softmax + GEMM (needs a CUDA build)"),
                      /*auto_rank=*/-1);
  AddCudnnAndFp8Backends(config, nullptr, "this server was built without CUDA", &built);
#endif
  ATTN_RETURN_IF_ERROR(SetUpAutoCalibration(config, &built));
  if (config.inject_backend_fault_after > 0) {
    spdlog::warn("--inject-backend-fault-after={}: backend Execute call {} and later will fail "
                 "with an injected device fault (tests only)",
                 config.inject_backend_fault_after, config.inject_backend_fault_after);
    built.registry->InjectFaultAfter(config.inject_backend_fault_after);
  }
  if (config.default_backend != "auto" &&
      built.registry->Find(config.default_backend) == nullptr) {
    return InvalidArgument("--default-backend: unknown backend \"" + config.default_backend +
                           "\"; known: " + built.registry->KnownNames());
  }
  if (config.default_backend != "auto") {
    const Backend* b = built.registry->Find(config.default_backend);
    if (!b->available()) {
      spdlog::warn("--default-backend {} is unavailable here ({}): calls that name no backend "
                   "will get FAILED_PRECONDITION",
                   config.default_backend, b->unavailable_reason());
    }
  }
  return built;
}

}  // namespace attn
