// libFuzzer target over request decoding, validation and (small) execution (issue 8).
//
// Input: byte 0 picks the request kind (mod 4); the rest is wire-format protobuf, parsed the way
// gRPC's server does (ParseFromArray), then run through the server's real validators and, when
// valid and small, through the cpu backend or the paged KV cache (SequenceStore + ExtendStep on
// CpuPagedAttention) exactly as the services do:
//   0  AttendRequest        ValidateAttend → BackendRegistry::Resolve → CpuBackend::Execute
//   1  CreateSequenceRequest ValidateCreateSequence → SequenceStore::Create → Release
//   2  [ops][len:2][CreateSequenceRequest][ExtendRequest]
//        creates the sequence, runs the Extend on it (an empty sequence_id means the live one),
//        then per `ops` bits: an exact replay, a fork, a truncate, a second step on the child
//   3  [ops][len:2][CreateSequenceRequest][ExtendBatchRequest]
//        one live sequence per step (empty ids → the i-th live one), ValidateExtendBatch, then
//        each step as ExtendBatch runs it
// Beyond crashes, ASan and UBSan, the target traps when an invariant fails: a request that
// passed validation must describe tensors whose byte sizes match their shapes (computed here
// in 128-bit arithmetic), so no backend can read past a buffer; after every input all sequences
// are released and the KV cache must have 0 pages in use (no leak on any path).
//
// Built two ways (tests/fuzz/CMakeLists.txt): with clang's -fsanitize=fuzzer as the fuzzer
// (scripts/fuzz.sh), and with replay_main.cc as a plain program that replays files (the
// regression test, any compiler).
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "attention/v1/sequence.pb.h"
#include "backends/backend_registry.h"
#include "backends/cpu_backend.h"
#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_step.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"
#include "kv_cache/host_pool.h"
#include "validation/attend_validator.h"
#include "validation/sequence_validator.h"
#include "validation/work_bound.h"

