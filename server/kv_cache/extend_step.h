// One Extend step on one (sequence, layer) (DESIGN.md §3): check the request
// against the sequence, replay or append k/v at `position` (copy-on-write of a
// shared partial page, FP8 quantisation with defined scales), then attend q
// over the whole layer cache with bottom-right causal alignment. Errors (stored
// state unchanged on every error): NOT_FOUND (see SequenceStore::Acquire),
// INVALID_ARGUMENT (layer, dtypes, shapes, k/v lengths), FAILED_PRECONDITION
// (position is not the layer's length; the message gives the length),
// RESOURCE_EXHAUSTED (pages needed/free). Thread-safety: thread-safe; steps on
// one sequence are serialised by its lock.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/status.h"
#include "kv_cache/paged_attention_backend.h"
#include "kv_cache/sequence_store.h"

namespace attn {

/// A decoded Extend request; pointers alias the request's bytes.
struct ExtendArgs {
  std::string sequence_id;
  int32_t layer = 0;
  int64_t position = 0;
  kernels::DType q_dtype = kernels::DType::kFloat32, k_dtype = q_dtype, v_dtype = q_dtype;
  std::array<int64_t, 3> q_shape{}, k_shape{}, v_shape{};  ///< (T,N,H), (T,K,H), (T,K,H)
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  size_t q_bytes = 0, k_bytes = 0, v_bytes = 0;
};

struct ExtendOutcome {
  int64_t length = 0;  ///< layer length after the step
  bool replayed = false;
  int64_t kv_len = 0;     ///< keys attended
  int64_t kernel_us = 0;  ///< append + attend time
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  kernels::DType dtype = kernels::DType::kFloat32;
};

/// Runs the step for `owner`; on success `o` holds the (T, N, H) output bytes.
Status ExtendStep(SequenceStore *store, PagedAttentionBackend *backend, const std::string &owner,
                  const ExtendArgs &args, std::string *o, ExtendOutcome *outcome);

}  // namespace attn
