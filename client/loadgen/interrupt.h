// Ctrl-C / SIGTERM handling of attention-loadgen: the first SIGINT or SIGTERM stops new
// requests, lets the calls in flight finish for a bounded grace period, cancels the rest, and
// lets main print and write the partial report; a second signal exits at once.
//
// Signal safety: no signal handler is installed. Install() blocks SIGINT and SIGTERM in the
// calling thread (so in every thread created after it, which inherit the mask) and starts a
// thread that takes them with sigwait(); everything done on a signal runs in that ordinary
// thread, so nothing async-signal-unsafe ever runs in a handler.
#pragma once

#include <grpcpp/client_context.h>

#include <chrono>
#include <string>

namespace attn::loadgen {

/// Process-wide interrupt state (all functions thread-safe).
class Interrupt {
 public:
  using Clock = std::chrono::steady_clock;

  /// Blocks SIGINT and SIGTERM and starts the sigwait thread. Call once, first thing in main,
  /// before any other thread exists (threads inherit the blocked mask). On the first signal,
  /// Requested() turns true, sleepers in SleepUntil() wake, and after `grace_s` seconds every
  /// registered call (ScopedCall) is cancelled (TryCancel; it ends CANCELLED). A second signal
  /// prints one line to stderr and _exit()s with 128 + its number.
  static void Install(double grace_s = 2.0);

  /// True once the first SIGINT/SIGTERM arrived (or Trigger() ran).
  static bool Requested();

  /// The signal's number (SIGINT, SIGTERM), 0 before any.
  static int Signal();

  /// "SIGINT", "SIGTERM", or "" before any signal.
  static std::string SignalName();

  /// The process exit status for an interrupted run: 128 + Signal() (130 SIGINT, 143 SIGTERM).
  static int ExitCode();

  /// Acts as if signal `sig` arrived (tests, and the sigwait thread itself).
  static void Trigger(int sig);

  /// Sleeps until `t` or an interrupt, whichever is first. Returns false when interrupted.
  static bool SleepUntil(Clock::time_point t);

  /// `deadline`, or the end of the grace period when that is earlier (after an interrupt), so a
  /// call made after the interrupt (e.g. a sequence release) cannot outlast the grace.
  static std::chrono::system_clock::time_point CapDeadline(
      std::chrono::system_clock::time_point deadline);

  /// Registers a gRPC call's context for cancellation at the end of the grace period; the call
  /// must stay alive while registered (unregisters in the destructor). When the grace period
  /// is already over, the context is cancelled at once.
  class ScopedCall {
   public:
    explicit ScopedCall(grpc::ClientContext* context);
    ~ScopedCall();
    ScopedCall(const ScopedCall&) = delete;
    ScopedCall& operator=(const ScopedCall&) = delete;

   private:
    grpc::ClientContext* context_;
  };
  /// The same registration without RAII (the open loop's asynchronous calls).
  static void Register(grpc::ClientContext* context);
  static void Unregister(grpc::ClientContext* context);
};

}  // namespace attn::loadgen
