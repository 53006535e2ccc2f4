// The `cudnn` family (DESIGN.md §5): cuDNN's fused SDPA through the cudnn-frontend v1 graph API,
// for fp16/bf16 (CudnnGraphKind::kSdpa), FP8 E4M3 on Hopper (kFp8) and paged K/V (kPaged).
//
//   O = softmax(scale · Q Kᵀ + band mask) V     with the semantics of attention_problem.h
//
// Layouts are those of attention_problem.h (device pointers). How a problem maps onto cuDNN:
//   - padded and varlen problems both run on ragged graphs: per-entry element offsets of q/o
//     and k/v rows plus per-entry lengths (padding mask) are computed on the device from the
//     problem's lengths/offsets, so one bucketed graph (cudnn_graph_key.h) serves many shapes;
//     a padded problem without lengths whose B, T, S are powers of two (>= the bucket minimum)
//     and T <= S runs on a dense exact graph instead.
//   - after a ragged graph a small pass writes o = 0 and lse = -inf for padding rows and rows
//     that see no key (cuDNN leaves them unwritten or undefined), and copies cuDNN's softmax
//     stats (natural-log LSE of the scaled, masked logits) into our lse layout.
//   - the mask is set explicitly (alignment, window; see cudnn_graph.cc), and the softmax scale
//     is passed explicitly on every call (cuDNN's default is 1.0).
//   - FP8 (sm_90+): fp16/bf16 inputs are quantised per tensor on the device
//     (fp8_quantize.h: scale = 448 / amax), E4M3 inputs come with their descales; P is
//     quantised with scale 448; cuDNN on Hopper writes O as E4M3 with scale_o = scale_v (|O| <=
//     amax_v, so O never saturates) and the result is converted to out_dtype (fp16/bf16) with
//     descale_v. Amax of S and O are produced (cuDNN requires them) into the workspace.
// Graph cache: keyed by CudnnGraphSpec::Key(); a miss builds the graph (~0.1-0.5 s) and counts
// a build (a request-path build unless it happened inside Warmup). Failed validations are
// cached too, so Supports stays cheap.
// Runtime library: libcudnn.so.9 is loaded with dlopen (cudnn-frontend's dynamic loading), so
// the binary runs without cuDNN and this family reports why. Which file: the search of
// cudnn_library.h; its version must have the build's major and a minor >= the build's
// (NVIDIA's rule, cudnn_version.h).
// Thread-safety: all methods are thread-safe; Run serialises on the handle (one stream at a
// time per CudnnAttention).
// Built only when ATTN_CUDA is on and the cuDNN headers + frontend were found (ATTN_HAVE_CUDNN).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/cudnn_attention_supports.h"
#include "attn/kernels/cudnn_graph_key.h"
#include "attn/kernels/paged_kv.h"
#include "attn/common/status.h"

struct cudnnContext;

