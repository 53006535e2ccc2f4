#include "backends/gpu_context.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace attn {
namespace {

constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

uint64_t RoundUp(uint64_t x) { return (x + 255) / 256 * 256; }

int64_t MsToUs(float ms) { return static_cast<int64_t>(ms * 1000.0f + 0.5f); }

/// One input buffer of a call: where it is on the host, its size and its offset in the call's
/// device block.
struct Part {
  const void* src;
  uint64_t bytes;
  uint64_t offset;
};

/// Execute's round trip: inputs through the lane's staging where they fit (else straight from
/// the caller's memory), the family's run function, outputs back through staging when they fit.
class AttendTrip final : public RoundTrip {
 public:
  AttendTrip(const Part* parts, int num_parts, char* base, const AttentionTensors& dev,
             const AttentionTensors& host, uint64_t q_bytes, uint64_t lse_bytes, void* workspace,
             uint64_t workspace_bytes, cublasContext* cublas, const GpuContext::RunFn& run)
      : parts_(parts),
        num_parts_(num_parts),
        base_(base),
        dev_(dev),
        host_(host),
        q_bytes_(q_bytes),
        lse_bytes_(lse_bytes),
        workspace_(workspace),
        workspace_bytes_(workspace_bytes),
        cublas_(cublas),
        run_(run) {}

  Status Upload(Lane& lane) override {
    // Inputs the caller packed into staging (ExecuteHeld) go up from there; the others are
    // staged after the last of those.
    uint64_t staged = 0;
    for (int i = 0; i < num_parts_; ++i) {
      if (InStaging(lane, parts_[i].src, parts_[i].bytes)) {
        const uint64_t end = reinterpret_cast<uintptr_t>(parts_[i].src) -
                             reinterpret_cast<uintptr_t>(lane.staging()) + parts_[i].bytes;
        staged = std::max(staged, RoundUp(end));
      }
    }
    for (int i = 0; i < num_parts_; ++i) {
      const Part& p = parts_[i];
      if (p.src == nullptr || p.bytes == 0) continue;
      const void* src = p.src;
      if (InStaging(lane, p.src, p.bytes)) {
        // already pinned: upload in place
      } else if (staged + p.bytes <= lane.staging_bytes()) {
        std::memcpy(lane.staging() + staged, p.src, p.bytes);
        src = lane.staging() + staged;
        staged += RoundUp(p.bytes);
      }
      ATTN_RETURN_IF_ERROR(lane.Check(
          cudaMemcpyAsync(base_ + p.offset, src, p.bytes, cudaMemcpyHostToDevice, lane.stream()),
          "cudaMemcpyAsync H2D"));
    }
    return Status::Ok();
  }

  Status Launch(Lane& lane) override {
    ATTN_RETURN_IF_ERROR(run_(dev_, workspace_, workspace_bytes_, cublas_, lane.stream()));
    return lane.Check(cudaGetLastError(), "kernel launch");
  }

  Status Download(Lane& lane) override {
    // Outputs go through pinned memory when they fit (after the inputs are done: stream order),
    // unless the caller's o or lse already is in staging (ExecuteHeld): then each goes straight
    // to where the caller wants it (no bounce that could overlap the caller's buffer).
    const bool caller_staged = InStaging(lane, host_.o, q_bytes_) ||
                               (lse_bytes_ > 0 && InStaging(lane, host_.lse, lse_bytes_));
    o_pinned_ = !caller_staged && q_bytes_ + RoundUp(lse_bytes_) <= lane.staging_bytes();
    o_dst_ = o_pinned_ ? lane.staging() : static_cast<char*>(host_.o);
    lse_dst_ = o_pinned_ ? lane.staging() + RoundUp(q_bytes_) : reinterpret_cast<char*>(host_.lse);
    ATTN_RETURN_IF_ERROR(
        lane.Check(cudaMemcpyAsync(o_dst_, dev_.o, q_bytes_, cudaMemcpyDeviceToHost, lane.stream()),
                   "cudaMemcpyAsync D2H"));
    if (lse_bytes_ > 0) {
      ATTN_RETURN_IF_ERROR(lane.Check(
          cudaMemcpyAsync(lse_dst_, dev_.lse, lse_bytes_, cudaMemcpyDeviceToHost, lane.stream()),
          "cudaMemcpyAsync D2H"));
    }
    return Status::Ok();
  }

