#include "backends/gpu_context.h"

#include <cublas_v2.h>

#include <cstring>
#include <vector>

namespace attn {
namespace {

constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

uint64_t RoundUp(uint64_t x) { return (x + 255) / 256 * 256; }

int64_t ElapsedUs(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.f;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) return 0;
  return static_cast<int64_t>(ms * 1000.0f + 0.5f);
}

}  // namespace

int CudaDeviceCount(std::string* why_none) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none) *why_none = std::string("no CUDA device: ") + cudaGetErrorString(err);
    cudaGetLastError();
    return 0;
  }
  if (count == 0 && why_none) *why_none = "no CUDA device found";
  return count;
}

Status GpuContext::CheckCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  faulted_ = true;
  fault_ = std::string(what) + ": " + cudaGetErrorString(err);
  return Internal("CUDA error in " + fault_);
}

StatusOr<std::shared_ptr<GpuContext>> GpuContext::Create(int device, double pool_fraction,
                                                         uint64_t pinned_bytes) {
  std::shared_ptr<GpuContext> ctx(new GpuContext());
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return Unavailable("CUDA device " + std::to_string(device) + " not found");
  }
  ctx->info_.index = device;
  ctx->info_.name = prop.name;
  ctx->info_.major = prop.major;
  ctx->info_.minor = prop.minor;
  ctx->info_.total_memory_bytes = prop.totalGlobalMem;
  ctx->info_.sm_count = prop.multiProcessorCount;
  auto pool = DevicePool::Create(device, pool_fraction);
  if (!pool.ok()) return pool.status();
  ctx->pool_ = std::move(*pool);
  if (cudaStreamCreateWithFlags(&ctx->stream_, cudaStreamNonBlocking) != cudaSuccess) {
    return Internal("cudaStreamCreate failed");
  }
  for (auto& e : ctx->events_) {
    if (cudaEventCreate(&e) != cudaSuccess) return Internal("cudaEventCreate failed");
  }
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return Internal("cublasCreate failed");
  ctx->cublas_ = handle;
  auto ws = ctx->pool_->Allocate(kCublasWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  ctx->cublas_workspace_ = std::move(*ws);
  if (cublasSetWorkspace(handle, ctx->cublas_workspace_.data(), kCublasWorkspaceBytes) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasSetStream(handle, ctx->stream_) != CUBLAS_STATUS_SUCCESS) {
    return Internal("cublasSetWorkspace/cublasSetStream failed");
  }
  if (pinned_bytes > 0) {
    if (cudaMallocHost(&ctx->pinned_, pinned_bytes) != cudaSuccess) {
      return ResourceExhausted("pinned staging buffer of " + std::to_string(pinned_bytes) +
                               " bytes could not be allocated");
    }
    ctx->pinned_bytes_ = pinned_bytes;
  }
  return ctx;
}

GpuContext::~GpuContext() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (cublas_) cublasDestroy(cublas_);
  for (auto& e : events_) {
    if (e) cudaEventDestroy(e);
  }
  if (stream_) cudaStreamDestroy(stream_);
  if (pinned_) cudaFreeHost(pinned_);
  cublas_workspace_.Reset();
  pool_.reset();
}

bool GpuContext::faulted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return faulted_;
}

