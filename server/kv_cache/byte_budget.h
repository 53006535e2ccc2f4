// Host-memory budgets of the KV cache outside its pages (--replay-cache-bytes,
// --sequence-metadata-bytes): a ByteBudget counts bytes against a cap, a BudgetCharge holds some
// of them for as long as it lives.
// Thread-safety: ByteBudget is thread-safe; a BudgetCharge is used by one owner at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

namespace attn {

/// Host bytes held across all sequences, bounded by `cap` bytes: the stored replay outputs
/// (--replay-cache-bytes; 0 stores nothing) and the sequences' own host metadata
/// (--sequence-metadata-bytes, SequenceMetadataBytes in sequence.h).
class ByteBudget {
 public:
  explicit ByteBudget(int64_t cap) : cap_(cap) {}
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
  BudgetCharge(std::shared_ptr<ByteBudget> budget, int64_t bytes) {
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
  std::shared_ptr<ByteBudget> budget_;
  int64_t bytes_ = 0;
};

}  // namespace attn
