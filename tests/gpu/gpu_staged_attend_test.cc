// GpuContext::ExecuteStaged (issue 17), the coalesced Attend path of the GPU backends, on the
// fused backend: a batch of padded (with and without lengths) and varlen requests packed by
// PackedAttend::PackInto straight into the lane's pinned staging, and scattered by ScatterFrom
// from where the download left o and lse, gives bitwise the outputs and lse of the two-copy
// path (Pack into host vectors, Execute, Scatter): the device gets the same bytes and runs the
// same kernel. Checked on a context whose staging holds the packed problem (pack must get
// pointers into the lane's staging) and on one of 64 KiB that cannot (the host-vector
// fallback: pack gets pointers outside it), for bf16 and fp16, with and without lse and masks.
// ctest label `gpu`; skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../integration/request_builder.h"
#include "backends/fused_backend.h"
#include "backends/gpu_context.h"
#include "batching/attend_coalescer.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using attn::testing::FillTensor;

bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

struct Signature {
  pb::DType dtype = pb::BFLOAT16;
  pb::CausalAlignment causal = pb::CAUSAL_NONE;
  int64_t window_left = -1;
  bool lse = true;
};

constexpr int64_t kN = 8, kK = 2, kH = 64;

pb::AttendRequest Base(const Signature& s) {
  pb::AttendRequest r;
  r.mutable_mask()->set_causal(s.causal);
  if (s.window_left >= 0) r.mutable_mask()->set_window_left(s.window_left);
  r.set_return_lse(s.lse);
  return r;
}

pb::AttendRequest Padded(const Signature& s, int64_t B, int64_t T, int64_t S, bool lengths,
                         std::mt19937_64* rng) {
  pb::AttendRequest r = Base(s);
  r.set_layout(pb::LAYOUT_PADDED);
  FillTensor(r.mutable_q(), s.dtype, {B, T, kN, kH}, rng);
  FillTensor(r.mutable_k(), s.dtype, {B, S, kK, kH}, rng);
  FillTensor(r.mutable_v(), s.dtype, {B, S, kK, kH}, rng);
  for (int64_t b = 0; lengths && b < B; ++b) {
    r.add_q_lengths(static_cast<int32_t>(1 + (*rng)() % T));
    r.add_kv_lengths(static_cast<int32_t>(1 + (*rng)() % S));
  }
  return r;
}

pb::AttendRequest Varlen(const Signature& s, const std::vector<int32_t>& q_lens,
                         const std::vector<int32_t>& kv_lens, std::mt19937_64* rng) {
  pb::AttendRequest r = Base(s);
  r.set_layout(pb::LAYOUT_VARLEN);
  int64_t tq = 0, tk = 0;
  for (size_t b = 0; b < q_lens.size(); ++b) {
    r.add_q_lengths(q_lens[b]);
    r.add_kv_lengths(kv_lens[b]);
    tq += q_lens[b];
    tk += kv_lens[b];
  }
  FillTensor(r.mutable_q(), s.dtype, {tq, kN, kH}, rng);
  FillTensor(r.mutable_k(), s.dtype, {tk, kK, kH}, rng);
  FillTensor(r.mutable_v(), s.dtype, {tk, kK, kH}, rng);
  return r;
}

/// Every part's output and lse (bytes).
struct Outputs {
  std::vector<std::string> o, lse;
};

Outputs Empty(const std::vector<ValidatedAttend>& parts) {
  Outputs out;
  for (const ValidatedAttend& v : parts) {
    out.o.emplace_back(v.o_bytes, '\x55');
    out.lse.emplace_back(
        v.shape.return_lse ? static_cast<size_t>(v.shape.lse_elements()) * sizeof(float) : 0,
        '\x77');
  }
  return out;
}

float* LsePtr(std::string& bytes) {
  return bytes.empty() ? nullptr : reinterpret_cast<float*>(bytes.data());
}

class GpuStagedAttend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: skipped";
  }
};