  /// Whether [p, p + bytes) lies inside the lane's staging buffer.
  static bool InStaging(const Lane& lane, const void* p, uint64_t bytes) {
    if (p == nullptr || lane.staging() == nullptr || bytes > lane.staging_bytes()) return false;
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    const uintptr_t base = reinterpret_cast<uintptr_t>(lane.staging());
    return at >= base && at - base <= lane.staging_bytes() - bytes;
  }

  void Finish(Lane& lane) override {
    (void)lane;
    if (!o_pinned_) return;
    std::memcpy(host_.o, o_dst_, q_bytes_);
    if (lse_bytes_ > 0) std::memcpy(host_.lse, lse_dst_, lse_bytes_);
  }

 private:
  const Part* parts_;
  const int num_parts_;
  char* const base_;
  const AttentionTensors& dev_;
  const AttentionTensors& host_;
  const uint64_t q_bytes_, lse_bytes_;
  void* const workspace_;
  const uint64_t workspace_bytes_;
  cublasContext* const cublas_;
  const GpuContext::RunFn& run_;
  bool o_pinned_ = false;
  char* o_dst_ = nullptr;
  char* lse_dst_ = nullptr;
};

}  // namespace

GpuContext::GpuContext() : lanes_("CUDA error in ", "device is faulted after an earlier error: ") {}

StatusOr<std::shared_ptr<GpuContext>> GpuContext::Create(int device, double pool_fraction,
                                                         uint64_t pinned_bytes) {
  std::shared_ptr<GpuContext> ctx(new GpuContext());
  StatusOr<DeviceInfo> info = OpenDevice(device);
  if (!info.ok()) return info.status();
  ctx->info_ = *info;
  auto pool = DevicePool::Create(device, pool_fraction);
  if (!pool.ok()) return pool.status();
  ctx->pool_ = std::move(*pool);
  ATTN_RETURN_IF_ERROR(ctx->lanes_.Add(1, device, pinned_bytes, /*growable=*/false, "GPU context"));
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return Internal("cublasCreate failed");
  ctx->cublas_ = handle;
  auto ws = ctx->pool_->Allocate(kCublasWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  ctx->cublas_workspace_ = std::move(*ws);
  LaneLease lease = ctx->lanes_.Acquire();
  if (cublasSetWorkspace(handle, ctx->cublas_workspace_.data(), kCublasWorkspaceBytes) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasSetStream(handle, lease.lane->stream()) != CUBLAS_STATUS_SUCCESS) {
    return Internal("cublasSetWorkspace/cublasSetStream failed");
  }
  return ctx;
}

GpuContext::~GpuContext() {
  {
    LaneLease lease = lanes_.Acquire();
    if (lease.lane != nullptr) cudaStreamSynchronize(lease.lane->stream());
  }
  if (cublas_) cublasDestroy(cublas_);
  cublas_workspace_.Reset();
  // Then the members go in reverse order: lanes_ (stream, events, staging) after the handle
  // that used their stream, the pool last.
}

Status GpuContext::Execute(const AttentionShape& shape, const AttentionTensors& host,
                           uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times) {
  LaneLease lease = lanes_.Acquire();
  return ExecuteHeld(lease, shape, host, workspace_bytes, run, times);
}

Status GpuContext::ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                                 uint64_t workspace_bytes, const RunFn& run, ExecuteTimes* times) {
  const uint64_t esz = kernels::DTypeSize(shape.dtype);
  const uint64_t q_bytes = shape.q_elements() * esz;
  const uint64_t kv_bytes = shape.kv_elements() * esz;
  const uint64_t lse_bytes = shape.return_lse ? shape.lse_elements() * 4 : 0;
  // Inputs: q | k | v; outputs over them once uploaded: o | lse (Execute's places for them).
  const uint64_t k_at = RoundUp(q_bytes), v_at = k_at + RoundUp(kv_bytes);
  const uint64_t lse_at = RoundUp(q_bytes);
  {
    LaneLease lease = lanes_.Acquire();
    char* const staging = lease.lane->staging();
    const uint64_t room = lease.lane->staging_bytes();
    if (staging != nullptr && v_at + kv_bytes <= room && lse_at + lse_bytes <= room) {
      ATTN_RETURN_IF_ERROR(lanes_.latch().Faulted());
      problem.pack(staging, staging + k_at, staging + v_at);
      AttentionTensors host = problem.index;
      host.q = staging;
      host.k = staging + k_at;
      host.v = staging + v_at;
      host.o = staging;
      host.lse = shape.return_lse ? reinterpret_cast<float*>(staging + lse_at) : nullptr;
      ATTN_RETURN_IF_ERROR(ExecuteHeld(lease, shape, host, workspace_bytes, run, times));
      problem.unpack(host.o, host.lse);
      return Status::Ok();
    }
  }  // too big for the staging: the lane is released, Execute takes it again
  return ExecuteStagedOnHost(shape, problem, [&](const AttentionTensors& host) {
    return Execute(shape, host, workspace_bytes, run, times);
  });
}

