#include "backends/paged/kv_runtime.h"

#include <spdlog/spdlog.h>

#include <string>

#include "backends/paged/cpu_paged_attention.h"
#include "kv_cache/sequence_id.h"
#include "kv_cache/host_pool.h"
#if defined(ATTN_HAVE_CUDA)
#include "backends/gpu_context.h"
#include "backends/paged/gpu_paged_attention.h"
#include "backends/paged/device_kv_memory.h"
#endif

namespace attn {

StatusOr<std::unique_ptr<KvRuntime>> BuildKvRuntime(const ServerConfig &config,
                                                    const BuiltBackends &backends) {
  auto kv = std::make_unique<KvRuntime>();
  const bool have_gpu = backends.gpu != nullptr;
  if (config.kv_device == "gpu" && !have_gpu) {
#if defined(ATTN_HAVE_CUDA)
    const char *why = "no CUDA device opened";
#else
    const char *why = "built without CUDA";
#endif
    return InvalidArgument(std::string("--kv-device=gpu: no GPU is available to this server (") +
                           why + ")");
  }
  kv->device = (config.kv_device == "cpu" || !have_gpu) ? "cpu" : "gpu";
#if defined(ATTN_HAVE_CUDA)
  if (kv->device == "gpu") {
    const int32_t p = config.kv_page_tokens;
    if ((p & (p - 1)) != 0) {
      return InvalidArgument("--kv-page-tokens: the GPU KV cache needs a power of two, got " +
                             std::to_string(p));
    }
    auto memory = DeviceKvMemory::Create(&backends.gpu->pool(), config.kv_cache_bytes);
    if (!memory.ok()) return memory.status();
    auto compute =
        GpuPagedAttention::Create(backends.gpu->info().index, &backends.gpu->pool(),
                                  GpuPagedAttention::kDefaultLanes, config.kv_cuda_graphs,
                                  config.kv_timing_every);
    if (!compute.ok()) return compute.status();
    kv->memory = std::move(*memory);
    kv->compute = std::move(*compute);
  }
#endif
  if (kv->device == "cpu") {
    auto memory = HostPool::Create(config.kv_cache_bytes);
    if (!memory.ok()) return memory.status();
    kv->memory = std::move(*memory);
    kv->compute = std::make_unique<CpuPagedAttention>(config.cpu_threads_per_call);
  }
  kv->pages = std::make_unique<PagePool>(
      kv->memory.get(),
      PagePoolOptions{config.kv_page_tokens, config.kv_chunk_pages, config.kv_debug_poison});
  SequenceStoreOptions store_options;
  store_options.evict_idle = config.kv_evict_idle;
  // Sequence routing (kv_cache/sequence_id.h): ids carry this process's replica tag, random
  // unless --replica-tag fixed it (8 hex digits, checked by the flag parser).
  store_options.replica_tag =
      config.replica_tag.empty()
          ? NewReplicaTag()
          : static_cast<uint32_t>(std::stoul(config.replica_tag, nullptr, 16));
  store_options.replica_address = config.advertise_address;
  store_options.ttl_s = config.sequence_ttl_s;
  store_options.replay_cache_bytes = config.replay_cache_bytes;
  store_options.sequence_metadata_bytes = config.sequence_metadata_bytes;
  store_options.owner_limits = {config.max_sequences_per_identity, config.max_pages_per_identity};
  kv->store = std::make_unique<SequenceStore>(kv->pages.get(), store_options);
  if (config.sequence_ttl_s > 0) {
    kv->sweeper =
        std::make_unique<TtlSweeper>(kv->store.get(), TtlSweepInterval(config.sequence_ttl_s));
  }
  spdlog::info("KV cache on {}: pages of {} tokens in {:.1f} MiB of {} memory", kv->device,
               config.kv_page_tokens, kv->memory->capacity() / 1048576.0,
               kv->device == "gpu" ? "device" : "host");
  return kv;
}

}  // namespace attn