namespace attn::kernels {

/// Options for CudnnAttention::Create.
struct CudnnOptions {
  CudnnBucketOptions buckets;
  std::string library;  ///< --cudnn-library: the only file tried; empty: cudnn_library.h's search
  /// --cudnn-autotune: build every engine configuration heuristics modes A and FALLBACK offer
  /// and, at a graph's first Run, time them all (cudnn-frontend's autotune, on the run's own
  /// tensors: that Run synchronises the device and takes ~100 runs per configuration) and keep
  /// the fastest. Off: heuristics mode A's first configuration that builds.
  bool autotune = false;
};

/// Graph cache counters (monotonic since Create).
struct CudnnCounters {
  int64_t graphs = 0;               ///< graphs built and cached
  int64_t builds = 0;               ///< graph builds (warm-up and request path)
  int64_t request_path_builds = 0;  ///< builds triggered by Plan outside Warmup
  int64_t build_failures = 0;       ///< specs that failed validation or build
  int64_t hits = 0;                 ///< Plan calls served from the cache
  double build_seconds = 0;         ///< total time spent building
  double warmup_seconds = 0;        ///< time spent in Warmup (cold-start cost)
  int64_t autotuned = 0;            ///< graphs whose engine configuration autotune chose
  int64_t autotune_failures = 0;    ///< autotunes that failed (the heuristic choice stays)
};

/// Extra inputs of the FP8 path.
struct CudnnFp8Inputs {
  /// o's dtype: fp16 or bf16 (converted from cuDNN's E4M3 O), or kFloat8E4M3 (E4M3 inputs
  /// only: cuDNN's O as it is, real value = stored × v_descale).
  DType out_dtype = DType::kBFloat16;
  /// E4M3 inputs only (shape.dtype == kFloat8E4M3): real value = stored × descale (host).
  float q_descale = 1.f, k_descale = 1.f, v_descale = 1.f;
};

/// Host decisions for one problem: the cached graph and the workspace Run needs.
struct CudnnPlan {
  AttentionShape shape;
  CudnnGraphSpec spec;
  bool fp8 = false;
  uint64_t workspace_bytes = 0;        ///< total device workspace Run needs (256-byte aligned)
  uint64_t cudnn_workspace_bytes = 0;  ///< of which cuDNN's own
  std::shared_ptr<const void> graph;   ///< internal: the cached graph
  /// "cudnn sdpa bf16 ragged B1 T1024 ... ws=0" for reports.
  std::string Describe() const;
};

class CudnnAttention {
 public:
  /// Loads libcudnn (CudnnOptions::library), checks its version against the build's
  /// (cudnn_version.h), creates a handle on `device`. Errors: FAILED_PRECONDITION (library
  /// missing or older than the build; the message says which), UNAVAILABLE (no device).
  static StatusOr<std::unique_ptr<CudnnAttention>> Create(int device, const CudnnOptions& options);
  ~CudnnAttention();

  /// CUDNN_VERSION of the headers this was built with.
  static int64_t BuildVersion();
  int64_t runtime_version() const { return runtime_version_; }
  /// The libcudnn file loaded and the search step that found it (cudnn_library.h).
  const std::string& library_path() const { return library_path_; }
  const std::string& library_step() const { return library_step_; }
  int sm() const { return sm_; }

  /// Ok if the family can run `shape` (fp8: the FP8 path): CudnnShapeSupports, then the
  /// frontend's validation of the first graph spec that validates (cached per spec).
  Status Supports(const AttentionShape& shape, bool fp8) const;

  /// The plan for `shape`, building its graph on a cache miss (counted as a request-path
  /// build). Errors: those of Supports; FAILED_PRECONDITION when cuDNN cannot build any spec.
  StatusOr<CudnnPlan> Plan(const AttentionShape& shape, bool fp8);

  /// Builds the graphs of `shapes` ahead of traffic (builds counted, not as request-path).
  /// Returns the first error but tries every shape.
  Status Warmup(const std::vector<AttentionShape>& shapes, bool fp8);

  /// Enqueues `plan` on `stream`: device tensors in the layouts of attention_problem.h (for
  /// fp8 with fp16/bf16 inputs q/k/v are in shape.dtype, quantised by Fp8Prepass under
  /// shape.fp8's recipe (fp8_prepass.h: statistics over valid positions, K smoothing, Hadamard
  /// rotation; the lse shift of smoothing undone), and o in fp8.out_dtype; with E4M3 inputs
  /// q/k/v are E4M3 and the recipe does not apply); `workspace` >= plan.workspace_bytes
  /// (256-byte aligned), owned by the caller and not shared between concurrent runs. No
  /// allocation, no synchronisation (except the one autotuning Run of a graph, see
  /// CudnnOptions::autotune).
  /// Non-finite values at masked keys (DESIGN.md §4): cuDNN's kernel lets a NaN/±Inf in V at a
  /// causally or window-masked key reach rows that cannot see it (0 · NaN), so the fp16/bf16
  /// graph (not FP8, not RunPaged) runs between a flag kernel (one read of V's first S_b keys
  /// per entry; B·K int32 flags, one per (batch entry, kv head), in the workspace) and a repair
  /// kernel that recomputes in fp32 every query row of a flagged (entry, kv head) over its
  /// visible keys only, writing o and lse (rows that see a non-finite key: IEEE propagation).
  /// With finite V the extra cost is the read of V and a launch whose blocks exit at once.
  /// Errors: INVALID_ARGUMENT (missing pointers, workspace too small); INTERNAL naming the
  /// failing cuDNN / CUDA call.
  Status Run(const CudnnPlan& plan, const AttentionTensors& device_tensors,
             const CudnnFp8Inputs& fp8, void* workspace, uint64_t workspace_bytes,
             cudaStream_t stream);

