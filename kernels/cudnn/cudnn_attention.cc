// CudnnAttention: graph cache, plans and runs of the cudnn family (cudnn_attention.h).
#include "attn/kernels/cudnn_attention.h"

#include <cudnn_version.h>

#include <chrono>
#include <cstring>
#include <unordered_map>

#include "attn/kernels/cudnn_version.h"
#include "attn/kernels/fp8_prepass.h"
#include "attn/kernels/fp8_quantize.h"
#include "cudnn_internal.h"

namespace attn::kernels {

using cudnn_detail::CudnnGraph;

struct CudnnAttention::Entry {
  Status status;                       // why the spec cannot be served (not ok: no graph)
  std::shared_ptr<CudnnGraph> graph;   // validated; built when `built`
  bool built = false;
  bool tuned = false;                  // autotune ran (or failed) for it; under run_mu_
};

namespace {

constexpr uint64_t kAlign = 256;
uint64_t Up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// Workspace layout of one run (offsets from the workspace base).
struct Layout_ {
  uint64_t cudnn = 0, seq_q = 0, seq_kv = 0, ragged_q = 0, ragged_kv = 0, stats = 0;
  uint64_t q8 = 0, k8 = 0, v8 = 0, o8 = 0, scalars = 0, prepass = 0, flags = 0, total = 0;
};

// FP8 scalars (floats) in the workspace: the pre-pass's nine (fp8_prepass.h's Fp8Scalar
// order), then the graph's own.
enum Scalar : int {
  kScaleQ, kDescaleQ, kAmaxQ, kScaleK, kDescaleK, kAmaxK, kScaleV, kDescaleV, kAmaxV,
  kScaleS, kDescaleS, kAmaxS, kAmaxO, kScaleO, kNumScalars
};
static_assert(int{kScaleQ} == int{kFp8ScaleQ} && int{kAmaxV} == int{kFp8AmaxV} &&
                  int{kScaleS} == int{kFp8NumScalars},
              "the pre-pass writes the first nine scalars");

Layout_ MakeLayout(const CudnnPlan& p) {
  Layout_ l;
  uint64_t at = 0;
  auto place = [&](uint64_t bytes) {
    const uint64_t r = at;
    at += Up(bytes);
    return r;
  };
  l.cudnn = place(p.cudnn_workspace_bytes);
  const CudnnGraphSpec& s = p.spec;
  const bool ragged = s.ragged || s.padding || s.kind == CudnnGraphKind::kPaged;
  if (ragged) {
    l.seq_q = place(4 * s.batch);
    l.seq_kv = place(4 * s.batch);
    l.ragged_q = place(4 * (s.batch + 1));
    l.ragged_kv = place(4 * (s.batch + 1));
  }
  // Dense fp16/bf16 graphs write stats straight into lse; everything else goes through the
  // workspace.
  const bool stats_ws = s.stats && (ragged || s.kind == CudnnGraphKind::kFp8);
  if (stats_ws) l.stats = place(4 * s.batch * s.num_heads * s.q_len);
  if (s.kind == CudnnGraphKind::kFp8) {
    const uint64_t q = p.shape.q_elements(), kv = p.shape.kv_elements();
    const bool e4m3_in = p.shape.dtype == DType::kFloat8E4M3;
    if (!e4m3_in) {
      l.q8 = place(q);
      l.k8 = place(kv);
      l.v8 = place(kv);
      l.prepass = place(static_cast<uint64_t>(Fp8PrepassWorkspaceBytes(p.shape)));
    }
    l.o8 = place(q);  // unused when E4M3 inputs ask for E4M3 o (written in place)
    l.scalars = place(4 * kNumScalars);
  }
  // fp16/bf16 graph: per-(batch entry, kv head) non-finite-V flags (cudnn_masked_values.cu).
  if (s.kind == CudnnGraphKind::kSdpa) l.flags = place(4 * p.shape.batch * p.shape.num_kv_heads);
  l.total = at;
  return l;
}

std::string StatusText(const Status& s) { return s.message(); }

Status CudaOk(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal(std::string("cudnn: ") + what + ": " + cudaGetErrorName(e));
}

}  // namespace

std::string CudnnPlan::Describe() const {
  return "cudnn " + spec.Key() + " ws=" + std::to_string(workspace_bytes);
}

int64_t CudnnAttention::BuildVersion() { return CUDNN_VERSION; }

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(int device,
                                                                 const CudnnOptions& options) {
  // LoadCudnn keeps only a library that passes CheckCudnnVersion(BuildVersion(), ...).
  auto lib = cudnn_detail::LoadCudnn(options.library);
  if (!lib.ok()) return lib.status();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return Unavailable("cudnn: CUDA device " + std::to_string(device) + " not found");
  }
  std::unique_ptr<CudnnAttention> a(new CudnnAttention());
  a->device_ = device;
  a->sm_ = prop.major * 10 + prop.minor;
  a->runtime_version_ = lib->version;
  a->library_path_ = lib->path;
  a->library_step_ = lib->step;
  a->options_ = options;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  auto handle = cudnn_detail::CreateHandle();
  cudaSetDevice(prev);
  if (!handle.ok()) return handle.status();
  a->handle_ = *handle;
  return a;
}

