// The FP8 accuracy pre-pass on the GPU (attn/kernels/fp8_prepass.h; geometry and workspace:
// fp8_prepass_geometry.h; the row transform: fp8_prepass_device.cuh). Two passes over q, k and v,
// each one launch over blocks of (kFp8PrepassChunk tokens, head, entry) of all three tensors:
// statistics (amax, or K's per-chunk sums and extremes), then the quantisation; between them a
// small kernel forms K's mean and amax; and the LSE shift. Every reduction has a fixed order
// (no float atomics), so runs are deterministic and the host reference reproduces them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "fp8_kmean.h"
#include "fp8_prepass_geometry.h"
#include "fp8_prepass_kernels.cuh"

namespace attn::kernels {
namespace {

using fp8::kPrepassThreads;
using fp8::PrepassTensor;
using fp8::Transform;

Status CudaInternal(const char* what, cudaError_t e) {
  return Internal(std::string("fp8 pre-pass: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

bool Misaligned(const void* p, int a) { return reinterpret_cast<uintptr_t>(p) % a != 0; }

Status CheckShape(const AttentionShape& s) {
  if (s.dtype != DType::kFloat16 && s.dtype != DType::kBFloat16) {
    return InvalidArgument(std::string("fp8 pre-pass: input dtype ") + DTypeName(s.dtype) +
                           " (float16 or bfloat16 only)");
  }
  if (Fp8HadamardOrder(s.head_dim) == 0 || s.head_dim > 256) {
    return InvalidArgument("fp8 pre-pass: head_dim " + std::to_string(s.head_dim) +
                           " must be a multiple of 8 up to 256");
  }
  if (s.batch > 65535 || s.num_heads > 65535) {
    return InvalidArgument("fp8 pre-pass: batch and num_heads must be at most 65535");
  }
  return Status::Ok();
}

dim3 GridFor(const PrepassTensor& t) {
  return dim3(static_cast<unsigned>(fp8::Chunks(t.max_len)), static_cast<unsigned>(t.heads),
              static_cast<unsigned>(t.batch));
}

/// KFinalKernel's grid: (entries × kv heads, channel groups of 32); CheckShape bounds both
/// (B, K <= 65535: the product < 2^32; head_dim <= 256: at most 8 groups).
dim3 KFinalGrid(const AttentionShape& s) {
  return dim3(static_cast<unsigned>(s.batch * s.num_kv_heads),
              static_cast<unsigned>((s.head_dim + kKFinalChannels - 1) / kKFinalChannels));
}

/// Launches StatsKernel (stats; kstats: K's sums and extremes) or QuantizeKernel for the
/// tensors of `ps` with the pass count of the head dim.
template <bool kBf16>
void LaunchPass(bool stats, bool kstats, int64_t head_dim, const Parts& ps, cudaStream_t st) {
  int64_t total = 0;
  for (int i = 0; i < ps.count; ++i) total += ps.part[i].blocks;
  const auto blocks = static_cast<unsigned>(total);
  switch (PassesFor(head_dim)) {
#define ATTN_PREPASS_CASE(P)                                                       \
  case P:                                                                          \
    if (!stats) QuantizeKernel<kBf16, P><<<blocks, kPrepassThreads, 0, st>>>(ps);  \
    else if (kstats) StatsKernel<kBf16, P, true><<<blocks, kPrepassThreads, 0, st>>>(ps); \
    else StatsKernel<kBf16, P, false><<<blocks, kPrepassThreads, 0, st>>>(ps);     \
    break;
    ATTN_PREPASS_CASE(1)
    ATTN_PREPASS_CASE(2)
    ATTN_PREPASS_CASE(4)
    ATTN_PREPASS_CASE(8)
#undef ATTN_PREPASS_CASE
    default:
      break;  // CheckShape admits head dims 8..256 only: 1, 2, 4 or 8 passes
  }
}

/// Pass 1 (amax of q and v, K's statistics or amax), K's final step, pass 2 (quantise all).
template <bool kBf16>
Status PrepassTyped(const AttentionShape& s, const AttentionTensors& dev, uint8_t* q8, uint8_t* k8,
                    uint8_t* v8, float* sc, char* ws, cudaStream_t stream) {
  const fp8::PrepassWorkspace w = fp8::PrepassWorkspaceLayout(s);
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  const float norm = order ? fp8::HadamardNorm(order) : 1.f;
  Transform q{static_cast<const uint16_t*>(dev.q), fp8::QTensor(s, dev), nullptr, order, norm};
  Transform k{static_cast<const uint16_t*>(dev.k), fp8::KvTensor(s, dev), nullptr, order, norm};
  Transform v{static_cast<const uint16_t*>(dev.v), fp8::KvTensor(s, dev), nullptr, 0, 1.f};
  cudaError_t e = cudaMemsetAsync(sc, 0, sizeof(float) * kFp8NumScalars, stream);
  if (e != cudaSuccess) return CudaInternal("cudaMemsetAsync", e);
  const bool any_q = s.batch > 0 && s.max_q_len > 0, any_kv = s.batch > 0 && s.max_kv_len > 0;
  const bool smooth = any_kv && s.fp8.smooth_k;
  auto blocks = [](const Transform& t) { return fp8::Chunks(t.t.max_len) * t.t.heads * t.t.batch; };
  auto one = [](const Part& p) {
    Parts ps;
    ps.part[ps.count++] = p;
    return ps;
  };
  if (blocks(q) > 0x7fffffff || blocks(k) > 0x7fffffff) {
    return InvalidArgument("fp8 pre-pass: more than 2^31 - 1 blocks");
  }
  // Per tensor: statistics, then the quantisation right away (much of the tensor still in L2).
  if (any_q) {
    const Parts pq = one(Part{q, blocks(q), q8, sc + kFp8ScaleQ, false});
    LaunchPass<kBf16>(true, false, s.head_dim, pq, stream);
    LaunchPass<kBf16>(false, false, s.head_dim, pq, stream);
  }
  if (any_kv) {
    Parts pk = one(Part{k, blocks(k), k8, sc + kFp8ScaleK, smooth});
    if (smooth) {
      pk.sum = reinterpret_cast<float*>(ws + w.partial_offset);
      pk.max = reinterpret_cast<float*>(ws + w.max_offset);
      pk.min = reinterpret_cast<float*>(ws + w.min_offset);
    }
    LaunchPass<kBf16>(true, smooth, s.head_dim, pk, stream);
    if (smooth) {
      auto* mean = reinterpret_cast<float*>(ws + w.mean_offset);
      KFinalKernel<<<KFinalGrid(s), kPrepassThreads, 0, stream>>>(
          k.t, pk.sum, pk.max, pk.min, mean, reinterpret_cast<unsigned int*>(sc + kFp8AmaxK));
      pk.part[0].tr.mean = mean;
    }
    LaunchPass<kBf16>(false, false, s.head_dim, pk, stream);
    const Parts pv = one(Part{v, blocks(v), v8, sc + kFp8ScaleV, false});
    LaunchPass<kBf16>(true, false, s.head_dim, pv, stream);
    LaunchPass<kBf16>(false, false, s.head_dim, pv, stream);
  }
  if (!any_q || !any_kv) {  // scale = descale = 1 for the tensors without rows
    const float ones[kFp8NumScalars] = {1.f, 1.f, 0.f, 1.f, 1.f, 0.f, 1.f, 1.f, 0.f};
    const int first = any_q ? kFp8ScaleK : 0, count = any_q ? 6 : (any_kv ? 3 : 9);
    e = cudaMemcpyAsync(sc + first, ones + first, sizeof(float) * count, cudaMemcpyHostToDevice,
                        stream);
    if (e != cudaSuccess) return CudaInternal("cudaMemcpyAsync", e);
  }
  e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace

int Fp8HadamardOrder(int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0) return 0;
  int64_t n = head_dim & -head_dim;  // largest power of two dividing head_dim
  return static_cast<int>(n > head_dim ? head_dim : n);
}

std::string Fp8RecipeName(const Fp8Options& o) {
  std::string name = "e4m3 per-tensor";
  if (o.rotate) name += ", hadamard q/k";
  if (o.smooth_k) name += ", k-smoothing";
  return name;
}

int64_t Fp8PrepassWorkspaceBytes(const AttentionShape& s) {
  return fp8::PrepassWorkspaceLayout(s).bytes;
}

Status Fp8Prepass(const AttentionShape& s, const AttentionTensors& dev, void* q8, void* k8,
                  void* v8, float* scalars, void* workspace, int64_t workspace_bytes,
                  cudaStream_t stream) {
  ATTN_RETURN_IF_ERROR(CheckShape(s));
  if (scalars == nullptr) return InvalidArgument("fp8 pre-pass: scalars must be non-null");
  if (s.q_rows() > 0 && s.kv_rows() > 0 &&
      (dev.q == nullptr || dev.k == nullptr || dev.v == nullptr || q8 == nullptr || k8 == nullptr ||
       v8 == nullptr)) {
    return InvalidArgument("fp8 pre-pass: q, k, v and their E4M3 outputs must be non-null");
  }
  if (Misaligned(dev.q, 16) || Misaligned(dev.k, 16) || Misaligned(dev.v, 16) ||
      Misaligned(q8, 8) || Misaligned(k8, 8) || Misaligned(v8, 8) || Misaligned(workspace, 16)) {
    return InvalidArgument(
        "fp8 pre-pass: inputs and workspace must be 16-byte aligned, the "
        "E4M3 outputs 8-byte aligned");
  }
  if (s.layout == Layout::kVarlen && (dev.q_offsets == nullptr || dev.kv_offsets == nullptr)) {
    return InvalidArgument("fp8 pre-pass: varlen needs q_offsets and kv_offsets");
  }
  const int64_t need = Fp8PrepassWorkspaceBytes(s);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr)) {
    return InvalidArgument("fp8 pre-pass: workspace of " + std::to_string(workspace_bytes) +
                           " bytes, need " + std::to_string(need));
  }
  auto* ws = static_cast<char*>(workspace);
  auto* q = static_cast<uint8_t*>(q8);
  auto* k = static_cast<uint8_t*>(k8);
  auto* v = static_cast<uint8_t*>(v8);
  return s.dtype == DType::kBFloat16 ? PrepassTyped<true>(s, dev, q, k, v, scalars, ws, stream)
                                     : PrepassTyped<false>(s, dev, q, k, v, scalars, ws, stream);
}

namespace fp8 {

Status EnqueueKMean(const AttentionShape& s, const AttentionTensors& dev, void* workspace,
                    cudaStream_t stream) {
  if (!s.fp8.smooth_k) return Status::Ok();
  ATTN_RETURN_IF_ERROR(CheckShape(s));
  if (s.batch == 0 || s.max_kv_len == 0 || s.num_kv_heads == 0) return Status::Ok();
  if (dev.k == nullptr || workspace == nullptr || Misaligned(dev.k, 16) ||
      Misaligned(workspace, 16)) {
    return InvalidArgument("fp8 K mean: k and the workspace must be non-null and 16-byte aligned");
  }
  if (s.layout == Layout::kVarlen && dev.kv_offsets == nullptr) {
    return InvalidArgument("fp8 K mean: varlen needs kv_offsets");
  }
  const PrepassWorkspace w = PrepassWorkspaceLayout(s);
  char* ws = static_cast<char*>(workspace);
  const int order = s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0;
  Transform k{static_cast<const uint16_t*>(dev.k), KvTensor(s, dev), nullptr, order,
              order ? HadamardNorm(order) : 1.f};
  Parts ps;
  ps.sum = reinterpret_cast<float*>(ws + w.partial_offset);
  ps.max = reinterpret_cast<float*>(ws + w.max_offset);
  ps.min = reinterpret_cast<float*>(ws + w.min_offset);
  ps.part[ps.count++] = Part{k, Chunks(k.t.max_len) * k.t.heads * k.t.batch, nullptr, nullptr, true};
  if (ps.part[0].blocks > 0x7fffffff) return InvalidArgument("fp8 K mean: too many blocks");
  if (s.dtype == DType::kBFloat16) {
    LaunchPass<true>(true, true, s.head_dim, ps, stream);
  } else {
    LaunchPass<false>(true, true, s.head_dim, ps, stream);
  }
  KFinalKernel<<<KFinalGrid(s), kPrepassThreads, 0, stream>>>(k.t, ps.sum, ps.max, ps.min,
                                               reinterpret_cast<float*>(ws + w.mean_offset),
                                               nullptr);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace fp8

Status Fp8PrepassLseShift(const AttentionShape& s, const AttentionTensors& dev,
                          const void* workspace, cudaStream_t stream) {
  if (!s.fp8.smooth_k || !s.return_lse || s.batch == 0 || s.max_q_len == 0) return Status::Ok();
  ATTN_RETURN_IF_ERROR(CheckShape(s));
  if (dev.q == nullptr || dev.lse == nullptr || workspace == nullptr || Misaligned(dev.q, 16)) {
    return InvalidArgument(
        "fp8 pre-pass: the lse shift needs q (16-byte aligned), lse and the "
        "pre-pass workspace");
  }
  const fp8::PrepassWorkspace w = fp8::PrepassWorkspaceLayout(s);
  Transform q{static_cast<const uint16_t*>(dev.q), fp8::QTensor(s, dev),
              reinterpret_cast<const float*>(static_cast<const char*>(workspace) + w.mean_offset),
              s.fp8.rotate ? Fp8HadamardOrder(s.head_dim) : 0,
              s.fp8.rotate ? fp8::HadamardNorm(Fp8HadamardOrder(s.head_dim)) : 1.f};
  const int64_t group = s.num_heads / s.num_kv_heads;
  if (s.dtype == DType::kBFloat16) {
    LseShiftKernel<true><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(q, group, s.num_kv_heads,
                                                                       s.total_q, s.scale, dev.lse);
  } else {
    LseShiftKernel<false><<<GridFor(q.t), kPrepassThreads, 0, stream>>>(
        q, group, s.num_kv_heads, s.total_q, s.scale, dev.lse);
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::Ok() : CudaInternal("launch", e);
}

}  // namespace attn::kernels