TEST_F(GpuStagedAttend, StagedPathIsBitwiseTheTwoCopyPathInAndOutOfStaging) {
  std::mt19937_64 rng(17);
  const std::vector<Signature> signatures = {
      {pb::BFLOAT16, pb::CAUSAL_NONE, -1, true},
      {pb::FLOAT16, pb::CAUSAL_BOTTOM_RIGHT, -1, true},
      {pb::BFLOAT16, pb::CAUSAL_TOP_LEFT, 32, false},
  };
  for (uint64_t staging : {uint64_t{64} << 20, uint64_t{64} << 10}) {
    SCOPED_TRACE("staging bytes " + std::to_string(staging));
    auto ctx = GpuContext::Create(0, 0.05, staging);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    FusedBackend fused(*ctx, "");
    for (const Signature& sig : signatures) {
      std::vector<pb::AttendRequest> requests = {
          Padded(sig, 2, 37, 53, false, &rng), Varlen(sig, {5, 70, 1}, {9, 130, 64}, &rng),
          Padded(sig, 3, 40, 90, true, &rng), Padded(sig, 1, 128, 300, false, &rng)};
      std::vector<ValidatedAttend> parts;
      for (const auto& r : requests) {
        auto v = ValidateAttend(r);
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        parts.push_back(std::move(*v));
      }
      std::vector<const ValidatedAttend*> ptrs;
      for (const auto& v : parts) ptrs.push_back(&v);

      // The two-copy path: Pack's own host buffers, Execute (the lane copies them), Scatter.
      auto packed = PackedAttend::Pack(ptrs);
      ASSERT_TRUE(packed.ok()) << packed.status().ToString();
      ASSERT_TRUE(fused.Supports(packed->shape()).ok());
      ExecuteTimes t;
      Status s = fused.Execute(packed->shape(), packed->Tensors(), &t);
      ASSERT_TRUE(s.ok()) << s.ToString();
      Outputs want = Empty(parts);
      for (size_t i = 0; i < parts.size(); ++i) {
        packed->Scatter(i, parts[i], want.o[i].data(), LsePtr(want.lse[i]));
      }

      // The staged path.
      auto plan = PackedAttend::Plan(ptrs);
      ASSERT_TRUE(plan.ok());
      Outputs got = Empty(parts);
      int packs = 0, unpacks = 0;
      const void* packed_at = nullptr;
      StagedProblem problem;
      problem.index = plan->IndexTensors();
      problem.pack = [&](void* q, void* k, void* v) {
        ++packs;
        packed_at = q;
        plan->PackInto(ptrs, q, k, v);
      };
      problem.unpack = [&](const void* o, const float* lse) {
        ++unpacks;
        for (size_t i = 0; i < parts.size(); ++i) {
          plan->ScatterFrom(i, parts[i], o, lse, got.o[i].data(), LsePtr(got.lse[i]));
        }
      };
      s = fused.ExecuteStaged(plan->shape(), problem, &t);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(packs, 1);
      EXPECT_EQ(unpacks, 1);
      {
        // 64 MiB holds the packed problem (q | k | v, then o | lse); 64 KiB does not.
        const uint64_t es = kernels::DTypeSize(plan->shape().dtype);
        ASSERT_GT(plan->shape().q_elements() * es, uint64_t{64} << 10);
        const bool expect_staged = staging == (uint64_t{64} << 20);
        LaneLease lease = (*ctx)->HoldLane();
        const char* base = lease.lane->staging();
        const char* at = static_cast<const char*>(packed_at);
        EXPECT_EQ(at >= base && at < base + lease.lane->staging_bytes(), expect_staged)
            << "pack got " << packed_at << ", staging at " << static_cast<const void*>(base);
      }
      for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_EQ(got.o[i], want.o[i]) << "o of part " << i;
        EXPECT_EQ(got.lse[i], want.lse[i]) << "lse of part " << i;
      }
    }
  }
}

}  // namespace
}  // namespace attn
