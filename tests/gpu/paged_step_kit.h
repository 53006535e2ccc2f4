// Shared pieces of the server-side GPU KV-cache tests (gpu_paged_attention_test,
// gpu_paged_graphs_test): whether a CUDA device is present, a test's head/dtype
// configuration, the SequenceConfig it makes, random step inputs and one owned step.
// Header-only; test code.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "attn/kernels/host_dtype.h"
#include "kv_cache/extend_args.h"
#include "kv_cache/sequence_store.h"

namespace attn::paged_test {

/// True when CUDA sees a device (the tests GTEST_SKIP otherwise, saying so).
inline bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

/// q/o dtype, KV page dtype, query heads N, KV heads K, head dim H.
struct Config {
  kernels::DType dtype;
  kernels::DType kv_dtype;
  int32_t num_heads, num_kv_heads, head_dim;
};

/// A sequence of `num_layers` layers with c's heads, head dim and dtypes, scale 1/sqrt(H).
inline SequenceConfig SequenceConfigFor(const Config &c, int32_t num_layers) {
  SequenceConfig sc;
  sc.num_layers = num_layers;
  sc.num_kv_heads = c.num_kv_heads;
  sc.head_dim = c.head_dim;
  sc.num_heads = c.num_heads;
  sc.dtype = c.dtype;
  sc.kv_dtype = c.kv_dtype;
  sc.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  return sc;
}

/// `n` values of `dtype` bits, normal(0, 1).
inline std::string Random(std::mt19937 &rng, kernels::DType dtype, int64_t n) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::string out(static_cast<size_t>(n * kernels::DTypeSize(dtype)), '\0');
  for (int64_t i = 0; i < n; ++i) kernels::StoreFromFloat(out.data(), dtype, i, nd(rng));
  return out;
}

/// One step's inputs, owned (the args point into the strings).
struct OwnedStep {
  ExtendArgs args;
  std::string q, k, v;
};

/// T tokens at `position` of `layer`: q (T, N, H), k and v (T, K, H) of c.dtype, random in
/// that order (sequence_id left for the caller).
inline void FillStep(OwnedStep *st, const Config &c, int32_t layer, int64_t position, int64_t T,
                     std::mt19937 &rng) {
  ExtendArgs &a = st->args;
  a.layer = layer;
  a.position = position;
  a.q_dtype = a.k_dtype = a.v_dtype = c.dtype;
  a.q_shape = {T, c.num_heads, c.head_dim};
  a.k_shape = a.v_shape = {T, c.num_kv_heads, c.head_dim};
  st->q = Random(rng, c.dtype, T * c.num_heads * c.head_dim);
  st->k = Random(rng, c.dtype, T * c.num_kv_heads * c.head_dim);
  st->v = Random(rng, c.dtype, T * c.num_kv_heads * c.head_dim);
  a.q = st->q.data();
  a.k = st->k.data();
  a.v = st->v.data();
  a.q_bytes = st->q.size();
  a.k_bytes = st->k.size();
  a.v_bytes = st->v.size();
}

}  // namespace attn::paged_test
