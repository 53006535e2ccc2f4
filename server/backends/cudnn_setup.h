// Registration of the `cudnn` and `fp8` backends (called by BuildBackends, backend_factory.cc;
// auto's calibration set-up is in calibration_setup.h).
//   AddCudnnAndFp8Backends: opens cuDNN on the GPU (CudnnAttention::Create: library, version
//     check, handle), builds the --cudnn-warmup graphs, registers `cudnn` (auto rank 20: after
//     fused, before naive) and `fp8` (not in auto's static order: FP8 changes the precision
//     contract, and under calibration it fails the request dtype's parity check), or registers
//     them unavailable with the reason. Also sets facts.backend_info (GetServerInfo's
//     cudnn_cache and auto_calibration).
#pragma once

#include <memory>
#include <string>

#include "backends/backend_factory.h"
#include "config/server_config.h"

namespace attn {

class GpuContext;

/// `gpu` null: both backends are registered unavailable with `why`.
void AddCudnnAndFp8Backends(const ServerConfig& config, std::shared_ptr<GpuContext> gpu,
                            const std::string& why, BuiltBackends* built);

}  // namespace attn
