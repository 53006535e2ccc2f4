// A GPU's UUID as text (issue 18, CUDA IPC regions): the one form client and server compare to
// agree on the device whatever CUDA_VISIBLE_DEVICES each of them has, "GPU-" followed by
// 8-4-4-4-12 lowercase hex digits (as `nvidia-smi -L` prints it). Formatting lives here, beside
// the parser, so that device/ (which formats cudaDeviceProp.uuid) and shm/ (which parses what a
// client sent) cannot drift apart. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "attn/common/status.h"

namespace attn {

/// Bytes of a CUDA UUID (cudaUUID_t, CUuuid).
inline constexpr size_t kGpuUuidBytes = 16;

/// "GPU-" + 8-4-4-4-12 lowercase hex digits of the 16 bytes at `bytes`.
std::string FormatGpuUuid(const unsigned char *bytes);

/// `text` in FormatGpuUuid's form: hex digits of either case, the "GPU-" prefix optional
/// (case-insensitive), nothing else (no spaces). Errors: INVALID_ARGUMENT naming the expected
/// form (the text echoed cut to a bounded, UTF-8-safe length).
StatusOr<std::string> CanonicalGpuUuid(const std::string &text);

}  // namespace attn
