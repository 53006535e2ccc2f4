// A unary reactor that reports cancellation (gRPC callback API): OnCancel runs `on_cancel`
// (e.g. BatchScheduler::Notify, so a queued call is dropped and releases what it holds at
// once instead of when its batch forms). The call must still be finished exactly once with
// Finish(); the reactor deletes itself in OnDone, after running the callback given to
// SetOnDone (the call is over: its response was written, or it was cancelled). Thread-safety: as
// grpc::ServerUnaryReactor; `on_cancel` runs on a gRPC thread and must be cheap and thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <utility>

namespace attn {

class CancellableUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit CancellableUnaryReactor(std::function<void()> on_cancel)
      : on_cancel_(std::move(on_cancel)) {}
  void OnCancel() override {
    if (on_cancel_) on_cancel_();
  }
  /// Runs `on_done` in OnDone. Call before Finish().
  void SetOnDone(std::function<void()> on_done) { on_done_ = std::move(on_done); }
  void OnDone() override {
    if (on_done_) on_done_();
    delete this;
  }

 private:
  std::function<void()> on_cancel_;
  std::function<void()> on_done_;
};

}  // namespace attn
