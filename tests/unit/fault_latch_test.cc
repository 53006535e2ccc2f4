// FaultLatch (server/device/fault_latch.h): the first cause is kept and every later call gets
// INTERNAL naming it, the rule every GPU executor's lanes share.
#include "device/fault_latch.h"

#include <gtest/gtest.h>

namespace attn {
namespace {

TEST(FaultLatch, FirstCauseIsKeptAndLaterCallsFailWithIt) {
  FaultLatch latch("CUDA error in ", "device is faulted after an earlier error: ");
  EXPECT_TRUE(latch.Faulted().ok());
  EXPECT_FALSE(latch.faulted());
  const Status first = latch.Trip("cudaMemcpyAsync H2D: an illegal memory access");
  EXPECT_EQ(first.code(), StatusCode::kInternal);
  EXPECT_EQ(first.message(), "CUDA error in cudaMemcpyAsync H2D: an illegal memory access");
  EXPECT_TRUE(latch.faulted());
  latch.Latch("kernel launch: later cause");
  const Status second = latch.Trip("cudaStreamSynchronize: yet another");
  EXPECT_EQ(second.message(), "CUDA error in cudaStreamSynchronize: yet another");
  const Status later = latch.Faulted();
  EXPECT_EQ(later.code(), StatusCode::kInternal);
  EXPECT_EQ(later.message(),
            "device is faulted after an earlier error: cudaMemcpyAsync H2D: an illegal memory "
            "access");
}

TEST(FaultLatch, LatchWithoutTripFaultsWithThatCause) {
  FaultLatch latch("CUDA error in GPU paged attention, ", "GPU paged attention is faulted: ");
  latch.Latch("paged decode launch failed");
  EXPECT_EQ(latch.Faulted().message(),
            "GPU paged attention is faulted: paged decode launch failed");
}

}  // namespace
}  // namespace attn