CudnnAttention::~CudnnAttention() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.clear();
  }
  cudnn_detail::DestroyHandle(handle_);
}

StatusOr<std::shared_ptr<CudnnAttention::Entry>> CudnnAttention::Lookup(
    const CudnnGraphSpec& spec, bool build, bool warmup) const {
  const std::string key = spec.Key();
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) e = it->second;
  }
  if (!e) {
    e = std::make_shared<Entry>();
    auto g = cudnn_detail::MakeCudnnGraph(spec);
    if (g.ok()) {
      e->graph = *g;
    } else {
      e->status = g.status();
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = cache_.emplace(key, e);
    if (!inserted) {
      e = it->second;
    } else if (!e->status.ok()) {
      ++counters_.build_failures;
    }
  }
  if (!e->status.ok()) return e->status;
  if (!build) return e;
  // Build under the handle's lock (one build or run at a time on the handle).
  std::lock_guard<std::mutex> run_lock(run_mu_);
  bool need;
  {
    std::lock_guard<std::mutex> lock(mu_);
    need = !e->built && e->status.ok();
    if (!need && e->built) ++counters_.hits;
  }
  if (need) {
    const auto t0 = std::chrono::steady_clock::now();
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    Status s = e->graph->Build(handle_, options_.autotune);
    cudaSetDevice(prev);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    counters_.build_seconds += secs;
    ++counters_.builds;
    if (!warmup) ++counters_.request_path_builds;
    if (s.ok()) {
      e->built = true;
      ++counters_.graphs;
    } else {
      e->status = s;
      ++counters_.build_failures;
    }
  }
  if (!e->status.ok()) return e->status;
  return e;
}

StatusOr<CudnnPlan> CudnnAttention::PlanSpecs(const AttentionShape& shape, bool fp8,
                                              const std::vector<CudnnGraphSpec>& specs,
                                              bool build, bool warmup) const {
  std::string reasons;
  for (const CudnnGraphSpec& spec : specs) {
    auto e = Lookup(spec, build, warmup);
    if (!e.ok()) {
      reasons += (reasons.empty() ? "" : "; ") + std::string(spec.ragged ? "ragged" : "dense") +
                 " graph: " + StatusText(e.status());
      continue;
    }
    CudnnPlan p;
    p.shape = shape;
    p.spec = spec;
    p.fp8 = fp8;
    p.cudnn_workspace_bytes =
        build ? static_cast<uint64_t>((*e)->graph->workspace_bytes()) : 0;
    p.graph = *e;
    p.workspace_bytes = MakeLayout(p).total;
    return p;
  }
  return FailedPrecondition(reasons);
}

Status CudnnAttention::Supports(const AttentionShape& shape, bool fp8) const {
  ATTN_RETURN_IF_ERROR(CudnnShapeSupports(shape, sm_, fp8));
  auto p = PlanSpecs(shape, fp8, CudnnSpecCandidates(shape, sm_, fp8, options_.buckets),
                     /*build=*/false, /*warmup=*/false);
  return p.ok() ? Status::Ok() : p.status();
}

