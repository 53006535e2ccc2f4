// cuDNN SDPA graphs through the cudnn-frontend v1 graph API (the only file that includes it).
//
// Tensor layouts handed to cuDNN (dims are always (batch, heads, seq, head_dim), strides follow
// our row-major (B, T, N, H) / (total, N, H) memory):
//   q, o:  dims (B, N, T, H)  strides (T·N·H, H, N·H, 1)  (ragged: + element offsets per entry)
//   k, v:  dims (B, K, S, H)  strides (S·K·H, H, K·H, 1)
//   paged k, v: the pool [pages, K, page_tokens, H], dims (pages, K, page_tokens, H)
//   stats: dims (B, N, T, 1) float32, dense (our lse layout for dense graphs; a workspace
//          buffer for ragged ones)
// Masks (attention_problem.h BandKeyRange → cuDNN's diagonal band): the alignment is cuDNN's
// diagonal alignment (our kNone has the bottom-right diagonal); window_right → right bound
// (keep j <= d(i) + right); window_left → left bound = window_left + 1 (cuDNN keeps
// j > d(i) - left); causal → right bound 0. The scale is a pass-by-value tensor, always set.
#include <dlfcn.h>

#include <cudnn_frontend.h>

#include <cstdlib>
#include <mutex>
#include <vector>
#include <stdexcept>

#include "cudnn_internal.h"

// The frontend's dynamic-loading mode resolves every cuDNN symbol through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace attn::kernels::cudnn_detail {
namespace {

namespace fe = cudnn_frontend;
using fe::graph::Tensor_attributes;

fe::DataType_t FeType(DType d) {
  switch (d) {
    case DType::kFloat16: return fe::DataType_t::HALF;
    case DType::kBFloat16: return fe::DataType_t::BFLOAT16;
    case DType::kFloat8E4M3: return fe::DataType_t::FP8_E4M3;
    case DType::kFloat32: return fe::DataType_t::FLOAT;
  }
  return fe::DataType_t::NOT_SET;
}

Status FromFe(fe::error_t e, const char* what) {
  if (e.is_good()) return Status::Ok();
  return FailedPrecondition(std::string("cuDNN ") + what + ": " + e.get_message());
}

class GraphImpl final : public CudnnGraph {
 public:
  explicit GraphImpl(const CudnnGraphSpec& spec) : spec_(spec) {}

