// fp8_quantize_test: Fp8QuantizePerTensor / Fp8Dequantize (attn/kernels/fp8_quantize.h) on the
// GPU, checked EXACTLY against a host computation: amax (bit-exact), scale = 448/amax and
// descale = 1/scale (bit-exact, fp32 division on both sides), and every output byte against
// FloatToE4M3Sat(float(x) · scale) (round to nearest even, saturating); saturation of inf and of
// values above 448 with scale 1; NaN handling; the scalar (unaligned) and vector paths; n = 0.
// The host E4M3 conversions are themselves checked against the OCP table's landmarks.
// Without a CUDA device (or one below sm_89: the hardware cvt is sm_89+, the emulated path
// would be tested instead) the GPU tests skip with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/kernels/device_limits.h"
#include "attn/kernels/fp8_quantize.h"
#include "attn/kernels/host_dtype.h"

namespace attn::kernels {
namespace {

std::string SkipReason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return "no CUDA device: skipped";
  }
  StatusOr<DeviceLimits> l = GetDeviceLimits(0);
  if (!l.ok()) return "no CUDA device: skipped (" + l.status().ToString() + ")";
  if (l->compute_capability < 890) return "device below sm_89: skipped";
  return "";
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Host model of the quantiser for 16-bit input `data` of `dtype`.
struct Expected {
  float amax = 0, scale = 1, descale = 1;
  std::vector<uint8_t> bytes;
};
Expected HostQuantize(const std::vector<uint16_t>& data, DType dtype) {
  Expected e;
  bool nan = false;
  for (uint16_t h : data) {
    const float x = LoadAsFloat(&h, dtype, 0);
    if (std::isnan(x)) nan = true;
    e.amax = std::max(e.amax, std::fabs(x));
  }
  if (nan) e.amax = std::numeric_limits<float>::quiet_NaN();
  e.scale = Fp8ScaleForAmax(e.amax);
  e.descale = 1.f / e.scale;
  for (uint16_t h : data) {
    volatile float prod = LoadAsFloat(&h, dtype, 0) * e.scale;  // one fp32 rounding, no FMA
    e.bytes.push_back(FloatToE4M3Sat(prod));
  }
  return e;
}

/// Runs the quantiser on `data` placed `offset` elements into a device buffer (offset 1: the
/// unaligned scalar path) and compares everything with HostQuantize.
void CheckQuantize(const std::vector<uint16_t>& data, DType dtype, int offset,
                   const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t n = static_cast<int64_t>(data.size());
  uint16_t* src = nullptr;
  uint8_t* dst = nullptr;
  float* sc = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), (n + offset + 8) * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dst), n + offset + 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&sc), 3 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src + offset, data.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(sc, 0xFF, 3 * sizeof(float)), cudaSuccess);  // poison
  const Status st = Fp8QuantizePerTensor(src + offset, dtype, n, dst + offset, sc, sc + 1,
                                         sc + 2, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(n);
  float s[3];
  ASSERT_EQ(cudaMemcpy(got.data(), dst + offset, n, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(s, sc, sizeof(s), cudaMemcpyDeviceToHost), cudaSuccess);
  const Expected e = HostQuantize(data, dtype);
  if (std::isnan(e.amax)) {
    EXPECT_TRUE(std::isnan(s[2])) << "amax " << s[2];
  } else {
    EXPECT_EQ(Bits(s[2]), Bits(e.amax)) << "amax got " << s[2] << " want " << e.amax;
  }
  EXPECT_EQ(Bits(s[0]), Bits(e.scale)) << "scale got " << s[0] << " want " << e.scale;
  EXPECT_EQ(Bits(s[1]), Bits(e.descale)) << "descale got " << s[1] << " want " << e.descale;
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool nan_want = (e.bytes[i] & 0x7F) == 0x7F;
    const bool ok = nan_want ? (got[i] & 0x7F) == 0x7F : got[i] == e.bytes[i];
    if (!ok && ++mismatches <= 10) {
      ADD_FAILURE() << "element " << i << " x=" << LoadAsFloat(&data[i], dtype, 0)
                    << " x*scale=" << LoadAsFloat(&data[i], dtype, 0) * e.scale << ": got 0x"
                    << std::hex << int{got[i]} << " want 0x" << int{e.bytes[i]} << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);

  // Dequantise back to float32 and check element-wise: float(e4m3) · descale.
  float* back = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&back), (n + 1) * sizeof(float)), cudaSuccess);
  ASSERT_TRUE(Fp8Dequantize(dst + offset, n, sc + 1, DType::kFloat32, back, nullptr).ok());
  std::vector<float> deq(n);
  ASSERT_EQ(cudaMemcpy(deq.data(), back, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int64_t i = 0; i < n && i < 4096; ++i) {
    const float want = E4M3ToFloat(got[i]) * s[1];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(deq[i])) << i;
    } else {
      ASSERT_EQ(Bits(deq[i]), Bits(want)) << "dequantised element " << i;
    }
  }
  cudaFree(back);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(sc);
}

/// splitmix64 + Box-Muller: deterministic normal samples.
std::vector<float> Normals(int64_t n, uint64_t seed, float sigma) {
  std::vector<float> out(n);
  uint64_t s = seed;
  auto next = [&] {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return ((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0) + 1e-12;
  };
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(sigma * std::sqrt(-2 * std::log(next())) *
                                std::cos(6.283185307179586 * next()));
  }
  return out;
}

std::vector<uint16_t> Encode(const std::vector<float>& x, DType dtype) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) StoreFromFloat(out.data(), dtype, i, x[i]);
  return out;
}