  /// Paged K/V (DESIGN.md §7): queries packed (total_q, N, H) in `dtype` with (B+1) int64
  /// offsets, K/V from `pool` through `batch.block_tables` (block_table_stride entries per
  /// sequence; S_b = batch.kv_lengths[b]), bottom-right causal (query row i of sequence b sees
  /// key j iff j <= i + S_b - T_b), optional lse (N, total_q). `max_q_len` / `max_kv_len` bound
  /// T_b and S_b. The pool's dtype must equal `dtype` (no FP8 pages here). cuDNN reads whole
  /// pages: slots past S_b must hold finite values (NaN garbage leaks into o as 0 · NaN; seen
  /// on an H200), so a NaN-poisoned pool (--kv-debug-poison) cannot be read by this path.
  /// The graph is keyed by (dtype, B bucket, T bucket, N, K, H, page_tokens, num_pages,
  /// block_table_stride, lse).
  /// Returns the plan (building the graph on a miss); run it with RunPaged.
  StatusOr<CudnnPlan> PlanPaged(DType dtype, int64_t batch, int64_t max_q_len,
                                int64_t max_kv_len, int64_t num_heads, const PagedKvPool& pool,
                                int64_t block_table_stride, bool return_lse);
  /// Enqueues a paged plan. `q_offsets` (B+1) int64 device; `o` (total_q, N, H); lse optional.
  /// `scale` the softmax scale. Same workspace and error rules as Run.
  Status RunPaged(const CudnnPlan& plan, const PagedKvPool& pool, const PagedBatch& batch,
                  const void* q, const int64_t* q_offsets, int64_t total_q, void* o, float* lse,
                  float scale, void* workspace, uint64_t workspace_bytes, cudaStream_t stream);

  CudnnCounters counters() const;
  /// Keys of the cached graphs (for GetServerInfo / logs).
  std::vector<std::string> CachedKeys() const;
  /// The engine configuration `plan`'s graph runs (cuDNN's name, e.g. "eng4_k2=..."), and how
  /// many were built for it (1 without autotune). Empty / 0 for an unbuilt plan.
  std::string EngineName(const CudnnPlan& plan) const;
  int64_t EngineCount(const CudnnPlan& plan) const;

 private:
  struct Entry;
  CudnnAttention() = default;
  StatusOr<std::shared_ptr<Entry>> Lookup(const CudnnGraphSpec& spec, bool build,
                                          bool warmup) const;
  StatusOr<CudnnPlan> PlanSpecs(const AttentionShape& shape, bool fp8,
                                const std::vector<CudnnGraphSpec>& specs, bool build,
                                bool warmup) const;

  int device_ = 0;
  int sm_ = 0;
  int64_t runtime_version_ = 0;
  std::string library_path_;
  std::string library_step_;
  CudnnOptions options_;
  cudnnContext* handle_ = nullptr;
  mutable std::mutex mu_;      // cache and counters
  mutable std::mutex run_mu_;  // the handle (graph builds and runs)
  mutable std::map<std::string, std::shared_ptr<Entry>> cache_;
  mutable CudnnCounters counters_;
};

}  // namespace attn::kernels