namespace {

namespace pb = attention::v1;
using attn::Status;

constexpr double kMaxExecuteFlops = 4e6;  // larger valid problems are validated, not run
constexpr const char* kOwner = "fuzz";
constexpr int kMaxLiveSequences = 8;

[[noreturn]] void Violation(const char* what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

void Require(bool ok, const char* what) {
  if (!ok) Violation(what);
}

/// Bytes a tensor of `shape` and proto `dtype` occupies, in 128-bit arithmetic; -1 when the
/// dtype is unknown or a dimension negative.
__int128 TensorBytes(const pb::Tensor& t) {
  int size = 0;
  switch (t.dtype()) {
    case pb::FLOAT32: size = 4; break;
    case pb::FLOAT16:
    case pb::BFLOAT16: size = 2; break;
    case pb::FLOAT8_E4M3: size = 1; break;
    default: return -1;
  }
  __int128 n = size;
  for (int64_t d : t.shape()) {
    if (d < 0) return -1;
    n *= d;
    if (n > (static_cast<__int128>(1) << 100)) return -1;
  }
  return n;
}

/// The services' shared state: the cpu backend behind a registry, and a small paged KV cache.
struct World {
  attn::BackendRegistry registry;
  std::unique_ptr<attn::HostPool> memory;
  std::unique_ptr<attn::PagePool> pages;
  std::unique_ptr<attn::SequenceStore> store;
  attn::CpuPagedAttention paged{1};

  World() {
    // Malformed strings (invalid UTF-8) make protobuf log one line per input: keep the fuzzer's
    // output readable.
    google::protobuf::SetLogHandler(nullptr);
    registry.Add(std::make_unique<attn::CpuBackend>(1), /*auto_rank=*/100);
    auto m = attn::HostPool::Create(int64_t{8} << 20);
    Require(m.ok(), "HostPool::Create");
    memory = std::move(*m);
    pages = std::make_unique<attn::PagePool>(memory.get(), attn::PagePoolOptions{4, 8, true});
    store = std::make_unique<attn::SequenceStore>(pages.get(), attn::SequenceStoreOptions{});
  }

  int64_t PagesUsed() const {
    int64_t used = 0;
    for (const attn::KvClassStats& c : pages->Stats()) used += c.pages_used;
    return used;
  }
};

World& GetWorld() {
  static World* world = new World();  // lives for the process (the fuzzer never exits cleanly)
  return *world;
}

void FuzzAttend(World& w, const uint8_t* data, size_t size) {
  pb::AttendRequest r;
  if (!r.ParseFromArray(data, static_cast<int>(size))) return;
  auto v = attn::ValidateAttend(r);
  if (!v.ok()) {
    Require(v.status().code() == attn::StatusCode::kInvalidArgument,
            "ValidateAttend failed with a code other than INVALID_ARGUMENT");
    return;
  }
  // Soundness: every tensor's bytes match its shape, and o/lse sizes follow from q.
  for (const pb::Tensor* t : {&r.q(), &r.k(), &r.v()}) {
    Require(TensorBytes(*t) == static_cast<__int128>(t->data().size()),
            "validated tensor's data size differs from shape x dtype size");
  }
  Require(static_cast<__int128>(v->o_bytes) == static_cast<__int128>(r.q().data().size()),
          "o_bytes differs from q's byte size");
  const attn::kernels::AttentionShape& s = v->shape;
  Require(s.batch >= 1 && s.num_heads >= 1 && s.num_kv_heads >= 1 && s.head_dim >= 1,
          "validated extents must be >= 1");
  Require(s.num_heads % s.num_kv_heads == 0, "N % K != 0 passed validation");
  if (s.layout == attn::kernels::Layout::kVarlen) {
    Require(v->q_offsets.back() == s.total_q && v->kv_offsets.back() == s.total_kv,
            "varlen offsets do not end at the totals");
  } else if (!v->q_lengths.empty()) {
    for (int64_t b = 0; b < s.batch; ++b) {
      Require(v->q_lengths[b] >= 0 && v->q_lengths[b] <= s.max_q_len &&
                  v->kv_lengths[b] >= 0 && v->kv_lengths[b] <= s.max_kv_len,
              "padded lengths outside the tensor");
    }
  }
  // The work bound (issue 16): the estimate is finite, never negative, at most T·S·N per
  // entry, and the bound refuses only with RESOURCE_EXHAUSTED.
  Require(v->score_pairs >= 0 && v->flops >= 0, "negative work estimate");
  Require(v->score_pairs <=
              static_cast<double>(s.batch) * s.max_q_len * s.max_kv_len * s.num_heads * (1 + 1e-9),
          "score pairs above B·T·S·N");
  const Status bound = attn::CheckWorkBound(*v, true, {1e6, 1e9});
  Require(bound.ok() || bound.code() == attn::StatusCode::kResourceExhausted,
          "work bound refused with a code other than RESOURCE_EXHAUSTED");
  auto choice = w.registry.Resolve(r.backend(), "cpu", s);
  if (!choice.ok()) return;
  if (v->flops > kMaxExecuteFlops || v->o_bytes > (1u << 20)) return;
  // Exactly sized outputs (heap, so ASan sees any write past them).
  std::vector<char> o(v->o_bytes);
  std::vector<float> lse(s.return_lse ? static_cast<size_t>(s.lse_elements()) : 0);
  attn::ExecuteTimes times;
  Status st = choice->backend->Execute(s, v->Tensors(o.data(), lse.empty() ? nullptr : lse.data()),
                                       &times);
  Require(st.ok() || st.code() != attn::StatusCode::kInternal,
          "cpu backend returned INTERNAL for a validated request");
  // Stopped part-way (the first byte picks after how many checks): CANCELLED or done, and
  // never a write outside the outputs (ASan).
  if (!st.ok()) return;
  const int stop_after = size > 0 ? data[0] % 4 : 0;
  std::atomic<int> checks{0};
  st = choice->backend->ExecuteUntil(
      s, v->Tensors(o.data(), lse.empty() ? nullptr : lse.data()),
      [&checks, stop_after] { return checks.fetch_add(1) >= stop_after; }, &times);
  Require(st.ok() || st.code() == attn::StatusCode::kCancelled,
          "a stopped cpu computation returned neither OK nor CANCELLED");
}

/// Splits [ops][len:2][create][rest].
bool SplitScript(const uint8_t* data, size_t size, uint8_t* ops, pb::CreateSequenceRequest* create,
                 const uint8_t** rest, size_t* rest_size) {
  if (size < 3) return false;
  *ops = data[0];
  const size_t len = static_cast<size_t>(data[1]) | (static_cast<size_t>(data[2]) << 8);
  if (len > size - 3) return false;
  if (!create->ParseFromArray(data + 3, static_cast<int>(len))) return false;
  *rest = data + 3 + len;
  *rest_size = size - 3 - len;
  return true;
}

/// Creates up to `n` sequences from `create`; returns their ids (fewer when validation or the
/// cache refuses).
std::vector<std::string> CreateSequences(World& w, const pb::CreateSequenceRequest& create,
                                         int n) {
  std::vector<std::string> ids;
  auto config = attn::ValidateCreateSequence(create);
  if (!config.ok()) {
    Require(config.status().code() == attn::StatusCode::kInvalidArgument,
            "ValidateCreateSequence failed with a code other than INVALID_ARGUMENT");
    return ids;
  }
  for (int i = 0; i < n; ++i) {
    auto seq = w.store->Create(kOwner, *config);
    if (!seq.ok()) break;
    ids.push_back(seq->seq->id);
  }
  return ids;
}

/// Validates and runs one Extend as the service's step batcher does (ValidateExtend, then
/// ExtendStep).
Status RunExtend(World& w, const pb::ExtendRequest& r, attn::ExtendOutcome* out) {
  auto args = attn::ValidateExtend(r);
  if (!args.ok()) return args.status();
  // An append-only step has no q (the proto requires it unset): only k and v carry bytes, and
  // the step returns no output.
  std::vector<const pb::Tensor*> tensors = {&r.k(), &r.v()};
  if (!r.append_only()) tensors.push_back(&r.q());
  for (const pb::Tensor* t : tensors) {
    Require(TensorBytes(*t) == static_cast<__int128>(t->data().size()),
            "validated Extend tensor's data size differs from shape x dtype size");
  }
  Require(!r.append_only() || !r.has_q(), "an append-only Extend with q passed validation");
  std::string o;
  Status s = attn::ExtendStep(w.store.get(), &w.paged, kOwner, *args, &o, out);
  if (s.ok()) {
    Require(o.size() == (r.append_only() ? 0 : r.q().data().size()),
            "Extend output size differs from q's (empty for append-only)");
  } else {
    Require(s.code() != attn::StatusCode::kInternal, "ExtendStep returned INTERNAL");
  }
  return s;
}

void ReleaseAll(World& w, const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    Require(w.store->Release(id, kOwner, nullptr).ok(), "Release of a live sequence failed");
  }
}

void CheckNothingLeaked(World& w) {
  Require(w.store->live_sequences() == 0, "sequences left after release");
  Require(w.PagesUsed() == 0, "KV pages still in use after every sequence was released");
}

void FuzzCreate(World& w, const uint8_t* data, size_t size) {
  pb::CreateSequenceRequest r;
  if (!r.ParseFromArray(data, static_cast<int>(size))) return;
  std::vector<std::string> ids = CreateSequences(w, r, 1);
  ReleaseAll(w, ids);
  CheckNothingLeaked(w);
}

void FuzzExtend(World& w, const uint8_t* data, size_t size) {
  uint8_t ops;
  pb::CreateSequenceRequest create;
  const uint8_t* rest;
  size_t rest_size;
  if (!SplitScript(data, size, &ops, &create, &rest, &rest_size)) return;
  pb::ExtendRequest r;
  if (!r.ParseFromArray(rest, static_cast<int>(rest_size))) return;
  std::vector<std::string> ids = CreateSequences(w, create, 1);
  if (r.sequence_id().empty() && !ids.empty()) r.set_sequence_id(ids[0]);
  attn::ExtendOutcome out;
  Status s = RunExtend(w, r, &out);
  if (s.ok()) {
    const int64_t t = r.append_only() ? r.k().shape(0) : r.q().shape(0);  // validated rank 3
    Require(out.length == r.position() + t, "length != position + T after Extend");
    if (ops & 1) {  // exact replay: same result, nothing appended
      attn::ExtendOutcome again;
      Require(RunExtend(w, r, &again).ok() && again.replayed && again.length == out.length,
              "an exact replay was not replayed");
    }
    if ((ops & 2) && !ids.empty()) {  // fork (optionally a prefix), step on the child
      std::optional<int64_t> length;
      if (ops & 4) length = out.length / 2;
      auto child = w.store->Fork(ids[0], kOwner, length);
      if (child.ok()) {
        const std::string child_id = child->seq->id;
        child->lock.unlock();
        ids.push_back(child_id);
        pb::ExtendRequest next = r;
        next.set_sequence_id(child_id);
        next.set_position(length.value_or(out.length));
        attn::ExtendOutcome o2;
        (void)RunExtend(w, next, &o2);
      }
    }
    if ((ops & 8) && !ids.empty()) {  // truncate, then append again at the new end
      auto seq = w.store->Acquire(ids[0], kOwner);
      if (seq.ok()) {
        w.store->Truncate(seq->seq.get(), ops >> 4);
        seq->lock.unlock();
        pb::ExtendRequest next = r;
        next.set_sequence_id(ids[0]);
        next.set_position(std::min<int64_t>(ops >> 4, out.length));
        attn::ExtendOutcome o3;
        (void)RunExtend(w, next, &o3);
      }
    }
  }
  ReleaseAll(w, ids);
  CheckNothingLeaked(w);
}

void FuzzExtendBatch(World& w, const uint8_t* data, size_t size) {
  uint8_t ops;
  pb::CreateSequenceRequest create;
  const uint8_t* rest;
  size_t rest_size;
  if (!SplitScript(data, size, &ops, &create, &rest, &rest_size)) return;
  pb::ExtendBatchRequest r;
  if (!r.ParseFromArray(rest, static_cast<int>(rest_size))) return;
  const int want = std::min(r.steps_size(), kMaxLiveSequences);
  std::vector<std::string> ids = CreateSequences(w, create, want);
  for (int i = 0; i < r.steps_size() && i < static_cast<int>(ids.size()); ++i) {
    if (r.steps(i).sequence_id().empty()) r.mutable_steps(i)->set_sequence_id(ids[i]);
  }
  if (attn::ValidateExtendBatch(r).ok()) {
    for (const pb::ExtendRequest& step : r.steps()) {
      attn::ExtendOutcome out;
      (void)RunExtend(w, step, &out);
    }
  }
  ReleaseAll(w, ids);
  CheckNothingLeaked(w);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (1u << 20)) return 0;
  World& w = GetWorld();
  switch (data[0] % 4) {
    case 0: FuzzAttend(w, data + 1, size - 1); break;
    case 1: FuzzCreate(w, data + 1, size - 1); break;
    case 2: FuzzExtend(w, data + 1, size - 1); break;
    default: FuzzExtendBatch(w, data + 1, size - 1); break;
  }
  return 0;
}