StatusOr<CudnnPlan> CudnnAttention::Plan(const AttentionShape& shape, bool fp8) {
  ATTN_RETURN_IF_ERROR(CudnnShapeSupports(shape, sm_, fp8));
  return PlanSpecs(shape, fp8, CudnnSpecCandidates(shape, sm_, fp8, options_.buckets),
                   /*build=*/true, /*warmup=*/false);
}

Status CudnnAttention::Warmup(const std::vector<AttentionShape>& shapes, bool fp8) {
  const auto t0 = std::chrono::steady_clock::now();
  Status first;
  for (const AttentionShape& s : shapes) {
    Status st = CudnnShapeSupports(s, sm_, fp8);
    if (st.ok()) {
      auto p = PlanSpecs(s, fp8, CudnnSpecCandidates(s, sm_, fp8, options_.buckets),
                         /*build=*/true, /*warmup=*/true);
      st = p.ok() ? Status::Ok() : p.status();
    }
    if (!st.ok() && first.ok()) first = st;
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_.warmup_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return first;
}

Status CudnnAttention::Run(const CudnnPlan& plan, const AttentionTensors& dev,
                           const CudnnFp8Inputs& fp8in, void* workspace,
                           uint64_t workspace_bytes, cudaStream_t stream) {
  const AttentionShape& s = plan.shape;
  const CudnnGraphSpec& spec = plan.spec;
  if (!plan.graph) return InvalidArgument("cudnn: empty plan");
  if (s.batch == 0 || s.q_rows() == 0 || s.num_heads == 0) return Status::Ok();
  if (dev.q == nullptr || dev.k == nullptr || dev.v == nullptr || dev.o == nullptr) {
    return InvalidArgument("cudnn: q, k, v and o must be device pointers");
  }
  if (s.return_lse && dev.lse == nullptr) return InvalidArgument("cudnn: lse missing");
  const Layout_ l = MakeLayout(plan);
  if (workspace_bytes < l.total || (l.total > 0 && workspace == nullptr)) {
    return InvalidArgument("cudnn: workspace of " + std::to_string(workspace_bytes) +
                           " bytes, need " + std::to_string(l.total));
  }
  char* ws = static_cast<char*>(workspace);
  const auto* entry = static_cast<const Entry*>(plan.graph.get());
  const bool fp8 = spec.kind == CudnnGraphKind::kFp8;
  const DType out_dtype = fp8 ? fp8in.out_dtype : s.dtype;
  float scale = s.scale;

  std::unordered_map<int64_t, void*> pack;
  pack[cudnn_detail::kUidScale] = &scale;
  pack[cudnn_detail::kUidQ] = const_cast<void*>(dev.q);
  pack[cudnn_detail::kUidK] = const_cast<void*>(dev.k);
  pack[cudnn_detail::kUidV] = const_cast<void*>(dev.v);
  pack[cudnn_detail::kUidO] = dev.o;
  const bool lengths = spec.ragged || spec.padding;
  if (lengths) {
    auto* seq_q = reinterpret_cast<int32_t*>(ws + l.seq_q);
    auto* seq_kv = reinterpret_cast<int32_t*>(ws + l.seq_kv);
    auto* rq = reinterpret_cast<int32_t*>(ws + l.ragged_q);
    auto* rkv = reinterpret_cast<int32_t*>(ws + l.ragged_kv);
    ATTN_RETURN_IF_ERROR(
        cudnn_detail::LaunchPrep(s, dev, spec.batch, seq_q, seq_kv, rq, rkv, stream));
    pack[cudnn_detail::kUidSeqQ] = seq_q;
    pack[cudnn_detail::kUidSeqKv] = seq_kv;
    if (spec.ragged) {
      pack[cudnn_detail::kUidRaggedQ] = rq;
      pack[cudnn_detail::kUidRaggedO] = rq;
      pack[cudnn_detail::kUidRaggedK] = rkv;
      pack[cudnn_detail::kUidRaggedV] = rkv;
    }
  }
  // Non-finite V at masked keys (DESIGN.md §4): flag the (entry, kv head) units whose V is not
  // finite before the graph, repair their rows after it (cudnn_masked_values.cu).
  const bool guard = spec.kind == CudnnGraphKind::kSdpa;
  auto* flags = reinterpret_cast<int32_t*>(ws + l.flags);
  if (guard) ATTN_RETURN_IF_ERROR(cudnn_detail::LaunchFlagNonFiniteV(s, dev, flags, stream));
  float* stats = nullptr;
  if (spec.stats) {
    stats = lengths || fp8 ? reinterpret_cast<float*>(ws + l.stats) : dev.lse;
    pack[cudnn_detail::kUidStats] = stats;
  }
  float* sc = nullptr;
  if (fp8) {
    sc = reinterpret_cast<float*>(ws + l.scalars);
    if (s.dtype == DType::kFloat8E4M3) {
      // Descales given; scale_o = 1 / descale_v (|O| <= amax_v <= 448 · descale_v).
      float host[kNumScalars] = {};
      host[kDescaleQ] = fp8in.q_descale;
      host[kDescaleK] = fp8in.k_descale;
      host[kDescaleV] = fp8in.v_descale;
      host[kScaleV] = 1.f / fp8in.v_descale;
      host[kScaleS] = kE4M3Max;
      host[kDescaleS] = 1.f / kE4M3Max;
      ATTN_RETURN_IF_ERROR(CudaOk(
          cudaMemcpyAsync(sc, host, sizeof(host), cudaMemcpyHostToDevice, stream), "scalars"));
    } else {
      const float host[2] = {kE4M3Max, 1.f / kE4M3Max};
      ATTN_RETURN_IF_ERROR(CudaOk(cudaMemcpyAsync(sc + kScaleS, host, sizeof(host),
                                                  cudaMemcpyHostToDevice, stream),
                                  "scalars"));
      ATTN_RETURN_IF_ERROR(Fp8Prepass(s, dev, ws + l.q8, ws + l.k8, ws + l.v8, sc, ws + l.prepass,
                                      Fp8PrepassWorkspaceBytes(s), stream));
      pack[cudnn_detail::kUidQ] = ws + l.q8;
      pack[cudnn_detail::kUidK] = ws + l.k8;
      pack[cudnn_detail::kUidV] = ws + l.v8;
    }
    // O in E4M3, scaled by scale_o = 1 / descale_v: straight into o when that is its dtype.
    pack[cudnn_detail::kUidO] = out_dtype == DType::kFloat8E4M3 ? dev.o : ws + l.o8;
    pack[cudnn_detail::kUidDescaleQ] = sc + kDescaleQ;
    pack[cudnn_detail::kUidDescaleK] = sc + kDescaleK;
    pack[cudnn_detail::kUidDescaleV] = sc + kDescaleV;
    pack[cudnn_detail::kUidDescaleS] = sc + kDescaleS;
    pack[cudnn_detail::kUidScaleS] = sc + kScaleS;
    pack[cudnn_detail::kUidScaleO] = sc + kScaleV;
    pack[cudnn_detail::kUidAmaxS] = sc + kAmaxS;
    pack[cudnn_detail::kUidAmaxO] = sc + kAmaxO;
  }
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    ATTN_RETURN_IF_ERROR(cudnn_detail::SetStream(handle_, stream));
    if (options_.autotune && !entry->tuned) {
      Entry* tuning = const_cast<Entry*>(entry);  // `tuned` is guarded by run_mu_
      tuning->tuned = true;
      const Status tuned = tuning->graph->Autotune(handle_, pack, ws + l.cudnn);
      std::lock_guard<std::mutex> lock_counters(mu_);
      ++(tuned.ok() ? counters_.autotuned : counters_.autotune_failures);
    }
    ATTN_RETURN_IF_ERROR(entry->graph->Execute(handle_, pack, ws + l.cudnn));
  }
  if (fp8 && out_dtype != DType::kFloat8E4M3) {
    // O (E4M3, scaled by scale_v) -> out dtype, times descale_v.
    ATTN_RETURN_IF_ERROR(
        Fp8Dequantize(ws + l.o8, s.q_elements(), sc + kDescaleV, out_dtype, dev.o, stream));
  }
  if (lengths) {
    ATTN_RETURN_IF_ERROR(cudnn_detail::LaunchFixup(s, dev, out_dtype, stats, spec.q_len, stream));
  } else if (fp8 && s.return_lse) {
    // Dense FP8: stats (B, N, T) in the workspace is already our padded lse layout.
    ATTN_RETURN_IF_ERROR(CudaOk(cudaMemcpyAsync(dev.lse, stats, 4 * s.lse_elements(),
                                                cudaMemcpyDeviceToDevice, stream),
                                "lse copy"));
  }
  if (fp8 && s.dtype != DType::kFloat8E4M3) {
    ATTN_RETURN_IF_ERROR(Fp8PrepassLseShift(s, dev, ws + l.prepass, stream));
  }
  if (guard) ATTN_RETURN_IF_ERROR(cudnn_detail::LaunchRepairFlaggedRows(s, dev, flags, stream));
  return Status::Ok();
}

