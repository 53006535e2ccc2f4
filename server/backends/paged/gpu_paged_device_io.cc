#include "backends/paged/gpu_paged_device_io.h"

#include <cstdint>

namespace attn {
namespace {

/// Waits on `event` unless it is the one waited on last (steps of one region share it).
Status WaitOnce(void *event, void **last, Lane &lane) {
  if (event == nullptr || event == *last) return Status::Ok();
  *last = event;
  return lane.Check(cudaStreamWaitEvent(lane.stream(), static_cast<cudaEvent_t>(event), 0),
                    "cudaStreamWaitEvent (a CUDA IPC region's client event)");
}

Status CopyD2D(void *dst, const void *src, uint64_t bytes, Lane &lane, const char *what) {
  if (bytes == 0) return Status::Ok();
  return lane.Check(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, lane.stream()),
      what);
}

}  // namespace

bool HasDeviceIo(const PagedAppendJob *a, const PagedAttendJob *t) {
  if (a != nullptr) {
    for (int64_t b = 0; b < a->B; ++b) {
      if (a->items[b].device != nullptr) return true;
    }
  }
  if (t != nullptr) {
    for (int64_t i = 0; i < t->count; ++i) {
      if (t->queries[i].device != nullptr) return true;
    }
  }
  return false;
}

Status CopyDeviceInputs(const PagedAppendJob *a, char *d_a, const PagedAttendJob *t, char *d_t,
                        Lane &lane) {
  void *waited = nullptr;
  if (a != nullptr) {
    uint64_t row = 0;  // the item's first row in the packed k/v (PackAppend's offsets)
    for (int64_t b = 0; b < a->B; ++b) {
      const PagedAppendItem &it = a->items[b];
      const uint64_t at = row * static_cast<uint64_t>(a->row_bytes);
      const uint64_t bytes = static_cast<uint64_t>(it.tokens * a->row_bytes);
      row += static_cast<uint64_t>(it.tokens);
      if (it.device == nullptr || !it.device->inputs()) continue;
      ATTN_RETURN_IF_ERROR(WaitOnce(it.device->ready_event, &waited, lane));
      if (it.device->k) {
        ATTN_RETURN_IF_ERROR(CopyD2D(d_a + a->at_k + at, it.k, bytes, lane,
                                     "cudaMemcpyAsync D2D (k from a CUDA IPC region)"));
      }
      if (it.device->v) {
        ATTN_RETURN_IF_ERROR(CopyD2D(d_a + a->at_v + at, it.v, bytes, lane,
                                     "cudaMemcpyAsync D2D (v from a CUDA IPC region)"));
      }
    }
  }
  if (t != nullptr) {
    for (int64_t i = 0; i < t->count; ++i) {
      const PagedQuery &q = t->queries[i];
      if (q.device == nullptr || !q.device->q) continue;
      ATTN_RETURN_IF_ERROR(WaitOnce(q.device->ready_event, &waited, lane));
      const uint64_t at = static_cast<uint64_t>(t->split.items[i].q_row * t->row_bytes);
      ATTN_RETURN_IF_ERROR(CopyD2D(d_t + t->at_q + at, q.q,
                                   static_cast<uint64_t>(q.tokens * t->row_bytes), lane,
                                   "cudaMemcpyAsync D2D (q from a CUDA IPC region)"));
    }
  }
  return Status::Ok();
}

Status CopyDeviceOutputs(const PagedAttendJob &t, const char *d_t, Lane &lane) {
  for (int64_t i = 0; i < t.count; ++i) {
    const PagedQuery &q = t.queries[i];
    if (q.device == nullptr || q.device->o == nullptr) continue;
    const uint64_t at = static_cast<uint64_t>(t.split.items[i].q_row * t.row_bytes);
    ATTN_RETURN_IF_ERROR(CopyD2D(q.device->o, d_t + t.at_o + at,
                                 static_cast<uint64_t>(q.tokens * t.row_bytes), lane,
                                 "cudaMemcpyAsync D2D (o into a CUDA IPC region)"));
  }
  return Status::Ok();
}

}  // namespace attn