  Status Define() {
    const CudnnGraphSpec& s = spec_;
    const bool fp8 = s.kind == CudnnGraphKind::kFp8;
    const bool paged = s.kind == CudnnGraphKind::kPaged;
    const bool padding = s.ragged || s.padding || paged;
    g_ = std::make_shared<fe::graph::Graph>();
    g_->set_io_data_type(FeType(s.dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    g_->set_sm_version(s.sm);
    const int64_t B = s.batch, T = s.q_len, S = s.kv_len, N = s.num_heads, K = s.num_kv_heads,
                  H = s.head_dim;
    auto tensor = [&](const char* name, int64_t uid, std::vector<int64_t> dim,
                      std::vector<int64_t> stride) {
      return g_->tensor(Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(
          stride));
    };
    auto index = [&](const char* name, int64_t uid, int64_t n) {
      return g_->tensor(Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({n, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
    };
    auto scalar = [&](const char* name, int64_t uid) {
      return g_->tensor(Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({1, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::FLOAT));
    };
    auto q = tensor("Q", kUidQ, {B, N, T, H}, {T * N * H, H, N * H, 1});
    std::shared_ptr<Tensor_attributes> k, v;
    if (paged) {
      const int64_t P = s.num_pages, pt = s.page_tokens;
      k = tensor("K_pages", kUidK, {P, K, pt, H}, {K * pt * H, pt * H, H, 1});
      v = tensor("V_pages", kUidV, {P, K, pt, H}, {K * pt * H, pt * H, H, 1});
    } else {
      k = tensor("K", kUidK, {B, K, S, H}, {S * K * H, H, K * H, 1});
      v = tensor("V", kUidV, {B, K, S, H}, {S * K * H, H, K * H, 1});
    }
    std::shared_ptr<Tensor_attributes> ragged_q;
    if (s.ragged) {
      ragged_q = index("ragged_q", kUidRaggedQ, B + 1);
      q->set_ragged_offset(ragged_q);
      if (!paged) {
        k->set_ragged_offset(index("ragged_k", kUidRaggedK, B + 1));
        v->set_ragged_offset(index("ragged_v", kUidRaggedV, B + 1));
      }
    }
    auto scale = g_->tensor(Tensor_attributes()
                                .set_name("attn_scale")
                                .set_uid(kUidScale)
                                .set_dim({1, 1, 1, 1})
                                .set_stride({1, 1, 1, 1})
                                .set_is_pass_by_value(true)
                                .set_data_type(fe::DataType_t::FLOAT));

    // Masks.
    auto apply_mask = [&](auto& attrs) {
      const MaskSpec& m = s.mask;
      const bool top_left = m.causal == CausalAlignment::kTopLeft;
      const bool any = m.causal != CausalAlignment::kNone || m.window_left >= 0 ||
                       m.window_right >= 0;
      if (!any) return;
      attrs.set_diagonal_alignment(top_left ? fe::DiagonalAlignment_t::TOP_LEFT
                                            : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
      if (m.causal != CausalAlignment::kNone) {
        attrs.set_diagonal_band_right_bound(0);
      } else if (m.window_right >= 0) {
        attrs.set_diagonal_band_right_bound(static_cast<int>(m.window_right));
      } else {
        // A left window alone: cuDNN wants a right bound too; T + S is past every key.
        attrs.set_diagonal_band_right_bound(static_cast<int>(T + S));
      }
      if (m.window_left >= 0) {
        attrs.set_diagonal_band_left_bound(static_cast<int>(m.window_left + 1));
      }
    };

    std::shared_ptr<Tensor_attributes> o, stats;
    if (fp8) {
      fe::graph::SDPA_fp8_attributes a;
      a.set_name("sdpa_fp8").set_generate_stats(s.stats).set_attn_scale(scale);
      apply_mask(a);
      if (padding) {
        a.set_padding_mask(true)
            .set_seq_len_q(index("seq_q", kUidSeqQ, B))
            .set_seq_len_kv(index("seq_kv", kUidSeqKv, B));
      }
      auto out = g_->sdpa_fp8(q, k, v, scalar("descale_q", kUidDescaleQ),
                              scalar("descale_k", kUidDescaleK), scalar("descale_v", kUidDescaleV),
                              scalar("descale_s", kUidDescaleS), scalar("scale_s", kUidScaleS),
                              scalar("scale_o", kUidScaleO), a);
      o = out[0];
      stats = out[1];
      out[2]->set_output(true).set_uid(kUidAmaxS).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1})
          .set_data_type(fe::DataType_t::FLOAT);
      out[3]->set_output(true).set_uid(kUidAmaxO).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1})
          .set_data_type(fe::DataType_t::FLOAT);
      o->set_data_type(fe::DataType_t::FP8_E4M3);
    } else {
      fe::graph::SDPA_attributes a;
      a.set_name("sdpa").set_generate_stats(s.stats).set_attn_scale(scale);
      apply_mask(a);
      if (padding) {
        a.set_padding_mask(true)
            .set_seq_len_q(index("seq_q", kUidSeqQ, B))
            .set_seq_len_kv(index("seq_kv", kUidSeqKv, B));
      }
      if (paged) {
        const int64_t W = s.max_pages_per_seq;
        auto table = [&](const char* name, int64_t uid) {
        return g_->tensor(Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({B, 1, W, 1})
                              .set_stride({W, W, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
      };
      a.set_paged_attention_k_table(table("page_table_k", kUidPageTableK))
          .set_paged_attention_v_table(table("page_table_v", kUidPageTableV))
            .set_paged_attention_max_seq_len_kv(static_cast<int>(S));
      }
      auto out = g_->sdpa(q, k, v, a);
      o = out[0];
      stats = out[1];
    }
    o->set_output(true).set_uid(kUidO).set_dim({B, N, T, H}).set_stride({T * N * H, H, N * H, 1});
    if (s.ragged) o->set_ragged_offset(index("ragged_o", kUidRaggedO, B + 1));
    if (s.stats) {
      stats->set_output(true)
          .set_uid(kUidStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({B, N, T, 1})
          .set_stride({N * T, T, 1, 1});
    }
    return FromFe(g_->validate(), "graph validation");
  }

  Status Build(Handle handle, bool all_plans) override {
    try {
      return BuildImpl(handle, all_plans);
    } catch (const std::exception& e) {
      return FailedPrecondition(std::string("cuDNN frontend: ") + e.what());
    }
  }

  Status BuildImpl(Handle handle, bool all_plans) {
    ATTN_RETURN_IF_ERROR(FromFe(g_->build_operation_graph(handle), "build_operation_graph"));
    std::vector<fe::HeurMode_t> modes{fe::HeurMode_t::A};
    if (all_plans) modes.push_back(fe::HeurMode_t::FALLBACK);
    ATTN_RETURN_IF_ERROR(FromFe(g_->create_execution_plans(modes), "create_execution_plans"));
    ATTN_RETURN_IF_ERROR(FromFe(g_->check_support(handle), "check_support"));
    ATTN_RETURN_IF_ERROR(FromFe(
        g_->build_plans(handle, all_plans ? fe::BuildPlanPolicy_t::ALL
                                          : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
        "build_plans"));
    if (all_plans) {
      workspace_ = g_->get_autotune_workspace_size();
    } else {
      int64_t ws = 0;
      ATTN_RETURN_IF_ERROR(FromFe(g_->get_workspace_size(ws), "get_workspace_size"));
      workspace_ = ws;
    }
    return Status::Ok();
  }

  int64_t workspace_bytes() const override { return workspace_; }

  Status Autotune(Handle handle, std::unordered_map<int64_t, void*>& pack,
                  void* workspace) override {
    try {
      fe::error_t e = g_->autotune(handle, pack, workspace);
      if (e.is_good()) return Status::Ok();
      return Internal("cuDNN autotune: " + e.get_message());
    } catch (const std::exception& ex) {
      return Internal(std::string("cuDNN autotune: ") + ex.what());
    }
  }

  int64_t plan_count() const override { return g_->get_execution_plan_count(); }
  std::string plan_name() const override {
    std::string name;
    try {
      if (!g_->get_plan_name(name).is_good()) name.clear();
    } catch (const std::exception&) {
      name.clear();
    }
    return name;
  }

  Status Execute(Handle handle, std::unordered_map<int64_t, void*>& pack,
                 void* workspace) const override {
    try {
      fe::error_t e = g_->execute(handle, pack, workspace);
      if (e.is_good()) return Status::Ok();
      return Internal("cuDNN execute: " + e.get_message());
    } catch (const std::exception& ex) {
      return Internal(std::string("cuDNN execute: ") + ex.what());
    }
  }

  std::shared_ptr<fe::graph::Graph> g_;
  CudnnGraphSpec spec_;
  int64_t workspace_ = 0;
};

}  // namespace

StatusOr<CudnnOpened> LoadCudnn(const std::string& library) {
  static std::mutex mu;
  static StatusOr<CudnnOpened> loaded = FailedPrecondition("cuDNN not loaded yet");
  static bool tried = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!tried) {
    tried = true;
#if defined(ATTN_CUDNN_FALLBACK_LIBRARY)
    const std::string build_library = ATTN_CUDNN_FALLBACK_LIBRARY;
#else
    const std::string build_library;
#endif
    // The search order and the version rule: cudnn_library.h, cudnn_version.cc.
    loaded = OpenCudnnLibrary(
        CudnnLibraryCandidates(DefaultCudnnSearchInputs(library, build_library)), CUDNN_VERSION);
    if (loaded.ok()) cudnn_frontend::cudnn_dlhandle = loaded->handle;
  }
  return loaded;
}

StatusOr<std::shared_ptr<CudnnGraph>> MakeCudnnGraph(const CudnnGraphSpec& spec) {
  if (cudnn_frontend::cudnn_dlhandle == nullptr) {
    return FailedPrecondition("cuDNN library not loaded");
  }
  try {
    auto g = std::make_shared<GraphImpl>(spec);
    ATTN_RETURN_IF_ERROR(g->Define());
    return std::shared_ptr<CudnnGraph>(g);
  } catch (const std::exception& e) {
    return FailedPrecondition(std::string("cuDNN frontend: ") + e.what());
  }
}

StatusOr<Handle> CreateHandle() {
  if (cudnn_frontend::cudnn_dlhandle == nullptr) {
    return FailedPrecondition("cuDNN library not loaded");
  }
  try {
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t st = fe::detail::create_handle(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
      return FailedPrecondition(std::string("cudnnCreate failed: ") +
                                fe::detail::get_error_string(st));
    }
    return h;
  } catch (const std::exception& e) {
    return FailedPrecondition(std::string("cudnnCreate: ") + e.what());
  }
}

void DestroyHandle(Handle handle) {
  if (handle == nullptr) return;
  try {
    fe::detail::destroy_handle(handle);
  } catch (const std::exception&) {
  }
}

Status SetStream(Handle handle, cudaStream_t stream) {
  try {
    const cudnnStatus_t st = fe::detail::set_stream(handle, stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      return Internal(std::string("cudnnSetStream failed: ") + fe::detail::get_error_string(st));
    }
    return Status::Ok();
  } catch (const std::exception& e) {
    return Internal(std::string("cudnnSetStream: ") + e.what());
  }
}

}  // namespace attn::kernels::cudnn_detail