std::string CudnnAttention::EngineName(const CudnnPlan& plan) const {
  const auto* entry = static_cast<const Entry*>(plan.graph.get());
  if (entry == nullptr || !entry->built) return "";
  std::lock_guard<std::mutex> lock(run_mu_);
  return entry->graph->plan_name();
}

int64_t CudnnAttention::EngineCount(const CudnnPlan& plan) const {
  const auto* entry = static_cast<const Entry*>(plan.graph.get());
  if (entry == nullptr || !entry->built) return 0;
  std::lock_guard<std::mutex> lock(run_mu_);
  return entry->graph->plan_count();
}

StatusOr<CudnnPlan> CudnnAttention::PlanPaged(DType dtype, int64_t batch, int64_t max_q_len,
                                              int64_t max_kv_len, int64_t num_heads,
                                              const PagedKvPool& pool,
                                              int64_t block_table_stride, bool return_lse) {
  AttentionShape shape;
  shape.layout = Layout::kVarlen;
  shape.dtype = dtype;
  shape.batch = batch;
  shape.max_q_len = max_q_len;
  shape.max_kv_len = max_kv_len;
  shape.num_heads = num_heads;
  shape.num_kv_heads = pool.num_kv_heads;
  shape.head_dim = pool.head_dim;
  shape.mask.causal = CausalAlignment::kBottomRight;
  shape.scale = 1.f;  // runtime value; only checked for validity here
  shape.has_lengths = true;
  shape.return_lse = return_lse;
  if (pool.kv_dtype != dtype) {
    return FailedPrecondition(std::string("cudnn paged: pages of ") + DTypeName(pool.kv_dtype) +
                              " with queries of " + DTypeName(dtype) +
                              "; the page dtype must equal the query dtype");
  }
  if (block_table_stride * pool.page_tokens < max_kv_len) {
    return InvalidArgument("cudnn paged: block_table_stride × page_tokens < max_kv_len");
  }
  ATTN_RETURN_IF_ERROR(CudnnShapeSupports(shape, sm_, /*fp8=*/false));
  CudnnGraphSpec spec;
  spec.kind = CudnnGraphKind::kPaged;
  spec.dtype = dtype;
  spec.ragged = true;
  spec.batch = BucketPow2(batch, options_.buckets.min_batch);
  spec.q_len = BucketPow2(max_q_len, 1);
  spec.kv_len = block_table_stride * pool.page_tokens;
  spec.num_heads = num_heads;
  spec.num_kv_heads = pool.num_kv_heads;
  spec.head_dim = pool.head_dim;
  spec.mask.causal = CausalAlignment::kBottomRight;
  spec.stats = return_lse;
  spec.page_tokens = pool.page_tokens;
  spec.num_pages = pool.num_pages;
  spec.max_pages_per_seq = block_table_stride;
  spec.sm = sm_;
  return PlanSpecs(shape, false, {spec}, /*build=*/true, /*warmup=*/false);
}