class Fp8QuantizeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = SkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(Fp8QuantizeGpu, RandomNormalExact) {
  for (DType d : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1000}, int64_t{1} << 20,
                      (int64_t{1} << 20) + 13}) {
      std::vector<float> x = Normals(n, 17 + n, 3.f);
      for (int offset : {0, 1}) {
        CheckQuantize(Encode(x, d), d, offset,
                      std::string(DTypeName(d)) + " n=" + std::to_string(n) +
                          " offset=" + std::to_string(offset));
      }
    }
  }
}

// One planted maximum far from the rest (the amax must be found wherever it is: first, last,
// middle of the vector part, in the scalar tail) and tiny values that go subnormal or to zero.
TEST_F(Fp8QuantizeGpu, PlantedMaxAndTinyValues) {
  const int64_t n = 100003;
  for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
    std::vector<float> x = Normals(n, 5 + pos, 1e-3f);
    x[pos] = -1234.5f;
    CheckQuantize(Encode(x, DType::kBFloat16), DType::kBFloat16, 0,
                  "planted max at " + std::to_string(pos));
  }
}

// Saturation: inf makes amax inf, so scale = 1 and descale = 1; then inf -> ±448 (0x7E/0xFE),
// values above 448 -> ±448, values below stay exact E4M3 roundings.
TEST_F(Fp8QuantizeGpu, SaturatesWithInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {inf, -inf, 1000.f, -500.f, 448.f, 464.f, 300.f, 0.f, -0.f, 1.0625f};
  for (DType d : {DType::kBFloat16, DType::kFloat16}) {
    CheckQuantize(Encode(x, d), d, 0, std::string("saturation ") + DTypeName(d));
  }
  // The bytes themselves, independent of the host model.
  std::vector<uint16_t> data = Encode(x, DType::kBFloat16);
  const Expected e = HostQuantize(data, DType::kBFloat16);
  EXPECT_EQ(e.scale, 1.f);
  EXPECT_EQ(e.bytes[0], 0x7E);
  EXPECT_EQ(e.bytes[1], 0xFE);
  EXPECT_EQ(e.bytes[2], 0x7E);
  EXPECT_EQ(e.bytes[3], 0xFE);
  EXPECT_EQ(e.bytes[4], 0x7E);
}

TEST_F(Fp8QuantizeGpu, NanPropagates) {
  std::vector<float> x = Normals(1000, 3, 1.f);
  x[500] = std::numeric_limits<float>::quiet_NaN();
  CheckQuantize(Encode(x, DType::kBFloat16), DType::kBFloat16, 0, "NaN");
}

TEST_F(Fp8QuantizeGpu, AllZerosAndEmpty) {
  CheckQuantize(std::vector<uint16_t>(4096, 0), DType::kBFloat16, 0, "zeros");
  float* sc = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&sc), 3 * sizeof(float)), cudaSuccess);
  ASSERT_TRUE(Fp8QuantizePerTensor(nullptr, DType::kFloat16, 0, nullptr, sc, sc + 1, sc + 2,
                                   nullptr)
                  .ok());
  float s[3];
  ASSERT_EQ(cudaMemcpy(s, sc, sizeof(s), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(s[0], 1.f);
  EXPECT_EQ(s[1], 1.f);
  EXPECT_EQ(s[2], 0.f);
  cudaFree(sc);
}

// Host-only checks.

TEST(Fp8QuantizeArgs, Refusals) {
  float f = 0;
  EXPECT_EQ(Fp8QuantizePerTensor(&f, DType::kFloat32, 1, &f, &f, &f, &f, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8QuantizePerTensor(&f, DType::kBFloat16, -1, &f, &f, &f, &f, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8QuantizePerTensor(nullptr, DType::kBFloat16, 4, &f, &f, &f, &f, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8QuantizePerTensor(&f, DType::kBFloat16, 4, &f, nullptr, &f, &f, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8Dequantize(&f, 1, nullptr, DType::kFloat8E4M3, &f, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// The host E4M3 conversions: OCP OFP8 landmarks, exhaustive round trip of every byte, and
// round-to-nearest-even at midpoints.
TEST(E4M3Host, Landmarks) {
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.f);
  EXPECT_EQ(E4M3ToFloat(0xFE), -448.f);
  EXPECT_EQ(E4M3ToFloat(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(E4M3ToFloat(0x38), 1.f);
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0xFF)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToE4M3Sat(E4M3ToFloat(static_cast<uint8_t>(b))), b == 0x80 ? 0x80 : b) << b;
  }
  EXPECT_EQ(FloatToE4M3Sat(1.0625f), 0x38);  // midpoint 1 | 1.125 -> even (1.0)
  EXPECT_EQ(FloatToE4M3Sat(1.1875f), 0x3A);  // midpoint 1.125 | 1.25 -> even (1.25)
  EXPECT_EQ(FloatToE4M3Sat(1e9f), 0x7E);
  EXPECT_EQ(FloatToE4M3Sat(-1e9f), 0xFE);
  EXPECT_EQ(FloatToE4M3Sat(std::ldexp(1.f, -10)), 0x00);  // tie to even (0)
  EXPECT_EQ(FloatToE4M3Sat(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(FloatToE4M3Sat(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(Fp8ScaleForAmax(0.f), 1.f);
  EXPECT_EQ(Fp8ScaleForAmax(std::numeric_limits<float>::infinity()), 1.f);
  EXPECT_EQ(Fp8ScaleForAmax(448.f), 1.f);
  EXPECT_EQ(Fp8ScaleForAmax(1e-40f), kFp8MaxScale);
}

}  // namespace
}  // namespace attn::kernels
