// A decoded Extend step and what it did: the request types shared by validation (which decodes
// them), the step executor (backends/paged/extend_step.h, which runs them) and the services.
// Plain data; no compute.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "attn/kernels/attention_problem.h"

namespace attn {

/// Which of a step's tensors live in a client's CUDA IPC region (issue 18 item 3; sequence.proto
/// CudaIpcRegion): a flagged ExtendArgs pointer is a device address on the server's GPU, never
/// read on the host (no replay digest, no FP8 scale derivation); only a backend that serves
/// device I/O (PagedAttentionBackend::ServesDeviceIo) runs such a step, copying the flagged
/// inputs device to device after its stream waited on `ready_event`, and o's rows device to
/// device to `o` as well as to the host output.
struct DeviceStepIo {
  bool q = false, k = false, v = false;  ///< that input pointer is a device address
  /// The client's event (a cudaEvent_t, opaque here) recorded after it wrote the inputs; set
  /// when any input is on the device.
  void *ready_event = nullptr;
  /// Device address of the step's (T, N, H) o rows in the region, or null (o on the host only).
  void *o = nullptr;
  bool inputs() const { return q || k || v; }
  bool any() const { return inputs() || o != nullptr; }
};

/// A decoded Extend request; pointers alias the request's bytes (or a packed batch's rows).
struct ExtendArgs {
  std::string sequence_id;
  int32_t layer = 0;
  int64_t position = 0;
  kernels::DType q_dtype = kernels::DType::kFloat32, k_dtype = q_dtype, v_dtype = q_dtype;
  std::array<int64_t, 3> q_shape{}, k_shape{}, v_shape{};  ///< (T,N,H), (T,K,H), (T,K,H)
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  size_t q_bytes = 0, k_bytes = 0, v_bytes = 0;
  /// Append k/v only, attend nothing (ExtendRequest.append_only): q is null, q_bytes 0,
  /// q_dtype = k_dtype and q_shape = (T, 0, H) with T and H from k (N = 0: no query heads).
  bool append_only = false;
  /// Tensors in a CUDA IPC region (all false / null: everything in host memory).
  DeviceStepIo device;
};

/// Makes `a` (k and v decoded) an append-only step: append_only set, q null, q_bytes 0,
/// q_dtype = k_dtype, q_shape = (T, 0, H) from k.
inline void SetAppendOnly(ExtendArgs *a) {
  a->append_only = true;
  a->q = nullptr;
  a->q_bytes = 0;
  a->q_dtype = a->k_dtype;
  a->q_shape = {a->k_shape[0], 0, a->k_shape[2]};
}

/// What one Extend step did, filled by the step executor (backends/paged/extend_step.h).
struct ExtendOutcome {
  int64_t length = 0;  ///< layer length after the step
  bool replayed = false;
  int64_t kv_len = 0;  ///< keys attended (0 for an append-only step)
  bool append_only = false;  ///< the step appended only: it has no output
  /// Device time of the launches the step ran in (append + attention kernels; a batched
  /// step reports its whole launch group's), and of their host->device / device->host copies,
  /// in µs (LaunchTimes; host wall time of the computation on the CPU path). 0 for replays.
  int64_t kernel_us = 0;
  int64_t h2d_us = 0;
  int64_t d2h_us = 0;
  /// False when the launch group ran without device timing (a CUDA graph replayed without its
  /// event nodes, --kv-timing-every): the three times above are then 0, "not measured".
  bool device_timed = true;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  kernels::DType dtype = kernels::DType::kFloat32;
};

}  // namespace attn
