// Registration of the `cudnn` and `fp8` backends and of auto's calibration (called by
// BuildBackends, backend_factory.cc).
//   AddCudnnAndFp8Backends: opens cuDNN on the GPU (CudnnAttention::Create: library, version
//     check, handle), builds the --cudnn-warmup graphs, registers `cudnn` (auto rank 20: after
//     fused, before naive) and `fp8` (not in auto's static order: FP8 changes the precision
//     contract, and under calibration it fails the request dtype's parity check), or registers
//     them unavailable with the reason. Also sets facts.backend_info (GetServerInfo's
//     cudnn_cache and auto_calibration).
//   SetUpAutoCalibration: --calibrate runs the calibration (calibration_runner.h) and writes
//     --calibration-file; otherwise a matching --calibration-file is loaded; the table is handed
//     to the registry. Without either, or with fewer than two available GPU backends (nothing
//     to choose between), auto keeps the static order.
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

/// Errors: INVALID_ARGUMENT for a bad --cudnn-warmup (checked in AddCudnnAndFp8Backends too);
/// INTERNAL when calibration hits a device fault. A calibration file that cannot be read or
/// does not match the device is logged and ignored.
Status SetUpAutoCalibration(const ServerConfig& config, BuiltBackends* built);

}  // namespace attn
