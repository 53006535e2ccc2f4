#include "backends/paged/extend_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "attn/kernels/host_dtype.h"
#include "attn/kernels/paged_kv_cpu.h"
#include "backends/paged/replay_digest.h"

namespace attn {
namespace {

using kernels::DType;

constexpr float kFp8Headroom = 2.f;  // scale = amax * headroom / 448 when derived

std::string Shape3(const std::array<int64_t, 3> &s) {
  return "[" + std::to_string(s[0]) + "," + std::to_string(s[1]) + "," + std::to_string(s[2]) + "]";
}

Status CheckArgs(const SequenceConfig &c, const ExtendArgs &a) {
  if (a.layer < 0 || a.layer >= c.num_layers) {
    return InvalidArgument("layer: expected [0, " + std::to_string(c.num_layers) + "), got " +
                           std::to_string(a.layer));
  }
  const char *names[3] = {"q", "k", "v"};
  const DType dts[3] = {a.q_dtype, a.k_dtype, a.v_dtype};
  for (int i = 0; i < 3; ++i) {
    if (dts[i] != c.dtype) {
      return InvalidArgument(std::string(names[i]) + ".dtype: expected the sequence's dtype " +
                             kernels::DTypeName(c.dtype) + ", got " + kernels::DTypeName(dts[i]));
    }
  }
  const std::array<int64_t, 3> q_want{a.q_shape[0], a.append_only ? 0 : c.num_heads, c.head_dim};
  if (a.q_shape[0] < 1 || a.q_shape != q_want) {
    return InvalidArgument("q.shape: expected (T >= 1, N = " + std::to_string(c.num_heads) +
                           ", H = " + std::to_string(c.head_dim) + "), got " + Shape3(a.q_shape));
  }
  const std::array<int64_t, 3> kv_want{a.q_shape[0], c.num_kv_heads, c.head_dim};
  if (a.k_shape != kv_want) {
    return InvalidArgument("k.shape: expected " + Shape3(kv_want) + " (q's T, K, H), got " +
                           Shape3(a.k_shape));
  }
  if (a.v_shape != kv_want) {
    return InvalidArgument("v.shape: expected " + Shape3(kv_want) + " (k's shape), got " +
                           Shape3(a.v_shape));
  }
  return Status::Ok();
}

/// Per-kv-head scales amax * headroom / 448 of x (T, K, H).
Status DeriveScales(const void *x, DType dtype, int64_t T, int64_t K, int64_t H, const char *name,
                    std::vector<float> *out) {
  out->assign(static_cast<size_t>(K), 0.f);
  for (int64_t h = 0; h < K; ++h) {
    float amax = 0.f;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < H; ++d) {
        const float v = std::fabs(kernels::LoadAsFloat(x, dtype, (t * K + h) * H + d));
        if (!std::isfinite(v)) {
          return InvalidArgument(std::string(name) +
                                 ": non-finite value; FP8 scales cannot be derived from it");
        }
        amax = v > amax ? v : amax;
      }
    }
    (*out)[static_cast<size_t>(h)] = amax > 0.f ? amax * kFp8Headroom / kernels::kFp8E4M3Max : 1.f;
  }
  return Status::Ok();
}

/// Whether a step with tensors in a CUDA IPC region (a.device) may run: the backend serves
/// device I/O, and its k/v are not needed on the host to derive FP8 scales (`derives_scales`).
/// OK for steps without device tensors. Errors: FAILED_PRECONDITION saying which.
Status CheckDeviceStep(const PagedAttentionBackend &backend, const ExtendArgs &a,
                       bool derives_scales) {
  if (!a.device.any()) return Status::Ok();
  if (!backend.ServesDeviceIo()) {
    return FailedPrecondition("this step names a CUDA IPC region, but the " + backend.name() +
                              " backend reads host memory only");
  }
  if (derives_scales && (a.device.k || a.device.v)) {
    return FailedPrecondition(
        "this FP8 sequence derives its scales from its first step's k/v on the host, and this "
        "step's k/v are in a CUDA IPC region: send the first step's k/v as bytes or through "
        "host shared memory, or give k_scales/v_scales at CreateSequence");
  }
  return Status::Ok();
}

}  // namespace

