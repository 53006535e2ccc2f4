// Internals of the cudnn family shared by its .cc/.cu files (not a public header).
//
// Only cudnn_graph.cc includes the cudnn-frontend headers (they cost ~20 s of compile time per
// translation unit); everything else talks to a built graph through CudnnGraph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/cudnn_graph_key.h"
#include "attn/kernels/cudnn_library.h"
#include "attn/common/status.h"

struct cudnnContext;

namespace attn::kernels::cudnn_detail {

using Handle = cudnnContext*;  ///< cudnnHandle_t

/// Tensor uids of every graph (the variant pack is keyed by them).
enum Uid : int64_t {
  kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidScale,
  kUidSeqQ, kUidSeqKv, kUidRaggedQ, kUidRaggedK, kUidRaggedV, kUidRaggedO,
  kUidDescaleQ, kUidDescaleK, kUidDescaleV, kUidDescaleS, kUidScaleS, kUidScaleO,
  kUidAmaxS, kUidAmaxO, kUidPageTableK, kUidPageTableV,
};

/// Finds and loads libcudnn.so.9 once per process (cudnn_library.h: `library` is
/// --cudnn-library, empty for the default search) and keeps the first library whose version
/// passes CheckCudnnVersion against CUDNN_VERSION. Returns the handle, version, file and the
/// search step that found it; FAILED_PRECONDITION listing every attempt when none is usable
/// (the same answer on every later call). Thread-safe.
StatusOr<CudnnOpened> LoadCudnn(const std::string& library);

/// One cuDNN graph for a CudnnGraphSpec (opaque; defined in cudnn_graph.cc).
class CudnnGraph {
 public:
  virtual ~CudnnGraph() = default;
  /// Builds the operation graph, picks a plan by heuristics (mode A) and compiles it on the
  /// handle's device. `all_plans`: compiles every engine configuration heuristics modes A and
  /// FALLBACK list (for Autotune) instead of the first that builds. INTERNAL /
  /// FAILED_PRECONDITION with cuDNN's message on failure.
  virtual Status Build(Handle handle, bool all_plans) = 0;
  /// cuDNN workspace bytes of the built plan (with all_plans: the largest of them).
  virtual int64_t workspace_bytes() const = 0;
  /// cudnn-frontend's autotune: times every built plan on the handle's stream with `pack`
  /// (device-synchronising, ~100 runs per plan at most) and keeps the fastest for Execute.
  virtual Status Autotune(Handle handle, std::unordered_map<int64_t, void*>& pack,
                          void* workspace) = 0;
  /// Built plans, and the name (engine and knobs) of the one Execute runs.
  virtual int64_t plan_count() const = 0;
  virtual std::string plan_name() const = 0;
  /// Enqueues the graph on the handle's stream. `pack` maps uids to device pointers (the
  /// scale uid to a host float). No allocation on the device, no synchronisation.
  virtual Status Execute(Handle handle, std::unordered_map<int64_t, void*>& pack,
                         void* workspace) const = 0;
};

/// Creates and validates (frontend support checks for spec.sm; no device needed) the graph of
/// `spec`. FAILED_PRECONDITION with the frontend's reason when cuDNN cannot express it.
StatusOr<std::shared_ptr<CudnnGraph>> MakeCudnnGraph(const CudnnGraphSpec& spec);

/// cudnnCreate / cudnnDestroy / cudnnSetStream through the loaded library.
StatusOr<Handle> CreateHandle();
void DestroyHandle(Handle handle);
Status SetStream(Handle handle, cudaStream_t stream);

/// Device-side preparation of a ragged graph's runtime tensors (cudnn_prep.cu): per-entry
/// sequence lengths and element offsets of q/o and k/v rows for `graph_batch` entries (entries
/// past shape.batch get length 0 and start at the end of the tensor).
///   seq_q, seq_kv: (graph_batch) int32   ragged_q, ragged_kv: (graph_batch + 1) int32
Status LaunchPrep(const AttentionShape& shape, const AttentionTensors& dev, int64_t graph_batch,
                  int32_t* seq_q, int32_t* seq_kv, int32_t* ragged_q, int32_t* ragged_kv,
                  cudaStream_t stream);

/// After a ragged graph: rows that are padding (i >= T_b) or see no key get o = 0 and
/// lse = -inf; other rows' lse is read from the graph's stats (graph_batch, N, graph_q_len)
/// float32 into the layout of attention_problem.h. `stats` may be null when !return_lse.
Status LaunchFixup(const AttentionShape& shape, const AttentionTensors& dev, DType o_dtype,
                   const float* stats, int64_t graph_q_len, cudaStream_t stream);

/// Guard of the fp16/bf16 graph against non-finite V at masked keys (cudnn_masked_values.cu;
/// cuDNN's P·V multiplies masked zeros by V, and 0 · NaN = NaN). Shapes/layouts of
/// attention_problem.h; `shape` fp16/bf16, head dim % 8 == 0 and <= 256, varlen with q_offsets
/// and kv_offsets. INVALID_ARGUMENT otherwise; INTERNAL naming a failed launch.
///
/// Zeroes `flags` (B·K int32, device workspace) and sets flags[b·K + kh] = 1 when V of batch
/// entry b, kv head kh holds ±Inf or NaN at one of its first S_b keys. Reads V once.
Status LaunchFlagNonFiniteV(const AttentionShape& shape, const AttentionTensors& dev,
                            int32_t* flags, cudaStream_t stream);

/// After the graph (and LaunchFixup): recomputes in fp32 every query row (all T rows of the
/// padded layout, T_b of varlen) of each flagged unit's G query heads over the keys
/// BandKeyRange gives it, writing o (shape.dtype) and, if shape.return_lse, lse (float32,
/// (B, N, T) or (N, total_q)). Rows of unflagged units are not touched (their blocks exit
/// after reading one flag).
Status LaunchRepairFlaggedRows(const AttentionShape& shape, const AttentionTensors& dev,
                               const int32_t* flags, cudaStream_t stream);

}  // namespace attn::kernels::cudnn_detail
