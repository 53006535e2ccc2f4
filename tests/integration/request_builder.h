// Builds AttendRequests with random normal inputs for integration tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "attention/v1/attention.pb.h"
#include "attn/kernels/attention_problem.h"
#include "attn/kernels/host_dtype.h"

namespace attn::testing {

inline void FillTensor(attention::v1::Tensor* t, attention::v1::DType dtype,
                       std::initializer_list<int64_t> shape, std::mt19937_64* rng) {
  t->set_dtype(dtype);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  const kernels::DType kd = dtype == attention::v1::FLOAT32   ? kernels::DType::kFloat32
                            : dtype == attention::v1::FLOAT16 ? kernels::DType::kFloat16
                                                              : kernels::DType::kBFloat16;
  std::string* data = t->mutable_data();
  data->resize(n * kernels::DTypeSize(kd));
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) kernels::StoreFromFloat(data->data(), kd, i, normal(*rng));
}

/// A padded (B,T,N,H)/(B,S,K,H) request with random normal q, k, v.
inline attention::v1::AttendRequest PaddedRequest(int64_t B, int64_t T, int64_t S, int64_t N,
                                                  int64_t K, int64_t H,
                                                  attention::v1::DType dtype, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  attention::v1::AttendRequest r;
  r.set_layout(attention::v1::LAYOUT_PADDED);
  FillTensor(r.mutable_q(), dtype, {B, T, N, H}, &rng);
  FillTensor(r.mutable_k(), dtype, {B, S, K, H}, &rng);
  FillTensor(r.mutable_v(), dtype, {B, S, K, H}, &rng);
  return r;
}

}  // namespace attn::testing
