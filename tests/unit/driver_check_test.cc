// Unit tests of the NVIDIA driver check (backends/driver_check.h): the CUDA runtime needs a
// driver of at least its version (minor-version compatibility), with the driver branch named.
#include "backends/driver_check.h"

#include <gtest/gtest.h>

#include <string>

namespace attn {
namespace {

TEST(DriverCheck, Cuda13NeedsAnR580Driver) {
  EXPECT_EQ(CudaVersionString(13000), "13.0");
  EXPECT_EQ(CudaVersionString(12090), "12.9");
  EXPECT_EQ(CudaVersionString(0), "none");
  EXPECT_TRUE(CheckCudaDriver(13000, 13000).ok());
  EXPECT_TRUE(CheckCudaDriver(13010, 13000).ok());   // newer driver
  EXPECT_TRUE(CheckCudaDriver(13000, 13020).ok());   // minor-version compatibility
  const Status old = CheckCudaDriver(12090, 13000);  // an R575 driver
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("12.9"), std::string::npos) << old.message();
  EXPECT_NE(old.message().find("R580"), std::string::npos) << old.message();
  const Status none = CheckCudaDriver(0, 13000);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("no NVIDIA driver"), std::string::npos) << none.message();
  EXPECT_TRUE(CheckCudaDriver(12040, 12000).ok());
  EXPECT_NE(CheckCudaDriver(11080, 12000).message().find("R525"), std::string::npos);
}

}  // namespace
}  // namespace attn
