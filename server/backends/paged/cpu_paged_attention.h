// The paged backend on the host ("paged-cpu"): appends and gathers through
// kernels/cpu/paged_kv_cpu and attends with the CPU reference
// (kernels::CpuAttention, bottom-right causal). When the cache dtype equals q's
// dtype the gathered K/V are bit-identical to what was sent, so the result
// equals the stateless Attend on the concatenated history exactly; FP8 caches
// are dequantised to float32 and q/o are converted around a float32
// computation. A long prefill stops part-way when its step stops being wanted (deadline,
// cancellation: PagedAttendItem::stop). Thread-safety: reentrant; scratch buffers are per thread.
#pragma once

#include <string>

#include "backends/paged/paged_attention_backend.h"

namespace attn {

/// The paged backend "paged-cpu": see the file comment.
class CpuPagedAttention final : public PagedAttentionBackend {
 public:
  /// `cpu_threads`: threads one Attend may use (0: hardware concurrency).
  explicit CpuPagedAttention(int cpu_threads) : cpu_threads_(cpu_threads) {}
  const std::string &name() const override { return name_; }
  const std::string &device() const override { return device_; }
  Status Append(const PagedLayerView &layer, int64_t start, int64_t tokens, const void *k,
                const void *v, kernels::DType src_dtype, int64_t *saturations) override;
  Status CopyPage(const kernels::PagedKvPool &pool, int32_t src, int32_t dst,
                  int64_t tokens) override;
  Status Attend(const PagedLayerView &layer, const PagedQuery &q, void *o) override;
  /// Attend for each item in order; an item whose `stop` says stop (polled about every 2^20
  /// multiply-adds, from the computation's threads) ends part-way with the reason in
  /// *stopped, and the next item runs (PagedAttendItem). Other errors end the call.
  Status AttendBatch(const PagedAttendItem *items, size_t n, LaunchTimes *times) override;

 private:
  /// Attend, asking `stop` (may be null) while it computes; *why gets its first non-OK answer.
  Status AttendStoppable(const PagedLayerView &layer, const PagedQuery &q, void *o,
                         const std::function<Status()> *stop, Status *why);

  const int cpu_threads_;
  const std::string name_ = "paged-cpu";
  const std::string device_ = "cpu";
};

}  // namespace attn
