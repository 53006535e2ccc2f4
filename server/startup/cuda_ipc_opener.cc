#include "startup/cuda_ipc_opener.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <utility>

#if defined(ATTN_HAVE_CUDA)
#include "backends/gpu_context.h"
#include "device/ipc_region.h"
#endif

namespace attn::startup {
namespace {

#if defined(ATTN_HAVE_CUDA)
// shm::DeviceRegion over an opened IpcRegion.
class IpcDeviceRegion final : public shm::DeviceRegion {
 public:
  explicit IpcDeviceRegion(std::unique_ptr<IpcRegion> r) : r_(std::move(r)) {}
  uint8_t *data() const override { return r_->data(); }
  int64_t bytes() const override { return r_->bytes(); }
  void *client_event() const override { return static_cast<void *>(r_->client_event()); }
  const std::string &server_event_handle() const override { return r_->server_event_handle(); }
  Status Zero(uint8_t *at, int64_t bytes) override { return r_->Zero(at, bytes); }
  Status SignalWritten() override { return r_->SignalWritten(); }

 private:
  const std::unique_ptr<IpcRegion> r_;
};

// shm::DeviceRegionOpener for CUDA device `device`.
class IpcOpener final : public shm::DeviceRegionOpener {
 public:
  IpcOpener(int device, std::string uuid) : device_(device), uuid_(std::move(uuid)) {}
  const std::string &device_uuid() const override { return uuid_; }
  StatusOr<std::unique_ptr<shm::DeviceRegion>> Open(
      const shm::DeviceLeaseRequest &request) override {
    auto r = IpcRegion::Open(device_, request.memory_handle, request.offset, request.bytes,
                             request.event_handle);
    if (!r.ok()) return r.status();
    return std::unique_ptr<shm::DeviceRegion>(new IpcDeviceRegion(std::move(*r)));
  }

 private:
  const int device_;
  const std::string uuid_;
};
#endif

}  // namespace

CudaIpcFacts InstallCudaIpc(const BuiltBackends &built, const KvRuntime &kv,
                            shm::RegionRegistry *regions) {
  CudaIpcFacts facts;
  std::string why;
#if defined(ATTN_HAVE_CUDA)
  if (built.gpu == nullptr) {
    why = "CUDA IPC regions need the server's GPU, and this server opened none (no device or "
          "no driver): send tensors as bytes or host shared memory";
  } else {
    const int device = built.gpu->info().index;
    auto uuid = CudaDeviceUuid(device);
    if (!uuid.ok()) {
      why = "CUDA IPC regions: the GPU's UUID cannot be read (" + uuid.status().message() + ")";
    } else {
      facts.device_uuid = *uuid;
      if (kv.device != "gpu") {
        why = "CUDA IPC regions need the KV cache on the GPU; this server runs paged-cpu "
              "(--kv-device=cpu), which reads host memory only: send tensors as bytes or host "
              "shared memory";
      } else {
        regions->SetDeviceOpener(std::make_shared<IpcOpener>(device, *uuid), "");
        facts.accepted = true;
        spdlog::info("CUDA IPC regions: accepted on GPU {} ({})", device, *uuid);
        return facts;
      }
    }
  }
#else
  (void)built;
  (void)kv;
  why = "CUDA IPC regions need a CUDA build with a GPU; this server was built without CUDA: "
        "send tensors as bytes or host shared memory";
#endif
  regions->SetDeviceOpener(nullptr, why);
  spdlog::info("CUDA IPC regions: refused ({})", why);
  return facts;
}

}  // namespace attn::startup
