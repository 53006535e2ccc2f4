#include "attn/kernels/cudnn_graph_key.h"

#include <sstream>

namespace attn::kernels {
namespace {

const char* ShortDType(DType d) {
  switch (d) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "e4m3";
  }
  return "?";
}

}  // namespace

const char* CudnnGraphKindName(CudnnGraphKind kind) {
  switch (kind) {
    case CudnnGraphKind::kSdpa: return "sdpa";
    case CudnnGraphKind::kFp8: return "fp8";
    case CudnnGraphKind::kPaged: return "paged";
  }
  return "?";
}

int64_t BucketPow2(int64_t x, int64_t minimum) {
  int64_t v = x > minimum ? x : minimum;
  if (v <= 1) return 1;
  if (v > (int64_t{1} << 62)) return v;
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

std::string CudnnGraphSpec::Key() const {
  std::ostringstream s;
  s << CudnnGraphKindName(kind) << ' ' << ShortDType(dtype) << ' '
    << (kind == CudnnGraphKind::kPaged ? "paged"
                                         : (ragged ? "ragged" : (padding ? "padded" : "dense")))
    << " B"
    << batch << " T" << q_len << " S" << kv_len << " N" << num_heads << " K" << num_kv_heads
    << " H" << head_dim << " causal=" << CausalAlignmentName(mask.causal)
    << " wl=" << mask.window_left << " wr=" << mask.window_right << (stats ? " stats" : "");
  if (kind == CudnnGraphKind::kPaged) {
    s << " pt" << page_tokens << " pages" << num_pages << " bt" << max_pages_per_seq;
  }
  s << " sm" << sm;
  return s.str();
}

std::vector<CudnnGraphSpec> CudnnSpecCandidates(const AttentionShape& shape, int sm, bool fp8,
                                                const CudnnBucketOptions& options) {
  CudnnGraphSpec base;
  base.kind = fp8 ? CudnnGraphKind::kFp8 : CudnnGraphKind::kSdpa;
  base.dtype = fp8 ? DType::kFloat8E4M3 : shape.dtype;
  base.num_heads = shape.num_heads;
  base.num_kv_heads = shape.num_kv_heads;
  base.head_dim = shape.head_dim;
  // Windows of T + S keys or more are unbounded (and would not fit cuDNN's int32 bounds).
  base.mask = NormalizeMask(shape.mask, shape.max_q_len, shape.max_kv_len);
  // Causal already bounds the right side at the diagonal; keep one spelling per mask.
  if (base.mask.causal != CausalAlignment::kNone) base.mask.window_right = -1;
  base.stats = shape.return_lse;
  base.sm = sm;

  if (fp8) {
    std::vector<CudnnGraphSpec> out;
    if (shape.layout != Layout::kPadded) return out;
    CudnnGraphSpec exact = base;
    // T == S without lengths: the bottom-right diagonal is the top-left one (Hopper's FP8
    // SDPA has only top-left).
    if (exact.mask.causal == CausalAlignment::kBottomRight && !shape.has_lengths &&
        shape.max_q_len == shape.max_kv_len) {
      exact.mask.causal = CausalAlignment::kTopLeft;
    }
    exact.ragged = false;
    exact.padding = shape.has_lengths || shape.max_q_len > shape.max_kv_len;
    exact.batch = shape.batch;
    exact.q_len = shape.max_q_len;
    exact.kv_len = shape.max_kv_len;
    out.push_back(exact);
    return out;
  }
  CudnnGraphSpec ragged = base;
  ragged.ragged = true;
  ragged.batch = BucketPow2(shape.batch, options.min_batch);
  ragged.q_len = BucketPow2(shape.max_q_len, options.min_len);
  ragged.kv_len = BucketPow2(shape.max_kv_len, options.min_len);

  std::vector<CudnnGraphSpec> out;
  const bool dense_ok = shape.layout == Layout::kPadded && !shape.has_lengths &&
                        shape.max_q_len <= shape.max_kv_len && shape.max_q_len > 0 &&
                        shape.max_kv_len > 0;
  CudnnGraphSpec dense = base;
  dense.ragged = false;
  dense.batch = shape.batch;
  dense.q_len = shape.max_q_len;
  dense.kv_len = shape.max_kv_len;
  const bool on_bucket = dense.batch == ragged.batch && dense.q_len == ragged.q_len &&
                         dense.kv_len == ragged.kv_len;
  if (dense_ok && on_bucket) out.push_back(dense);
  out.push_back(ragged);
  if (dense_ok && !on_bucket) out.push_back(dense);
  return out;
}

}  // namespace attn::kernels