Status GpuContext::Execute(const AttentionShape& shape, const AttentionTensors& host,
                           uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times) {
  std::lock_guard<std::mutex> lock(mu_);
  if (faulted_) return Internal("device is faulted after an earlier error: " + fault_);
  const uint64_t esz = kernels::DTypeSize(shape.dtype);
  const uint64_t q_bytes = shape.q_elements() * esz;
  const uint64_t kv_bytes = shape.kv_elements() * esz;
  const uint64_t lse_bytes = shape.return_lse ? shape.lse_elements() * 4 : 0;
  const bool has_lengths = host.q_lengths != nullptr || host.kv_lengths != nullptr;
  const uint64_t len_bytes = has_lengths ? 2 * shape.batch * 4 : 0;
  const bool varlen = shape.layout == kernels::Layout::kVarlen;
  const uint64_t off_bytes = varlen ? 2 * (shape.batch + 1) * 8 : 0;

  // One pool block holds every request buffer: fewer pool operations, one release.
  struct Part {
    const void* src;
    uint64_t bytes;
    uint64_t offset;
  };
  uint64_t cursor = 0;
  auto place = [&](uint64_t bytes) {
    const uint64_t at = cursor;
    cursor += RoundUp(bytes);
    return at;
  };
  Part in_parts[7] = {
      {host.q, q_bytes, place(q_bytes)},
      {host.k, kv_bytes, place(kv_bytes)},
      {host.v, kv_bytes, place(kv_bytes)},
      {host.q_lengths, host.q_lengths ? shape.batch * 4ull : 0, place(len_bytes / 2)},
      {host.kv_lengths, host.kv_lengths ? shape.batch * 4ull : 0, place(len_bytes / 2)},
      {host.q_offsets, varlen ? (shape.batch + 1) * 8ull : 0, place(off_bytes / 2)},
      {host.kv_offsets, varlen ? (shape.batch + 1) * 8ull : 0, place(off_bytes / 2)},
  };
  const uint64_t o_off = place(q_bytes);
  const uint64_t lse_off = place(lse_bytes);
  const uint64_t ws_off = place(workspace_bytes);
  auto block = pool_->Allocate(cursor);
  if (!block.ok()) return block.status();
  char* base = static_cast<char*>(block->data());

  AttentionTensors dev;
  dev.q = base + in_parts[0].offset;
  dev.k = base + in_parts[1].offset;
  dev.v = base + in_parts[2].offset;
  dev.q_lengths = host.q_lengths ? reinterpret_cast<const int32_t*>(base + in_parts[3].offset)
                                 : nullptr;
  dev.kv_lengths = host.kv_lengths
                       ? reinterpret_cast<const int32_t*>(base + in_parts[4].offset)
                       : nullptr;
  dev.q_offsets = varlen ? reinterpret_cast<const int64_t*>(base + in_parts[5].offset) : nullptr;
  dev.kv_offsets = varlen ? reinterpret_cast<const int64_t*>(base + in_parts[6].offset) : nullptr;
  dev.o = base + o_off;
  dev.lse = shape.return_lse ? reinterpret_cast<float*>(base + lse_off) : nullptr;

  // Host -> device, through pinned staging where it fits.
  ATTN_RETURN_IF_ERROR(CheckCuda(cudaEventRecord(events_[0], stream_), "cudaEventRecord"));
  uint64_t staged = 0;
  for (const Part& p : in_parts) {
    if (p.src == nullptr || p.bytes == 0) continue;
    const void* src = p.src;
    if (staged + p.bytes <= pinned_bytes_) {
      std::memcpy(static_cast<char*>(pinned_) + staged, p.src, p.bytes);
      src = static_cast<char*>(pinned_) + staged;
      staged += RoundUp(p.bytes);
    }
    ATTN_RETURN_IF_ERROR(CheckCuda(
        cudaMemcpyAsync(base + p.offset, src, p.bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync H2D"));
  }
  ATTN_RETURN_IF_ERROR(CheckCuda(cudaEventRecord(events_[1], stream_), "cudaEventRecord"));
  Status run_status = run(dev, base + ws_off, workspace_bytes, cublas_, stream_);
  if (!run_status.ok()) {
    cudaStreamSynchronize(stream_);
    if (run_status.code() == StatusCode::kInternal) {
      faulted_ = true;
      fault_ = run_status.message();
    }
    return run_status;
  }
  ATTN_RETURN_IF_ERROR(CheckCuda(cudaGetLastError(), "kernel launch"));
  ATTN_RETURN_IF_ERROR(CheckCuda(cudaEventRecord(events_[2], stream_), "cudaEventRecord"));
  // Device -> host. Outputs go through pinned memory when they fit (after inputs are done).
  const bool o_pinned = q_bytes + RoundUp(lse_bytes) <= pinned_bytes_;
  char* o_host_dst = o_pinned ? static_cast<char*>(pinned_) : static_cast<char*>(host.o);
  char* lse_host_dst = o_pinned ? static_cast<char*>(pinned_) + RoundUp(q_bytes)
                                : reinterpret_cast<char*>(host.lse);
  ATTN_RETURN_IF_ERROR(CheckCuda(
      cudaMemcpyAsync(o_host_dst, dev.o, q_bytes, cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync D2H"));
  if (lse_bytes > 0) {
    ATTN_RETURN_IF_ERROR(CheckCuda(
        cudaMemcpyAsync(lse_host_dst, dev.lse, lse_bytes, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync D2H"));
  }
  ATTN_RETURN_IF_ERROR(CheckCuda(cudaEventRecord(events_[3], stream_), "cudaEventRecord"));
  ATTN_RETURN_IF_ERROR(CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  if (o_pinned) {
    std::memcpy(host.o, o_host_dst, q_bytes);
    if (lse_bytes > 0) std::memcpy(host.lse, lse_host_dst, lse_bytes);
  }
  times->host_to_device_us = ElapsedUs(events_[0], events_[1]);
  times->kernel_us = ElapsedUs(events_[1], events_[2]);
  times->device_to_host_us = ElapsedUs(events_[2], events_[3]);
  return Status::Ok();
}

}  // namespace attn