Status PrepareExtend(SequenceStore *store, PagedAttentionBackend *backend, const std::string &owner,
                     const ExtendArgs &a, std::string *o, ExtendOutcome *out, PreparedExtend *step,
                     const StillWanted &still_wanted) {
  auto locked = store->Acquire(a.sequence_id, owner);
  if (!locked.ok()) return locked.status();
  // Acquire may have waited for a step of another batch on this sequence: a step cancelled or
  // past its deadline meanwhile must not be applied (its caller was told it was not).
  if (still_wanted) ATTN_RETURN_IF_ERROR(still_wanted());
  Sequence *seq = locked->seq.get();
  const SequenceConfig &c = seq->config;
  ATTN_RETURN_IF_ERROR(CheckArgs(c, a));
  LayerState &L = seq->layers[static_cast<size_t>(a.layer)];
  const int64_t T = a.q_shape[0];
  const bool fp8 = c.kv_dtype == DType::kFloat8E4M3;
  // A step with tensors in a CUDA IPC region: its bytes are never read on the host, so it is
  // never a replay (no digest) and its result is not stored for one.
  const bool on_device = a.device.any();
  ATTN_RETURN_IF_ERROR(CheckDeviceStep(*backend, a, fp8 && L.k_scales.empty()));
  const uint64_t digest =
      on_device ? 0 : ReplayDigest(a.q, a.q_bytes, a.k, a.k_bytes, a.v, a.v_bytes);
  out->num_heads = c.num_heads;
  out->head_dim = c.head_dim;
  out->dtype = c.dtype;
  out->append_only = a.append_only;
  step->append_only = a.append_only;

  // An exact replay of this layer's last step returns the stored result.
  if (!on_device && L.last.valid && a.position == L.last.position && T == L.last.tokens &&
      digest == L.last.digest && L.table.length() == a.position + T) {
    *o = L.last.o.bytes();
    out->length = L.table.length();
    out->replayed = true;
    out->kv_len = a.append_only ? 0 : L.table.length();
    step->replayed = true;
    return Status::Ok();  // the lock goes with `locked`
  }
  if (a.position != L.table.length()) {
    return FailedPrecondition("position " + std::to_string(a.position) + " does not match layer " +
                              std::to_string(a.layer) + "'s length " +
                              std::to_string(L.table.length()) +
                              " (actual length; Extend appends at the end)");
  }
  std::vector<float> k_scales = L.k_scales, v_scales = L.v_scales;
  if (fp8 && k_scales.empty()) {
    ATTN_RETURN_IF_ERROR(DeriveScales(a.k, c.dtype, T, c.num_kv_heads, c.head_dim, "k", &k_scales));
    ATTN_RETURN_IF_ERROR(DeriveScales(a.v, c.dtype, T, c.num_kv_heads, c.head_dim, "v", &v_scales));
  }

  // Pages: new blocks, plus a private copy of a shared partial last page
  // (copy-on-write).
  PagePool *pool = store->pool();
  const int64_t old_len = L.table.length();
  const int64_t new_len = old_len + T;
  const bool cow =
      L.table.LastPagePartial() && pool->RefCount(seq->sub, L.table.pages().back()) > 1;
  const int64_t need = L.table.BlocksNeeded(new_len) + (cow ? 1 : 0);
  std::vector<int32_t> pages;
  pages.reserve(static_cast<size_t>(need));
  const int64_t from_spare = std::min<int64_t>(need, static_cast<int64_t>(L.spare.size()));
  std::vector<int32_t> fresh(static_cast<size_t>(need - from_spare));
  if (!fresh.empty()) {
    ATTN_RETURN_IF_ERROR(
        store->AllocatePages(seq, static_cast<int64_t>(fresh.size()), fresh.data()));
  }
  for (int64_t i = 0; i < from_spare; ++i) {
    pages.push_back(L.spare.back());
    L.spare.pop_back();
  }
  pages.insert(pages.end(), fresh.begin(), fresh.end());

  const kernels::PagedKvPool &view = seq->sub->view();
  size_t next = 0;
  if (cow) {
    const int32_t shared = L.table.pages().back();
    const int32_t copy = pages[next++];
    Status cs = backend->CopyPage(view, shared, copy, L.table.LastPageTokens());
    if (!cs.ok()) {
      // Reserved pages go back to the reserve, fresh ones to the pool.
      for (int64_t i = from_spare - 1; i >= 0; --i) L.spare.push_back(pages[i]);
      store->ReleasePages(seq, pages.data() + from_spare,
                          static_cast<int64_t>(pages.size()) - from_spare);
      return cs;
    }
    L.table.ReplaceLast(copy);
    store->ReleasePages(seq, &shared,
                        1);  // still held by the other side of the fork
  }
  L.table.AddPages(pages.data() + next, static_cast<int64_t>(pages.size() - next));
  L.table.SetLength(new_len);

  step->locked = std::move(*locked);
  step->layer = a.layer;
  step->old_len = old_len;
  step->from_spare = from_spare;
  step->digest = digest;
  step->replayable = !on_device;
  step->k_scales = std::move(k_scales);
  step->v_scales = std::move(v_scales);
  PagedLayerView lv;
  lv.pool = view;
  lv.block_table = L.table.pages().data();
  lv.num_blocks = L.table.num_blocks();
  lv.kv_len = new_len;
  lv.k_scales = fp8 ? step->k_scales.data() : nullptr;
  lv.v_scales = fp8 ? step->v_scales.data() : nullptr;
  step->append.layer = lv;
  step->append.start = old_len;
  step->append.tokens = T;
  step->append.k = a.k;
  step->append.v = a.v;
  step->append.src_dtype = c.dtype;
  step->append.saturations = 0;
  step->append.device = on_device ? &a.device : nullptr;
  // An append-only step attends nothing: an attend item of 0 query tokens and no output.
  const int64_t q_tokens = a.append_only ? 0 : T;
  o->resize(static_cast<size_t>(q_tokens * c.num_heads * c.head_dim * kernels::DTypeSize(c.dtype)));
  step->attend.layer = lv;
  step->attend.query = PagedQuery{a.q, q_tokens, c.num_heads, c.dtype, c.scale,
                                  on_device ? &a.device : nullptr};
  step->attend.o = a.append_only ? nullptr : o->data();
  return Status::Ok();
}