Status GpuContext::ExecuteHeld(LaneLease& lease, const AttentionShape& shape,
                               const AttentionTensors& host, uint64_t workspace_bytes,
                               const RunFn& run, ExecuteTimes* times) {
  ATTN_RETURN_IF_ERROR(lanes_.latch().Faulted());
  const uint64_t esz = kernels::DTypeSize(shape.dtype);
  const uint64_t q_bytes = shape.q_elements() * esz;
  const uint64_t kv_bytes = shape.kv_elements() * esz;
  const uint64_t lse_bytes = shape.return_lse ? shape.lse_elements() * 4 : 0;
  const bool has_lengths = host.q_lengths != nullptr || host.kv_lengths != nullptr;
  const uint64_t len_bytes = has_lengths ? 2 * shape.batch * 4 : 0;
  const bool varlen = shape.layout == kernels::Layout::kVarlen;
  const uint64_t off_bytes = varlen ? 2 * (shape.batch + 1) * 8 : 0;

  // One pool block holds every request buffer: fewer pool operations, one release.
  uint64_t cursor = 0;
  auto place = [&](uint64_t bytes) {
    const uint64_t at = cursor;
    cursor += RoundUp(bytes);
    return at;
  };
  const Part in_parts[7] = {
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
  dev.q_lengths =
      host.q_lengths ? reinterpret_cast<const int32_t*>(base + in_parts[3].offset) : nullptr;
  dev.kv_lengths =
      host.kv_lengths ? reinterpret_cast<const int32_t*>(base + in_parts[4].offset) : nullptr;
  dev.q_offsets = varlen ? reinterpret_cast<const int64_t*>(base + in_parts[5].offset) : nullptr;
  dev.kv_offsets = varlen ? reinterpret_cast<const int64_t*>(base + in_parts[6].offset) : nullptr;
  dev.o = base + o_off;
  dev.lse = shape.return_lse ? reinterpret_cast<float*>(base + lse_off) : nullptr;

  AttendTrip trip(in_parts, 7, base, dev, host, q_bytes, lse_bytes, base + ws_off, workspace_bytes,
                  cublas_, run);
  LaneTimes lt;
  ATTN_RETURN_IF_ERROR(lease.lane->Run(trip, &lt));
  times->host_to_device_us = MsToUs(lt.h2d_ms);
  times->kernel_us = MsToUs(lt.kernel_ms);
  times->device_to_host_us = MsToUs(lt.d2h_ms);
  return Status::Ok();
}

}  // namespace attn
