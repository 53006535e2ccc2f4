// Stored outputs of each (sequence, layer)'s last step, so that an exact replay of that step
// (a client retry) is answered without appending twice (DESIGN.md §3, §7), and the host-memory
// budget they are charged to. Outputs are host memory outside the KV pool: without a bound,
// a client could make the server hold far more than --kv-cache-bytes (e.g. many layers of a
// sequence with many query heads over one KV head: output bytes per token N·H vs KV bytes
// 2·K·H). A step whose output does not fit the budget is not stored; a retry of it then gets
// FAILED_PRECONDITION with the actual length, which tells the client the step was applied.
// Thread-safety: ReplayBudget is thread-safe; a ReplayOutput is guarded by its sequence's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace attn {

/// Host bytes held across all sequences, bounded by `cap` bytes: the stored replay outputs
/// (--replay-cache-bytes; 0 stores nothing) and the sequences' own host metadata
/// (--sequence-metadata-bytes, SequenceMetadataBytes in sequence.h).
class ReplayBudget {
 public:
  explicit ReplayBudget(int64_t cap) : cap_(cap) {}
  /// Adds `bytes` when the total stays within the cap; false (nothing added) otherwise.
  bool TryCharge(int64_t bytes) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > cap_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t cap() const { return cap_; }

 private:
  const int64_t cap_;
  std::atomic<int64_t> used_{0};
};

/// `bytes` charged to a budget while this object lives (released on destruction and on
/// reassignment). Move-only; an empty charge holds nothing.
class BudgetCharge {
 public:
  BudgetCharge() = default;
  /// Charges `bytes` when `budget` has room: ok() tells whether it did.
  BudgetCharge(std::shared_ptr<ReplayBudget> budget, int64_t bytes) {
    if (budget != nullptr && budget->TryCharge(bytes)) {
      budget_ = std::move(budget);
      bytes_ = bytes;
    }
  }
  ~BudgetCharge() { Reset(); }
  BudgetCharge(BudgetCharge &&o) noexcept : budget_(std::move(o.budget_)), bytes_(o.bytes_) {
    o.budget_.reset();
    o.bytes_ = 0;
  }
  BudgetCharge &operator=(BudgetCharge &&o) noexcept {
    if (this != &o) {
      Reset();
      budget_ = std::move(o.budget_);
      bytes_ = o.bytes_;
      o.budget_.reset();
      o.bytes_ = 0;
    }
    return *this;
  }
  BudgetCharge(const BudgetCharge &) = delete;
  BudgetCharge &operator=(const BudgetCharge &) = delete;
  bool ok() const { return budget_ != nullptr; }
  void Reset() {
    if (budget_ != nullptr) budget_->Release(bytes_);
    budget_.reset();
    bytes_ = 0;
  }

 private:
  std::shared_ptr<ReplayBudget> budget_;
  int64_t bytes_ = 0;
};

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

  /// Replaces the held output with a copy of `o` when `budget` has room for it; otherwise
  /// holds nothing and returns false.
  bool Store(const std::shared_ptr<ReplayBudget> &budget, const std::string &o) {
    Clear();
    if (budget == nullptr || !budget->TryCharge(static_cast<int64_t>(o.size()))) return false;
    budget_ = budget;
    bytes_ = o;
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
  std::shared_ptr<ReplayBudget> budget_;
  std::string bytes_;
};

}  // namespace attn
