// CUDA IPC regions in a GPU paged round trip (issue 18 item 3; sequence.proto CudaIpcRegion):
// the inputs of steps whose q/k/v are device addresses in a client's region
// (PagedAppendItem::device, PagedQuery::device) are not packed on the host (PackAppend and
// PackAttend skip them); after the upload, the lane's stream waits on the client's event and
// copies those rows device to device into the call's device buffer, at the offsets the layout
// gave them in staging (so the kernels see what an upload would have put there). After the
// launches, the o rows of steps whose o goes to a region are copied device to device there,
// before the download of o to the host. All of it is enqueued on the lane's stream, outside any
// CUDA graph: a trip with device I/O never runs as a graph (its copies name per-call addresses
// and it waits on another process's event). The lane synchronises before the call returns, so
// when a step reports, its copies are complete.
// CUDA builds only. Thread-safety: pure functions of their arguments (enqueue only).
#pragma once

#include <cuda_runtime.h>

#include "attn/common/status.h"
#include "backends/paged/gpu_paged_jobs.h"
#include "device/lane.h"

namespace attn {

/// True when any item of `a` or `t` (either may be null) has CUDA IPC tensors.
bool HasDeviceIo(const PagedAppendJob *a, const PagedAttendJob *t);

/// Enqueues on the lane's stream: a wait on each item's ready event (consecutive repeats
/// waited once), then the device-to-device copies of the device k/v rows into the append's
/// region `d_a` (at_k / at_v + the item's row offset) and of the device q rows into the
/// attention's region `d_t` (at_q + the step's q_row). Either job may be null. Errors: INTERNAL
/// naming the CUDA call (latched by the lane).
Status CopyDeviceInputs(const PagedAppendJob *a, char *d_a, const PagedAttendJob *t, char *d_t,
                        Lane &lane);

/// Enqueues on the lane's stream the device-to-device copies of each step's o rows (at_o +
/// q_row in `d_t`) to its PagedQuery::device->o. Errors: INTERNAL naming the CUDA call.
Status CopyDeviceOutputs(const PagedAttendJob &t, const char *d_t, Lane &lane);

}  // namespace attn
