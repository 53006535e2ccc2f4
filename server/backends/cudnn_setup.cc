#include "backends/cudnn_setup.h"

#include <spdlog/spdlog.h>

#include "attention/v1/attention.pb.h"
#include "backends/calibration_setup.h"
#include "backends/cudnn_warmup.h"
#include "backends/unavailable_backend.h"
#if defined(ATTN_HAVE_CUDA)
#include "backends/fp8_backend.h"
#include "backends/gpu_context.h"
#endif
#if defined(ATTN_HAVE_CUDNN)
#include "attn/kernels/cudnn_attention.h"
#include "attn/kernels/cudnn_version.h"
#include "backends/cudnn_backend.h"
#endif

namespace attn {

void AddCudnnAndFp8Backends(const ServerConfig& config, std::shared_ptr<GpuContext> gpu,
                            const std::string& why, BuiltBackends* built) {
  BackendRegistry* reg = built->registry.get();
  const BackendRegistry* creg = reg;
#if defined(ATTN_HAVE_CUDNN)
  std::shared_ptr<kernels::CudnnAttention> cudnn;
  std::string cudnn_why = why;
  if (gpu) {
    kernels::CudnnOptions opt;
    opt.library = config.cudnn_library;
    opt.autotune = config.cudnn_autotune;
    auto c = kernels::CudnnAttention::Create(gpu->info().index, opt);
    if (c.ok()) {
      cudnn = std::move(*c);
      spdlog::info("cuDNN {} loaded from {} (found by: {}; built against {})",
                   kernels::CudnnVersionString(cudnn->runtime_version()), cudnn->library_path(),
                   cudnn->library_step(),
                   kernels::CudnnVersionString(kernels::CudnnAttention::BuildVersion()));
      auto shapes = ParseCudnnWarmup(config.cudnn_warmup);
      if (shapes.ok() && !shapes->empty()) {
        Status w = cudnn->Warmup(*shapes, /*fp8=*/false);
        const kernels::CudnnCounters k = cudnn->counters();
        spdlog::info("cuDNN warm-up: {} graphs in {:.2f} s{}", k.graphs, k.warmup_seconds,
                     w.ok() ? "" : " (some failed: " + w.message() + ")");
      } else if (!shapes.ok()) {
        spdlog::error("{}", shapes.status().message());
      }
    } else {
      cudnn_why = c.status().message();
      spdlog::warn("cudnn backend unavailable: {}", cudnn_why);
    }
  }
  reg->Add(std::make_unique<CudnnBackend>(gpu, cudnn, cudnn_why), /*auto_rank=*/20);
  reg->Add(std::make_unique<Fp8Backend>(gpu, cudnn, cudnn_why), /*auto_rank=*/-1);
  kernels::CudnnAttention* cd = cudnn.get();
  built->facts.backend_info = [creg, cd, hold = cudnn,
                              autotune = config.cudnn_autotune](
                                 attention::v1::GetServerInfoResponse* r) {
    FillCalibrationInfo(creg->calibration(), r);
    if (cd == nullptr) return;
    const kernels::CudnnCounters k = cd->counters();
    auto* c = r->mutable_cudnn_cache();
    c->set_runtime_version(kernels::CudnnVersionString(cd->runtime_version()));
    c->set_build_version(kernels::CudnnVersionString(kernels::CudnnAttention::BuildVersion()));
    c->set_library_path(cd->library_path());
    c->set_library_source(cd->library_step());
    c->set_graphs(k.graphs);
    c->set_builds(k.builds);
    c->set_request_path_builds(k.request_path_builds);
    c->set_build_failures(k.build_failures);
    c->set_hits(k.hits);
    c->set_build_seconds(k.build_seconds);
    c->set_warmup_seconds(k.warmup_seconds);
    c->set_autotune(autotune);
    c->set_autotuned(k.autotuned);
    c->set_autotune_failures(k.autotune_failures);
  };
#else
  (void)config;
#if defined(ATTN_CUDNN_UNAVAILABLE_REASON)
  const std::string reason = ATTN_CUDNN_UNAVAILABLE_REASON;
#else
  const std::string reason = "this server was built without cuDNN";
#endif
  reg->Add(std::make_unique<UnavailableBackend>("cudnn", reason,
                                                "cuDNN fused SDPA (needs cuDNN at build time)"),
           /*auto_rank=*/-1);
#if defined(ATTN_HAVE_CUDA)
  reg->Add(std::make_unique<Fp8Backend>(gpu, nullptr, gpu ? reason : why), /*auto_rank=*/-1);
#else
  (void)gpu;
  (void)why;
  reg->Add(std::make_unique<UnavailableBackend>("fp8", "this server was built without CUDA",
                                                "E4M3 attention (needs a CUDA build)"),
           /*auto_rank=*/-1);
#endif
  built->facts.backend_info = [creg](attention::v1::GetServerInfoResponse* r) {
    FillCalibrationInfo(creg->calibration(), r);
  };
#endif
}

}  // namespace attn
