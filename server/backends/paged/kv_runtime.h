// Assembles the paged KV cache from the server configuration (DESIGN.md §6, §7): where pages
// live (--kv-device: host memory with the CPU compute, or device memory carved from the GPU
// pool with the GPU paged kernels), the page pool, the sequence store and the compute.
#pragma once

#include <memory>
#include <string>

#include "attn/common/status.h"
#include "backends/backend_factory.h"
#include "config/server_config.h"
#include "kv_cache/page_pool.h"
#include "backends/paged/paged_attention_backend.h"
#include "kv_cache/sequence_store.h"
#include "kv_cache/ttl_sweeper.h"
#include "kv_cache/kv_memory.h"

namespace attn {

/// Everything SequenceService needs; members are destroyed in reverse order (store before
/// pages before memory).
struct KvRuntime {
  std::unique_ptr<KvMemory> memory;
  std::unique_ptr<PagePool> pages;
  std::unique_ptr<SequenceStore> store;
  /// Expires idle sequences on a timer when --sequence-ttl-s > 0 (else null); stops first.
  std::unique_ptr<TtlSweeper> sweeper;
  std::unique_ptr<PagedAttentionBackend> compute;
  std::string device;  ///< "cpu" or "gpu": where pages live and steps run
};

/// Builds the KV cache. --kv-device=auto picks "gpu" when `backends` opened a GPU (CUDA build
/// with a device), else "cpu". Errors: INVALID_ARGUMENT for --kv-device=gpu without a GPU or
/// for a page size the GPU kernels cannot use (not a power of two); RESOURCE_EXHAUSTED when
/// --kv-cache-bytes does not fit the host mapping or the GPU pool.
StatusOr<std::unique_ptr<KvRuntime>> BuildKvRuntime(const ServerConfig &config,
                                                    const BuiltBackends &backends);

}  // namespace attn
