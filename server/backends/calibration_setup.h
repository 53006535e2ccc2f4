// Set-up of auto's calibration at start (called by BuildBackends, backend_factory.cc), and the
// GetServerInfo view of the table it leaves in the registry.
//   SetUpAutoCalibration: --calibrate runs the calibration (calibration_runner.h) and writes
//     --calibration-file; otherwise a matching --calibration-file is loaded; the table is handed
//     to the registry. Without either, or with fewer than two available GPU backends (nothing
//     to choose between), auto keeps the static order.
//   FillCalibrationInfo: GetServerInfoResponse.auto_calibration from the registry's table
//     (used by the backend_info callback that cudnn_setup.cc installs).
// Thread-safety: SetUpAutoCalibration runs once at start, before traffic; FillCalibrationInfo
// only reads the table.
#pragma once

#include "attn/common/status.h"
#include "backends/backend_factory.h"
#include "backends/calibration.h"
#include "config/server_config.h"

namespace attention::v1 {
class GetServerInfoResponse;
}  // namespace attention::v1

namespace attn {

/// Errors: INVALID_ARGUMENT for a bad --cudnn-warmup (checked in AddCudnnAndFp8Backends too);
/// INTERNAL when calibration hits a device fault. A calibration file that cannot be read or
/// does not match the device is logged and ignored.
Status SetUpAutoCalibration(const ServerConfig& config, BuiltBackends* built);

/// Appends one auto_calibration entry per bucket of `t` (its choice and samples) to `r`;
/// `t` null (no calibration) adds nothing.
void FillCalibrationInfo(const CalibrationTable* t, attention::v1::GetServerInfoResponse* r);

}  // namespace attn