Status CudnnAttention::RunPaged(const CudnnPlan& plan, const PagedKvPool& pool,
                                const PagedBatch& batch, const void* q,
                                const int64_t* q_offsets, int64_t total_q, void* o, float* lse,
                                float scale, void* workspace, uint64_t workspace_bytes,
                                cudaStream_t stream) {
  const CudnnGraphSpec& spec = plan.spec;
  if (spec.kind != CudnnGraphKind::kPaged) return InvalidArgument("cudnn: not a paged plan");
  if (batch.batch != plan.shape.batch || batch.block_table_stride != spec.max_pages_per_seq ||
      pool.num_pages != spec.num_pages || pool.page_tokens != spec.page_tokens) {
    return InvalidArgument("cudnn paged: batch or pool does not match the plan");
  }
  if (q == nullptr || o == nullptr || q_offsets == nullptr || batch.block_tables == nullptr ||
      batch.kv_lengths == nullptr || pool.k_pages == nullptr || pool.v_pages == nullptr) {
    return InvalidArgument("cudnn paged: missing pointers");
  }
  if (plan.shape.return_lse && lse == nullptr) return InvalidArgument("cudnn paged: lse missing");
  const Layout_ l = MakeLayout(plan);
  if (workspace_bytes < l.total) return InvalidArgument("cudnn paged: workspace too small");
  char* ws = static_cast<char*>(workspace);
  AttentionShape s = plan.shape;
  s.total_q = total_q;
  s.scale = scale;
  // Queries are ragged through q_offsets; keys come from pages (lengths only).
  AttentionTensors dev;
  dev.q = q;
  dev.o = o;
  dev.lse = lse;
  dev.q_offsets = q_offsets;
  dev.kv_lengths = batch.kv_lengths;
  auto* seq_q = reinterpret_cast<int32_t*>(ws + l.seq_q);
  auto* seq_kv = reinterpret_cast<int32_t*>(ws + l.seq_kv);
  auto* rq = reinterpret_cast<int32_t*>(ws + l.ragged_q);
  auto* rkv = reinterpret_cast<int32_t*>(ws + l.ragged_kv);
  ATTN_RETURN_IF_ERROR(
      cudnn_detail::LaunchPrep(s, dev, spec.batch, seq_q, seq_kv, rq, rkv, stream));
  float sc = scale;
  std::unordered_map<int64_t, void*> pack;
  pack[cudnn_detail::kUidScale] = &sc;
  pack[cudnn_detail::kUidQ] = const_cast<void*>(q);
  pack[cudnn_detail::kUidK] = pool.k_pages;
  pack[cudnn_detail::kUidV] = pool.v_pages;
  pack[cudnn_detail::kUidO] = o;
  pack[cudnn_detail::kUidSeqQ] = seq_q;
  pack[cudnn_detail::kUidSeqKv] = seq_kv;
  pack[cudnn_detail::kUidRaggedQ] = rq;
  pack[cudnn_detail::kUidRaggedO] = rq;
  pack[cudnn_detail::kUidPageTableK] = const_cast<int32_t*>(batch.block_tables);
  pack[cudnn_detail::kUidPageTableV] = const_cast<int32_t*>(batch.block_tables);
  float* stats = nullptr;
  if (spec.stats) {
    stats = reinterpret_cast<float*>(ws + l.stats);
    pack[cudnn_detail::kUidStats] = stats;
  }
  const auto* entry = static_cast<const Entry*>(plan.graph.get());
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    ATTN_RETURN_IF_ERROR(cudnn_detail::SetStream(handle_, stream));
    ATTN_RETURN_IF_ERROR(entry->graph->Execute(handle_, pack, ws + l.cudnn));
  }
  return cudnn_detail::LaunchFixup(s, dev, s.dtype, stats, spec.q_len, stream);
}

CudnnCounters CudnnAttention::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<std::string> CudnnAttention::CachedKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [k, e] : cache_) {
    if (e->built) keys.push_back(k);
  }
  return keys;
}

}  // namespace attn::kernels
