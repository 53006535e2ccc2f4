// Builds the server's backend registry from its configuration: `cpu` always; the CUDA
// backends when the build has CUDA and a device opens (else they are listed as unavailable
// with the reason). Auto's preference order: fused, naive, cpu.
#pragma once

#include <memory>

#include "backends/backend_registry.h"
#include "backends/server_facts.h"
#include "config/server_config.h"

namespace attn {

class GpuContext;

/// The registry and what it found about the device. `gpu_holder` keeps GPU state alive.
struct BuiltBackends {
  std::unique_ptr<BackendRegistry> registry;
  ServerFacts facts;
  std::shared_ptr<void> gpu_holder;
  /// The opened GPU (owned through gpu_holder); null without a device or a CUDA build.
  GpuContext* gpu = nullptr;
};

/// Errors: INVALID_ARGUMENT when --default-backend names no backend.
StatusOr<BuiltBackends> BuildBackends(const ServerConfig& config);

}  // namespace attn