void CommitExtend(SequenceStore *store, PreparedExtend *step, const std::string &o,
                  const LaunchTimes &times, ExtendOutcome *out) {
  Sequence *seq = step->locked.seq.get();
  LayerState &L = seq->layers[static_cast<size_t>(step->layer)];
  const bool fp8 = seq->config.kv_dtype == DType::kFloat8E4M3;
  if (fp8 && L.k_scales.empty()) {
    L.k_scales = std::move(step->k_scales);
    L.v_scales = std::move(step->v_scales);
  }
  const int64_t saturations = step->append.saturations;
  if (saturations != 0) {  // the store's counter is shared by every batch thread
    seq->fp8_saturations += saturations;
    store->AddSaturations(saturations);
  }
  // Replayable only when the output fits the replay budget (replay_output.h); otherwise a retry
  // gets FAILED_PRECONDITION with the actual length.
  // Steps of CUDA IPC regions are never replayed (their inputs are not fingerprinted): the
  // superseded output goes back to the budget and nothing is stored.
  if (step->replayable) {
    L.last.valid = L.last.o.Store(store->replay_budget(), o);
  } else {
    L.last.o.Clear();
    L.last.valid = false;
  }
  L.last.position = step->append.start;
  L.last.tokens = step->append.tokens;
  L.last.digest = step->digest;
  out->length = L.table.length();
  out->kv_len = step->append_only ? 0 : L.table.length();
  out->device_timed = times.device_timed();
  out->kernel_us = out->device_timed ? times.kernel_ns / 1000 : 0;
  out->h2d_us = out->device_timed ? times.h2d_ns / 1000 : 0;
  out->d2h_us = out->device_timed ? times.d2h_ns / 1000 : 0;
  step->locked.lock.unlock();
  step->locked.seq.reset();
}

void AbortExtend(SequenceStore *store, PreparedExtend *step, std::string *o) {
  Sequence *seq = step->locked.seq.get();
  LayerState &L = seq->layers[static_cast<size_t>(step->layer)];
  // Roll back: the layer keeps its old length; the new pages go back to the
  // pool (reserved ones to the reserve).
  std::vector<int32_t> dropped = L.table.Truncate(step->old_len);
  size_t keep = std::min(dropped.size(), static_cast<size_t>(step->from_spare));
  L.spare.insert(L.spare.end(), dropped.begin(), dropped.begin() + keep);
  store->ReleasePages(seq, dropped.data() + keep, static_cast<int64_t>(dropped.size() - keep));
  o->clear();
  step->locked.lock.unlock();
  step->locked.seq.reset();
}

Status ExtendStep(SequenceStore *store, PagedAttentionBackend *backend, const std::string &owner,
                  const ExtendArgs &a, std::string *o, ExtendOutcome *out) {
  PreparedExtend step;
  ATTN_RETURN_IF_ERROR(PrepareExtend(store, backend, owner, a, o, out, &step));
  if (step.replayed) return Status::Ok();
  LaunchTimes times;
  Status s = backend->AppendAttendBatch(&step.append, &step.attend, 1, &times);
  if (!s.ok()) {
    AbortExtend(store, &step, o);
    return s;
  }
  CommitExtend(store, &step, *o, times, out);
  return Status::Ok();
}

}  // namespace attn
