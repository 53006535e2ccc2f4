// Runtime tensors for ragged cuDNN graphs, and the fix-up pass after them (cudnn_internal.h).
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "cudnn_internal.h"

namespace attn::kernels::cudnn_detail {
namespace {

__device__ __forceinline__ int64_t Clamp(int32_t v, int64_t hi) {
  const int64_t x = v < 0 ? 0 : static_cast<int64_t>(v);
  return x < hi ? x : hi;
}

struct PrepArgs {
  int64_t batch, graph_batch, T, S, q_row, kv_row, q_rows, kv_rows;
  bool varlen;
  const int32_t* q_lengths;
  const int32_t* kv_lengths;
  const int64_t* q_offsets;
  const int64_t* kv_offsets;
  int32_t *seq_q, *seq_kv, *ragged_q, *ragged_kv;
};

__global__ void PrepKernel(PrepArgs a) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b > a.graph_batch) return;
  int64_t q_start = a.q_rows, kv_start = a.kv_rows, tq = 0, tk = 0;
  if (b < a.batch) {
    if (a.varlen) {
      q_start = a.q_offsets[b];
      tq = a.q_offsets[b + 1] - q_start;
      if (a.kv_offsets != nullptr) {
        kv_start = a.kv_offsets[b];
        tk = a.kv_offsets[b + 1] - kv_start;
      } else {  // paged K/V: lengths only
        kv_start = 0;
        tk = a.kv_lengths[b];
      }
    } else {
      q_start = b * a.T;
      kv_start = b * a.S;
      tq = a.q_lengths ? Clamp(a.q_lengths[b], a.T) : a.T;
      tk = a.kv_lengths ? Clamp(a.kv_lengths[b], a.S) : a.S;
    }
  }
  a.ragged_q[b] = static_cast<int32_t>(q_start * a.q_row);
  a.ragged_kv[b] = static_cast<int32_t>(kv_start * a.kv_row);
  if (b < a.graph_batch) {
    a.seq_q[b] = static_cast<int32_t>(tq);
    a.seq_kv[b] = static_cast<int32_t>(tk);
  }
}

struct FixupArgs {
  AttentionShape shape;
  const int32_t* q_lengths;
  const int32_t* kv_lengths;
  const int64_t* q_offsets;
  const int64_t* kv_offsets;
  uint8_t* o;           // o_bytes-byte elements (fp16/bf16: 2, E4M3: 1)
  int o_bytes;
  float* lse;
  const float* stats;   // (graph_batch, N, graph_q_len)
  int64_t graph_q_len;
};

// One block per query row of our layout; threads over heads (lse) and the row's N·H elements.
__global__ void FixupKernel(FixupArgs a) {
  const AttentionShape& s = a.shape;
  const int64_t r = blockIdx.x;
  int64_t b, i, tq, tk;
  if (s.layout == Layout::kVarlen) {
    int64_t lo = 0, hi = s.batch - 1;  // last b with q_offsets[b] <= r
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (a.q_offsets[mid] <= r) lo = mid; else hi = mid - 1;
    }
    // The last entry starting at or before r owns it (empty entries before it share offsets).
    b = lo;
    i = r - a.q_offsets[b];
    tq = a.q_offsets[b + 1] - a.q_offsets[b];
    tk = a.kv_offsets != nullptr ? a.kv_offsets[b + 1] - a.kv_offsets[b] : a.kv_lengths[b];
  } else {
    b = r / s.max_q_len;
    i = r % s.max_q_len;
    tq = a.q_lengths ? Clamp(a.q_lengths[b], s.max_q_len) : s.max_q_len;
    tk = a.kv_lengths ? Clamp(a.kv_lengths[b], s.max_kv_len) : s.max_kv_len;
  }
  const KeyRange range = BandKeyRange(s.mask, i, tq, tk);
  const bool empty = range.empty();
  const int64_t N = s.num_heads, H = s.head_dim;
  if (a.lse != nullptr) {
    for (int64_t h = threadIdx.x; h < N; h += blockDim.x) {
      const float v = empty ? -INFINITY : a.stats[(b * N + h) * a.graph_q_len + i];
      const int64_t at = s.layout == Layout::kVarlen ? h * s.total_q + r
                                                     : (b * N + h) * s.max_q_len + i;
      a.lse[at] = v;
    }
  }
  if (empty) {
    uint8_t* row = a.o + r * N * H * a.o_bytes;
    for (int64_t e = threadIdx.x; e < N * H * a.o_bytes; e += blockDim.x) row[e] = 0;
  }
}

}  // namespace

