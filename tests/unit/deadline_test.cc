// Which status a cancelled call gets (server/common/deadline.h): a new-user review found
// attn_requests_total counting CANCELLED for Extends whose client saw DEADLINE_EXCEEDED (the
// client's deadline fires first and its cancellation reaches the server before the server's
// own copy of the deadline passes).
#include "common/deadline.h"

#include <gtest/gtest.h>

#include <chrono>

namespace attn {
namespace {

using Clock = std::chrono::system_clock;

TEST(Deadline, CancellationJustBeforeTheServersDeadlineIsTheDeadlines) {
  // The client's deadline fired; the server's copy lies a few ms later.
  EXPECT_EQ(CancelledCallCode(Clock::now() + std::chrono::milliseconds(3)),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(CancelledCallCode(Clock::now() - std::chrono::milliseconds(1)),
            StatusCode::kDeadlineExceeded)
      << "a deadline already past";
}

TEST(Deadline, CancellationWellBeforeTheDeadlineOrWithoutOneIsCancelled) {
  EXPECT_EQ(CancelledCallCode(Clock::now() + std::chrono::seconds(5)), StatusCode::kCancelled);
  EXPECT_EQ(CancelledCallCode(Clock::time_point::max()), StatusCode::kCancelled)
      << "no deadline: only the client can have cancelled";
  EXPECT_FALSE(DeadlineReachedForCancel(Clock::time_point::max()));
}

TEST(Deadline, AbandonedStatusNamesWhichAndWhen) {
  const Status d = AbandonedStatus(Clock::now(), "while queued; the call was not computed");
  EXPECT_EQ(d.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(d.message(), "deadline passed while queued; the call was not computed");
  const Status c = AbandonedStatus(Clock::now() + std::chrono::seconds(5), "while computing");
  EXPECT_EQ(c.code(), StatusCode::kCancelled);
  EXPECT_EQ(c.message(), "cancelled by the client while computing");
}

}  // namespace
}  // namespace attn
