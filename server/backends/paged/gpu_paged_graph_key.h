// The CUDA graph key of a GPU paged round trip (GpuPagedAttention; device/graph_cache.h): every
// value that LaunchAppend and LaunchAttend (gpu_paged_jobs.h) hand the kernels besides the bytes
// they upload. Two trips with equal keys enqueue identical work, so one captured graph serves
// both; a trip whose split plan, batch, layout or pool differs in anything gets another key,
// so a replay never runs a stale plan (issue 18 item 4).
// CUDA builds only. Thread-safety: pure functions of their arguments.
#pragma once

#include "backends/paged/gpu_paged_jobs.h"
#include "device/graph_cache.h"

namespace attn {

/// The append's part: the layout (batch, heads, row bytes, largest new-token count, block-table
/// stride, launches, segment offsets), source dtype and the pool; with FP8 pages each item's
/// token count (each item is a launch of its own, sized by it).
void PutAppendGraphKey(const PagedAppendJob &j, GraphKeyWriter &w);

/// The attention's part: the decode plan (its shape, split, grid and shared memory, launcher,
/// workspace), the layout's offsets and the pool. False when the job has prefill steps (their
/// fused launches run as plain launches: the kernels dominate there, and their plans are not
/// keyed).
bool PutAttendGraphKey(const PagedAttendJob &j, GraphKeyWriter &w);

}  // namespace attn
