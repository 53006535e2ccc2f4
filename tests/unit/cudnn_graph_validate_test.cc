// cuDNN graphs built and validated without a GPU: the frontend's validate() runs its support
// checks for a target SM set explicitly (set_sm_version) and needs only libcudnn loaded (for
// cudnnGetVersion), so the graph construction of every kind is checked on CPU machines (CI).
// Building execution plans needs a handle and a device: that part is only in the GPU tests.
#include <gtest/gtest.h>

#include "attn/kernels/cudnn_graph_key.h"
#include "attn/kernels/cudnn_version.h"
#include "cudnn_internal.h"  // kernels/cudnn

namespace attn::kernels {
namespace {

int64_t Load() {
  auto v = cudnn_detail::LoadCudnn("");
  return v.ok() ? v->version : 0;
}

class CudnnValidate : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Load() == 0) {
      GTEST_SKIP() << "libcudnn.so.9 not loadable here: "
                   << cudnn_detail::LoadCudnn("").status().ToString();
    }
  }
};

CudnnGraphSpec Spec(CudnnGraphKind kind, int sm) {
  CudnnGraphSpec s;
  s.kind = kind;
  s.dtype = kind == CudnnGraphKind::kFp8 ? DType::kFloat8E4M3 : DType::kBFloat16;
  s.ragged = kind != CudnnGraphKind::kFp8;
  s.batch = 4;
  s.q_len = 512;
  s.kv_len = 512;
  s.num_heads = 16;
  s.num_kv_heads = 4;
  s.head_dim = 128;
  s.stats = true;
  s.sm = sm;
  return s;
}

TEST_F(CudnnValidate, EveryMaskOfTheBf16GraphValidatesForHopper) {
  std::printf("libcudnn %s\n", CudnnVersionString(Load()).c_str());
  for (CausalAlignment c :
       {CausalAlignment::kNone, CausalAlignment::kTopLeft, CausalAlignment::kBottomRight}) {
    for (int64_t wl : {-1, 0, 64}) {
      CudnnGraphSpec s = Spec(CudnnGraphKind::kSdpa, 90);
      s.mask.causal = c;
      s.mask.window_left = wl;
      auto g = cudnn_detail::MakeCudnnGraph(s);
      EXPECT_TRUE(g.ok()) << s.Key() << ": " << g.status().ToString();
    }
  }
  CudnnGraphSpec dense = Spec(CudnnGraphKind::kSdpa, 90);
  dense.ragged = false;
  EXPECT_TRUE(cudnn_detail::MakeCudnnGraph(dense).ok());
}

TEST_F(CudnnValidate, PagedGraphValidates) {
  CudnnGraphSpec s = Spec(CudnnGraphKind::kPaged, 90);
  s.mask.causal = CausalAlignment::kBottomRight;
  s.page_tokens = 16;
  s.num_pages = 1024;
  s.max_pages_per_seq = 32;
  s.q_len = 16;
  s.kv_len = 512;
  auto g = cudnn_detail::MakeCudnnGraph(s);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
}

TEST_F(CudnnValidate, Fp8NeedsHopperAndRefusesBottomRightThere) {
  CudnnGraphSpec s = Spec(CudnnGraphKind::kFp8, 90);
  s.mask.causal = CausalAlignment::kTopLeft;
  auto ok = cudnn_detail::MakeCudnnGraph(s);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  CudnnGraphSpec l4 = s;
  l4.sm = 89;
  auto no = cudnn_detail::MakeCudnnGraph(l4);
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(no.status().message().find("Hopper"), std::string::npos) << no.status().message();
  CudnnGraphSpec br = s;
  br.mask.causal = CausalAlignment::kBottomRight;
  EXPECT_FALSE(cudnn_detail::MakeCudnnGraph(br).ok());
}

TEST_F(CudnnValidate, InvalidGraphsAreRefusedWithTheFrontendsReason) {
  CudnnGraphSpec s = Spec(CudnnGraphKind::kSdpa, 90);
  s.head_dim = 60;  // not a multiple of 8
  auto g = cudnn_detail::MakeCudnnGraph(s);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("cuDNN"), std::string::npos) << g.status().message();
  CudnnGraphSpec ampere_old = Spec(CudnnGraphKind::kSdpa, 75);
  EXPECT_FALSE(cudnn_detail::MakeCudnnGraph(ampere_old).ok());
}

}  // namespace
}  // namespace attn::kernels