Status LaunchPrep(const AttentionShape& shape, const AttentionTensors& dev, int64_t graph_batch,
                  int32_t* seq_q, int32_t* seq_kv, int32_t* ragged_q, int32_t* ragged_kv,
                  cudaStream_t stream) {
  PrepArgs a{};
  a.batch = shape.batch;
  a.graph_batch = graph_batch;
  a.T = shape.max_q_len;
  a.S = shape.max_kv_len;
  a.q_row = shape.num_heads * shape.head_dim;
  a.kv_row = shape.num_kv_heads * shape.head_dim;
  a.q_rows = shape.q_rows();
  a.kv_rows = shape.kv_rows();
  a.varlen = shape.layout == Layout::kVarlen;
  a.q_lengths = shape.has_lengths ? dev.q_lengths : nullptr;
  a.kv_lengths = shape.has_lengths ? dev.kv_lengths : nullptr;
  a.q_offsets = dev.q_offsets;
  a.kv_offsets = dev.kv_offsets;
  a.seq_q = seq_q;
  a.seq_kv = seq_kv;
  a.ragged_q = ragged_q;
  a.ragged_kv = ragged_kv;
  if (a.varlen &&
      (a.q_offsets == nullptr || (a.kv_offsets == nullptr && dev.kv_lengths == nullptr))) {
    return InvalidArgument("cudnn: varlen needs q_offsets and kv_offsets (or kv_lengths)");
  }
  if (a.varlen) a.kv_lengths = dev.kv_lengths;
  const int threads = 128;
  const int blocks = static_cast<int>((graph_batch + 1 + threads - 1) / threads);
  PrepKernel<<<blocks, threads, 0, stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Internal(std::string("cudnn prep launch: ") + cudaGetErrorName(e));
  return Status::Ok();
}

Status LaunchFixup(const AttentionShape& shape, const AttentionTensors& dev, DType o_dtype,
                   const float* stats, int64_t graph_q_len, cudaStream_t stream) {
  if (DTypeSize(o_dtype) > 2) return InvalidArgument("cudnn fixup: o must be fp16, bf16 or E4M3");
  const int64_t rows = shape.q_rows();
  if (rows == 0 || shape.num_heads == 0) return Status::Ok();
  FixupArgs a{};
  a.shape = shape;
  a.q_lengths = shape.has_lengths ? dev.q_lengths : nullptr;
  a.kv_lengths = shape.has_lengths ? dev.kv_lengths : nullptr;
  a.q_offsets = dev.q_offsets;
  a.kv_offsets = dev.kv_offsets;
  if (shape.layout == Layout::kVarlen) {
    a.kv_lengths = dev.kv_lengths;
    if (a.q_offsets == nullptr || (a.kv_offsets == nullptr && a.kv_lengths == nullptr)) {
      return InvalidArgument("cudnn fixup: varlen needs offsets");
    }
  }
  a.o = static_cast<uint8_t*>(dev.o);
  a.o_bytes = DTypeSize(o_dtype);
  a.lse = shape.return_lse ? dev.lse : nullptr;
  a.stats = stats;
  a.graph_q_len = graph_q_len;
  if (a.lse != nullptr && stats == nullptr) return InvalidArgument("cudnn fixup: stats missing");
  if (rows > 0x7fffffff) return InvalidArgument("cudnn fixup: too many query rows");
  FixupKernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Internal(std::string("cudnn fixup launch: ") + cudaGetErrorName(e));
  return Status::Ok();
}

}  // namespace attn::kernels::cudnn_detail
