// Stored outputs of each (sequence, layer)'s last step, so that an exact replay of that step
// (a client retry) is answered without appending twice (DESIGN.md §3, §7), and the host-memory
// budget they are charged to. Outputs are host memory outside the KV pool: without a bound,
// a client could make the server hold far more than --kv-cache-bytes (e.g. many layers of a
// sequence with many query heads over one KV head: output bytes per token N·H vs KV bytes
// 2·K·H). A step whose output does not fit the budget is not stored; a retry of it then gets
// FAILED_PRECONDITION with the actual length, which tells the client the step was applied.
// Thread-safety: a ReplayOutput is guarded by its sequence's lock (its ByteBudget is thread-safe).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "kv_cache/byte_budget.h"

namespace attn {

/// One stored output, charged to its budget while held (released on Clear, reassignment and
/// destruction). Move-only.
class ReplayOutput {
 public:
  ReplayOutput() = default;
  ~ReplayOutput() { Clear(); }
  ReplayOutput(ReplayOutput &&o) noexcept : budget_(std::move(o.budget_)), bytes_(std::move(o.bytes_)) {
    o.budget_.reset();
    o.bytes_.clear();
  }
  ReplayOutput &operator=(ReplayOutput &&o) noexcept {
    if (this != &o) {
      Clear();
      budget_ = std::move(o.budget_);
      bytes_ = std::move(o.bytes_);
      o.budget_.reset();
      o.bytes_.clear();
    }
    return *this;
  }
  ReplayOutput(const ReplayOutput &) = delete;
  ReplayOutput &operator=(const ReplayOutput &) = delete;

  /// Replaces the held output with a copy of `o` when `budget` has room for it (the held one's
  /// bytes count as free for it); otherwise holds nothing and returns false. The same budget
  /// and size as before (a decode step after a decode step) touch neither the budget nor the
  /// allocator: the charge changes by the difference only, and the buffer is kept unless it is
  /// more than twice what `o` needs (plus 4 KiB).
  bool Store(const std::shared_ptr<ByteBudget> &budget, const std::string &o) {
    const auto want = static_cast<int64_t>(o.size());
    if (budget == nullptr || budget.get() != budget_.get()) {
      Clear();  // the old charge goes back to its own budget
      if (budget == nullptr || !budget->TryCharge(want)) return false;
      budget_ = budget;
    } else {
      const auto held = static_cast<int64_t>(bytes_.size());
      if (want > held && !budget_->TryCharge(want - held)) {
        Clear();
        return false;
      }
      if (want < held) budget_->Release(held - want);
    }
    if (bytes_.capacity() > 2 * o.size() + 4096) std::string().swap(bytes_);
    bytes_.assign(o);
    return true;
  }
  void Clear() {
    if (budget_ != nullptr) budget_->Release(static_cast<int64_t>(bytes_.size()));
    budget_.reset();
    bytes_.clear();
    bytes_.shrink_to_fit();
  }
  const std::string &bytes() const { return bytes_; }

 private:
  std::shared_ptr<ByteBudget> budget_;
  std::string bytes_;
};

}  // namespace attn
