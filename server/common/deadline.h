// Which status a cancelled call gets: DEADLINE_EXCEEDED when the cancellation is its deadline's,
// else CANCELLED (a new-user review found attn_requests_total counting CANCELLED for calls whose
// client saw DEADLINE_EXCEEDED).
//
// When a client's deadline passes, its gRPC library ends the call locally (the client sees
// DEADLINE_EXCEEDED) and sends a cancellation. The server's copy of the deadline is the timeout
// the client sent, counted from when the server received the call, so it lies up to one trip
// later than the client's; the cancellation can arrive before it. A cancellation within
// kDeadlineCancelSlack of the server's deadline is therefore the deadline's. A client that
// cancels by hand that close to its own deadline is counted as a deadline (harmless).
// Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "attn/common/status.h"

namespace attn {

/// How much earlier than the server's copy of a deadline the client's deadline may fire: one
/// request's trip plus the server's queueing before it stamps the deadline (loopback and LAN
/// trips are well under 1 ms; 20 ms leaves room for a loaded host).
inline constexpr std::chrono::milliseconds kDeadlineCancelSlack{20};

/// True when `deadline` has passed or lies within kDeadlineCancelSlack of now (so a
/// cancellation seen now is the deadline's). time_point::max() (no deadline) never is.
inline bool DeadlineReachedForCancel(std::chrono::system_clock::time_point deadline) {
  const auto now = std::chrono::system_clock::now();
  return deadline != std::chrono::system_clock::time_point::max() &&
         now >= deadline - kDeadlineCancelSlack;
}

/// The code of a call that was cancelled, or abandoned, with `deadline`: DEADLINE_EXCEEDED when
/// DeadlineReachedForCancel(deadline), else CANCELLED.
inline StatusCode CancelledCallCode(std::chrono::system_clock::time_point deadline) {
  return DeadlineReachedForCancel(deadline) ? StatusCode::kDeadlineExceeded
                                            : StatusCode::kCancelled;
}

/// The status of a call abandoned with `deadline`: CancelledCallCode's code, and the message
/// "deadline passed " or "cancelled by the client " followed by `when` (e.g. "while queued; the
/// call was not computed").
inline Status AbandonedStatus(std::chrono::system_clock::time_point deadline,
                              std::string_view when) {
  const StatusCode code = CancelledCallCode(deadline);
  return Status(code,
                std::string(code == StatusCode::kDeadlineExceeded ? "deadline passed "
                                                                  : "cancelled by the client ") +
                    std::string(when));
}

}  // namespace attn
