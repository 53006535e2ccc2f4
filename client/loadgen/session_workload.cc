#include "loadgen/session_workload.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "attention/v1/sequence.grpc.pb.h"
#include "loadgen/dtype_codec.h"
#include "loadgen/oracle.h"
#include "loadgen/random_normal.h"
#include "loadgen/report.h"
#include "loadgen/interrupt.h"
#include "loadgen/verify.h"

namespace attn::loadgen {

namespace av1 = attention::v1;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- planning

int64_t ScaleGenerated(int64_t generated, double gen_scale, int64_t max_gen) {
  const double scaled = std::round(static_cast<double>(generated) * gen_scale);
  return std::clamp<int64_t>(static_cast<int64_t>(scaled), 0, std::max<int64_t>(max_gen, 0));
}

SessionPlan PlanSession(const TraceRecord& row, const TokenScaling& scaling, double gen_scale,
                        int64_t max_gen) {
  SessionPlan p;
  p.context_tokens = ScaleTokens(row.context_tokens, scaling);
  p.generated_tokens = ScaleGenerated(row.generated_tokens, gen_scale, max_gen);
  return p;
}

bool ParseMooncakeRequests(std::istream& in, std::vector<MooncakeRequest>* out,
                           std::string* error) {
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("input_length") ||
        !j["input_length"].is_number_integer() || j["input_length"].get<int64_t>() < 0) {
      *error = "line " + std::to_string(line_no) + ": expected a JSON object with input_length";
      return false;
    }
    MooncakeRequest r;
    if (j.contains("timestamp") && j["timestamp"].is_number()) {
      r.time_s = j["timestamp"].get<double>() / 1000.0;
    }
    r.input_length = j["input_length"].get<int64_t>();
    if (j.contains("output_length") && j["output_length"].is_number_integer()) {
      r.output_length = j["output_length"].get<int64_t>();
    }
    if (j.contains("hash_ids")) {
      if (!j["hash_ids"].is_array()) {
        *error = "line " + std::to_string(line_no) + ": hash_ids is not an array";
        return false;
      }
      for (const auto& h : j["hash_ids"]) {
        if (!h.is_number_integer()) {
          *error = "line " + std::to_string(line_no) + ": hash_ids holds a non-integer";
          return false;
        }
        r.hash_ids.push_back(h.get<int64_t>());
      }
    }
    out->push_back(std::move(r));
  }
  return true;
}

bool ReadMooncakeRequests(const std::string& path, std::vector<MooncakeRequest>* out,
                          std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open trace '" + path + "'";
    return false;
  }
  std::string detail;
  if (!ParseMooncakeRequests(in, out, &detail)) {
    *error = "trace '" + path + "': " + detail;
    return false;
  }
  if (out->empty()) {
    *error = "trace '" + path + "' holds no requests";
    return false;
  }
  return true;
}

int64_t SharedBlocks(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

int64_t ForkLength(int64_t shared_blocks, double token_scale, int64_t parent_context,
                   int64_t child_context) {
  const double tokens =
      std::round(static_cast<double>(shared_blocks) * kMooncakeBlockTokens * token_scale);
  int64_t length = static_cast<int64_t>(tokens);
  length = std::min(length, parent_context);
  length = std::min(length, child_context - 1);
  return std::max<int64_t>(length, 0);
}

std::optional<PrefixCache::Match> PrefixCache::Acquire(const std::vector<int64_t>& hashes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto best = entries_.end();
  int64_t best_shared = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t shared = SharedBlocks(it->hashes, hashes);
    if (shared > best_shared) {
      best_shared = shared;
      best = it;
    }
  }
  if (best == entries_.end()) return std::nullopt;
  ++best->pins;
  entries_.splice(entries_.begin(), entries_, best);
  return Match{best->sequence_id, best_shared, best->context_tokens};
}

void PrefixCache::Release(const std::string& sequence_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& e : entries_) {
    if (e.sequence_id == sequence_id && e.pins > 0) {
      --e.pins;
      return;
    }
  }
}

std::vector<std::string> PrefixCache::Insert(const std::vector<int64_t>& hashes,
                                             const std::string& sequence_id,
                                             int64_t context_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> released;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->hashes == hashes && it->pins == 0) {
      released.push_back(it->sequence_id);
      entries_.erase(it);
      break;
    }
  }
  entries_.push_front(Entry{hashes, sequence_id, context_tokens, 0});
  for (auto it = entries_.end(); entries_.size() > capacity_ && it != entries_.begin();) {
    --it;
    if (it->pins == 0) {
      released.push_back(it->sequence_id);
      it = entries_.erase(it);
    }
  }
  return released;
}

std::vector<std::string> PrefixCache::Drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> ids;
  for (const auto& e : entries_) ids.push_back(e.sequence_id);
  entries_.clear();
  return ids;
}

size_t PrefixCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

namespace {
uint64_t Mix(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}
}  // namespace

uint64_t SessionTokenKey(uint64_t seed, int64_t session, int64_t position) {
  return Mix(seed ^ 0x5e55105ull, static_cast<uint64_t>(session), static_cast<uint64_t>(position));
}

uint64_t MooncakeTokenKey(uint64_t seed, const MooncakeRequest& request, double token_scale,
                          int64_t context, int64_t request_index, int64_t position) {
  const double block_tokens = kMooncakeBlockTokens * token_scale;
  if (position < context && block_tokens > 0) {
    const auto block = static_cast<size_t>(std::floor(static_cast<double>(position) / block_tokens));
    if (block < request.hash_ids.size()) {
      return Mix(seed ^ 0x4a54ull, static_cast<uint64_t>(request.hash_ids[block]) * 2 + 1,
                 static_cast<uint64_t>(position));
    }
  }
  return Mix(seed ^ 0x4a55ull, static_cast<uint64_t>(request_index) * 2,
             static_cast<uint64_t>(position));
}

/// Summary of `h` with every value multiplied by `scale`.
LatencySummary SummarizeScaled(const HdrHistogram& h, double scale) {
  LatencySummary s;
  s.count = h.count();
  s.mean = h.mean() * scale;
  s.p50 = h.Percentile(50) * scale;
  s.p90 = h.Percentile(90) * scale;
  s.p99 = h.Percentile(99) * scale;
  s.max = static_cast<double>(h.max()) * scale;
  return s;
}

/// µs recorded, ms reported.
LatencySummary Summarize(const HdrHistogram& us) { return SummarizeScaled(us, 1e-3); }

// ---------------------------------------------------------------- running

namespace {

using KeyFn = std::function<uint64_t(int64_t position)>;

// Token rows [first, first+count) of tensor `which` (0 q, 1 k, 2 v) on `layer`, `width` values
// each, encoded in `dtype`.
std::string TokenBytes(const KeyFn& key, int layer, int which, int64_t first, int64_t count,
                       int64_t width, av1::DType dtype) {
  std::string bytes;
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t p = first; p < first + count; ++p) {
    NormalGenerator g(SplitMix64(key(p) ^ (static_cast<uint64_t>(layer) * 3 + which + 1) *
                                               0x9E3779B97F4A7C15ull));
    g.Fill(row.data(), width);
    EncodeValues(row.data(), width, dtype, &bytes);
  }
  return bytes;
}

void SetTensor(av1::Tensor* t, av1::DType dtype, std::vector<int64_t> shape, std::string bytes) {
  t->set_dtype(dtype);
  for (int64_t e : shape) t->add_shape(e);
  t->set_data(std::move(bytes));
}

struct Shape {
  int64_t n, k, h;
  av1::DType dtype;
};

void BuildExtend(const Shape& s, const std::string& id, int layer, int64_t position, int64_t t,
                 const KeyFn& key, av1::ExtendRequest* r) {
  r->Clear();
  r->set_sequence_id(id);
  r->set_layer(layer);
  r->set_position(position);
  SetTensor(r->mutable_q(), s.dtype, {t, s.n, s.h},
            TokenBytes(key, layer, 0, position, t, s.n * s.h, s.dtype));
  SetTensor(r->mutable_k(), s.dtype, {t, s.k, s.h},
            TokenBytes(key, layer, 1, position, t, s.k * s.h, s.dtype));
  SetTensor(r->mutable_v(), s.dtype, {t, s.k, s.h},
            TokenBytes(key, layer, 2, position, t, s.k * s.h, s.dtype));
}

// Checks o of an Extend at `position` with `t` tokens against the oracle over the regenerated
// history [0, position + t).
Comparison VerifyExtend(const Shape& s, int layer, int64_t position, int64_t t, const KeyFn& key,
                        const av1::ExtendResponse& response) {
  const int64_t len = position + t;
  std::vector<double> q, k, v, o, ref, lse;
  DecodeValues(TokenBytes(key, layer, 0, position, t, s.n * s.h, s.dtype), s.dtype, &q);
  DecodeValues(TokenBytes(key, layer, 1, 0, len, s.k * s.h, s.dtype), s.dtype, &k);
  DecodeValues(TokenBytes(key, layer, 2, 0, len, s.k * s.h, s.dtype), s.dtype, &v);
  Comparison c;
  if (response.o().dtype() != s.dtype || !DecodeValues(response.o().data(), s.dtype, &o) ||
      o.size() != q.size()) {
    c.pass = false;
    c.rel_error = INFINITY;
    c.detail = "o has the wrong dtype or size";
    return c;
  }
  if (response.length() != len) {
    c.pass = false;
    c.detail = "length " + std::to_string(response.length()) + ", expected " +
               std::to_string(len);
    return c;
  }
  OracleProblem p;
  p.q_len = t;
  p.kv_len = len;
  p.heads = s.n;
  p.kv_heads = s.k;
  p.head_dim = s.h;
  p.causal = Causal::kBottomRight;
  ReferenceAttention(p, q, k, v, &ref, &lse);
  return CompareOutputs(o, ref, s.h, ToleranceFor(s.dtype));
}

int64_t Micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

struct Stats {
  int64_t sessions = 0, sessions_ok = 0, prefill_tokens = 0, decode_steps = 0;
  int64_t sessions_cut = 0;  // cut short at a step boundary by SIGINT/SIGTERM (not an error)
  HdrHistogram prefill_us, step_us, message_us;
  // From each OK step's ExecutionReport: steps in the server launch it ran in, queue time.
  HdrHistogram server_batch, server_queue_us, server_total_us;
  // Batched steps: the batch's wall time, its kernels' device time and the difference (the
  // server's own time per batched step), PhaseTimes.batch_us / batch_kernel_us.
  HdrHistogram server_batch_us, server_batch_kernel_us, server_overhead_us, server_copy_us;
  // Steady-state decode window (µs since the run's start): when each decode step completed,
  // when each session's prefill completed, when each session's decoding ended.
  Clock::time_point start;
  std::vector<int64_t> step_done_us, prefill_done_us, decode_end_us;
  int64_t Since(Clock::time_point t) const { return Micros(t - start); }
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> first_messages;
  int64_t verified = 0, mismatches = 0;
  double worst = 0;
  std::string first_mismatch;
  int64_t forks = 0, tokens_saved = 0, evictions = 0;

  void Error(grpc::StatusCode code, const std::string& where, const std::string& message) {
    const std::string name = StatusCodeName(code);
    ++errors[name];
    first_messages.emplace(name, where + ": " + message);
  }
  void Check(const Comparison& c, const std::string& where) {
    ++verified;
    if (std::isfinite(c.rel_error)) worst = std::max(worst, c.rel_error);
    if (!c.pass) {
      ++mismatches;
      if (first_mismatch.empty()) first_mismatch = where + ": " + c.detail;
    }
  }
  void Server(const av1::ExtendResponse& r) {
    server_batch.Record(std::max<int64_t>(r.report().batch_size(), 0));
    server_queue_us.Record(std::max<int64_t>(r.report().times().queue_us(), 0));
    server_total_us.Record(std::max<int64_t>(r.report().times().total_us(), 0));
    const auto& t = r.report().times();
    if (t.batch_us() > 0) {
      server_batch_us.Record(t.batch_us());
      server_batch_kernel_us.Record(std::max<int64_t>(t.batch_kernel_us(), 0));
      server_overhead_us.Record(std::max<int64_t>(t.batch_us() - t.batch_kernel_us(), 0));
      server_copy_us.Record(
          std::max<int64_t>(t.host_to_device_us(), 0) + std::max<int64_t>(t.device_to_host_us(), 0));
    }
  }
  void Merge(const Stats& o) {
    sessions += o.sessions;
    sessions_ok += o.sessions_ok;
    sessions_cut += o.sessions_cut;
    prefill_tokens += o.prefill_tokens;
    decode_steps += o.decode_steps;
    prefill_us.Merge(o.prefill_us);
    step_us.Merge(o.step_us);
    message_us.Merge(o.message_us);
    server_batch.Merge(o.server_batch);
    server_queue_us.Merge(o.server_queue_us);
    server_total_us.Merge(o.server_total_us);
    server_batch_us.Merge(o.server_batch_us);
    server_batch_kernel_us.Merge(o.server_batch_kernel_us);
    server_overhead_us.Merge(o.server_overhead_us);
    server_copy_us.Merge(o.server_copy_us);
    step_done_us.insert(step_done_us.end(), o.step_done_us.begin(), o.step_done_us.end());
    prefill_done_us.insert(prefill_done_us.end(), o.prefill_done_us.begin(),
                           o.prefill_done_us.end());
    decode_end_us.insert(decode_end_us.end(), o.decode_end_us.begin(), o.decode_end_us.end());
    for (const auto& [k, v] : o.errors) errors[k] += v;
    for (const auto& [k, v] : o.first_messages) first_messages.emplace(k, v);
    verified += o.verified;
    mismatches += o.mismatches;
    worst = std::max(worst, o.worst);
    if (first_mismatch.empty()) first_mismatch = o.first_mismatch;
    forks += o.forks;
    tokens_saved += o.tokens_saved;
    evictions += o.evictions;
  }
};

// One live sequence of a worker.
struct Live {
  int64_t index = 0;
  std::string id;
  SessionPlan plan;
  KeyFn key;
  bool verify = false;
  bool failed = false;
};

/// The steady-state decode rate: decode steps completed between the last prefill's completion
/// and the first session's end of decoding, divided by that window (every session is decoding
/// throughout it when --requests <= --concurrency). No window (0) otherwise.
void SteadyWindow(const Stats& all, SessionReport* r) {
  if (all.prefill_done_us.empty() || all.decode_end_us.empty()) return;
  const int64_t from = *std::max_element(all.prefill_done_us.begin(), all.prefill_done_us.end());
  const int64_t to = *std::min_element(all.decode_end_us.begin(), all.decode_end_us.end());
  if (to <= from) return;
  int64_t n = 0;
  for (int64_t t : all.step_done_us) n += (t > from && t <= to) ? 1 : 0;
  r->steady_window_s = static_cast<double>(to - from) * 1e-6;
  r->steady_decode_steps = n;
  r->steady_decode_steps_per_s = static_cast<double>(n) / r->steady_window_s;
}

// After SIGINT/SIGTERM, the deadline of each ReleaseSequence (see SessionRunner::ReleaseSeq).
constexpr int64_t kReleaseAfterInterruptMs = 1000;

class SessionRunner {
 public:
  SessionRunner(const SessionOptions& o, const std::vector<SessionPlan>& plans,
                const std::vector<MooncakeRequest>& requests, int64_t count)
      : o_(o),
        plans_(plans),
        requests_(requests),
        count_(count),
        shape_{o.run.shape.heads, o.run.shape.kv_heads, o.run.shape.head_dim, o.run.shape.dtype},
        cache_(static_cast<size_t>(std::max<int64_t>(o.prefix_cache_sequences, 1))) {}

  SessionReport Run() {
    start_ = Clock::now();
    std::vector<Stats> per(static_cast<size_t>(o_.run.concurrency));
    for (auto& p : per) p.start = start_;
    std::vector<std::thread> threads;
    for (int w = 0; w < o_.run.concurrency; ++w) {
      threads.emplace_back([this, &per, w] { Work(&per[static_cast<size_t>(w)]); });
    }
    for (auto& t : threads) t.join();
    Stats all;
    for (const auto& s : per) all.Merge(s);
    // Release what the prefix cache still holds.
    if (o_.workload == "mooncake") {
      auto stub = av1::SequenceService::NewStub(Channel());
      for (const auto& id : cache_.Drain()) ReleaseSeq(stub.get(), id, &all);
    }
    const double wall = std::chrono::duration<double>(Clock::now() - start_).count();
    SessionReport r;
    r.wall_s = wall;
    r.sessions = all.sessions;
    r.sessions_ok = all.sessions_ok;
    r.sessions_cut = all.sessions_cut;
    r.prefill_tokens = all.prefill_tokens;
    r.decode_steps = all.decode_steps;
    r.decode_steps_per_s = wall > 0 ? all.decode_steps / wall : 0;
    SteadyWindow(all, &r);
    r.prefill_ms = Summarize(all.prefill_us);
    r.step_ms = Summarize(all.step_us);
    r.message_ms = Summarize(all.message_us);
    r.server_batch_size = SummarizeScaled(all.server_batch, 1.0);
    r.server_queue_ms = Summarize(all.server_queue_us);
    r.server_total_ms = Summarize(all.server_total_us);
    r.server_batch_ms = Summarize(all.server_batch_us);
    r.server_batch_kernel_ms = Summarize(all.server_batch_kernel_us);
    r.server_overhead_ms = Summarize(all.server_overhead_us);
    r.server_copy_ms = Summarize(all.server_copy_us);
    r.errors = all.errors;
    r.first_messages = all.first_messages;
    r.verified = all.verified;
    r.mismatches = all.mismatches;
    r.worst_rel_error = all.worst;
    r.first_mismatch = all.first_mismatch;
    r.forks = all.forks;
    r.tokens_saved = all.tokens_saved;
    r.prefix_evictions = all.evictions;
    if (o_.check_kv_released) {
      auto stub = av1::AttentionService::NewStub(Channel());
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(o_.run.deadline_ms));
      av1::GetServerInfoResponse info;
      const grpc::Status st = stub->GetServerInfo(&ctx, av1::GetServerInfoRequest(), &info);
      if (st.ok()) {
        r.kv_pages_used_after = 0;
        for (const auto& c : info.kv_cache().classes()) r.kv_pages_used_after += c.pages_used();
      } else {
        r.stop_reason = "GetServerInfo failed: " + StatusCodeName(st.error_code()) + ": " +
                        st.error_message();
      }
    }
    return r;
  }

 private:
  std::shared_ptr<grpc::Channel> Channel() const {
    grpc::ChannelArguments args;
    const int bytes = std::min(o_.run.max_message_mb, 2047) * 1024 * 1024;
    args.SetMaxSendMessageSize(bytes);
    args.SetMaxReceiveMessageSize(bytes);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Sequences live on the replica that created them: one connection per worker (pick_first),
    // never round_robin, which would send a sequence's next step to another replica
    // (NOT_FOUND). Session runs target one replica (README "Connection age and re-resolving").
    args.SetLoadBalancingPolicyName("pick_first");
    return MakeSecureChannel(o_.run.target, o_.run.security, args);
  }

  // The per-call deadline (capped at the end of the interrupt's grace period after SIGINT).
  void Deadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(Interrupt::CapDeadline(std::chrono::system_clock::now() +
                                             std::chrono::milliseconds(o_.run.deadline_ms)));
  }

  // True (and the session counted as cut) when SIGINT/SIGTERM arrived: the session stops at
  // this step boundary.
  static bool Cut(Stats* st) {
    if (!Interrupt::Requested()) return false;
    ++st->sessions_cut;
    return true;
  }

  // Claims the next session/request index, or -1 when the run is over.
  int64_t Claim() {
    if (Interrupt::Requested()) return -1;
    if (o_.run.duration_s > 0 &&
        std::chrono::duration<double>(Clock::now() - start_).count() >= o_.run.duration_s) {
      return -1;
    }
    const int64_t i = next_.fetch_add(1);
    return count_ >= 0 && i >= count_ ? -1 : i;
  }

  // Releases are cleanup, also after SIGINT/SIGTERM: never cancelled by the interrupt (that would
  // leave the sequence's KV pages held on the server), but bounded by kReleaseAfterInterruptMs
  // once interrupted.
  void ReleaseSeq(av1::SequenceService::Stub* stub, const std::string& id, Stats* st) {
    grpc::ClientContext ctx;
    const int64_t ms = Interrupt::Requested()
                           ? std::min<int64_t>(o_.run.deadline_ms, kReleaseAfterInterruptMs)
                           : o_.run.deadline_ms;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
    av1::ReleaseSequenceRequest req;
    req.set_sequence_id(id);
    av1::ReleaseSequenceResponse resp;
    const grpc::Status s = stub->ReleaseSequence(&ctx, req, &resp);
    if (!s.ok()) st->Error(s.error_code(), "ReleaseSequence", s.error_message());
  }

  bool Create(av1::SequenceService::Stub* stub, int64_t reserve, std::string* id, Stats* st) {
    grpc::ClientContext ctx;
    const Interrupt::ScopedCall cancellable(&ctx);
    Deadline(&ctx);
    av1::CreateSequenceRequest req;
    req.set_num_layers(o_.layers);
    req.set_num_kv_heads(static_cast<int32_t>(shape_.k));
    req.set_num_heads(static_cast<int32_t>(shape_.n));
    req.set_head_dim(static_cast<int32_t>(shape_.h));
    req.set_dtype(shape_.dtype);
    req.set_reserve_tokens(reserve);
    av1::CreateSequenceResponse resp;
    const grpc::Status s = stub->CreateSequence(&ctx, req, &resp);
    if (!s.ok()) {
      st->Error(s.error_code(), "CreateSequence", s.error_message());
      return false;
    }
    *id = resp.sequence().sequence_id();
    return true;
  }

  // One unary Extend of `t` tokens at `position` on `layer` (verified when sampled).
  bool ExtendUnary(av1::SequenceService::Stub* stub, Live* s, int layer, int64_t position,
                   int64_t t, Stats* st) {
    av1::ExtendRequest req;
    BuildExtend(shape_, s->id, layer, position, t, s->key, &req);
    grpc::ClientContext ctx;
    const Interrupt::ScopedCall cancellable(&ctx);
    Deadline(&ctx);
    av1::ExtendResponse resp;
    const grpc::Status status = stub->Extend(&ctx, req, &resp);
    if (!status.ok()) {
      st->Error(status.error_code(), "Extend", status.error_message());
      return false;
    }
    st->Server(resp);
    if (s->verify) {
      st->Check(VerifyExtend(shape_, layer, position, t, s->key, resp),
                "sequence " + std::to_string(s->index) + " layer " + std::to_string(layer) +
                    " position " + std::to_string(position));
    }
    return true;
  }

  // Prefill [from, context) on every layer.
  bool Prefill(av1::SequenceService::Stub* stub, Live* s, int64_t from, Stats* st) {
    for (int layer = 0; layer < o_.layers; ++layer) {
      if (Cut(st)) return false;
      if (!ExtendUnary(stub, s, layer, from, s->plan.context_tokens - from, st)) return false;
    }
    st->prefill_tokens += s->plan.context_tokens - from;
    return true;
  }

  // Decodes every generated token of one session through Extend or ExtendStream.
  bool Decode(av1::SequenceService::Stub* stub, Live* s, Stats* st) {
    if (s->plan.generated_tokens == 0) return true;
    if (o_.decode_api != "stream") {
      for (int64_t step = 0; step < s->plan.generated_tokens; ++step) {
        if (Cut(st)) return false;
        const auto t0 = Clock::now();
        for (int layer = 0; layer < o_.layers; ++layer) {
          if (!ExtendUnary(stub, s, layer, DecodePosition(s->plan, step), 1, st)) return false;
        }
        st->step_us.Record(Micros(Clock::now() - t0));
        st->step_done_us.push_back(st->Since(Clock::now()));
        ++st->decode_steps;
      }
      st->decode_end_us.push_back(st->Since(Clock::now()));
      return true;
    }
    grpc::ClientContext ctx;
    const Interrupt::ScopedCall cancellable(&ctx);
    Deadline(&ctx);
    auto stream = stub->ExtendStream(&ctx);
    bool ok = true;
    bool recorded = false;  // an error of this session was counted already
    av1::ExtendRequest req;
    av1::ExtendResult result;
    for (int64_t step = 0; ok && step < s->plan.generated_tokens; ++step) {
      if (Cut(st)) {
        ok = false;
        recorded = true;  // not an error: the stream ends cleanly below
        break;
      }
      const int64_t position = DecodePosition(s->plan, step);
      const auto t0 = Clock::now();
      for (int layer = 0; ok && layer < o_.layers; ++layer) {
        BuildExtend(shape_, s->id, layer, position, 1, s->key, &req);
        const auto w = Clock::now();
        if (!stream->Write(req) || !stream->Read(&result)) {
          ok = false;
          break;
        }
        st->message_us.Record(Micros(Clock::now() - w));
        if (result.code() != 0) {
          st->Error(static_cast<grpc::StatusCode>(result.code()), "ExtendStream",
                    result.message());
          recorded = true;
          ok = false;
          break;
        }
        st->Server(result.response());
        if (s->verify) {
          st->Check(VerifyExtend(shape_, layer, position, 1, s->key, result.response()),
                    "sequence " + std::to_string(s->index) + " layer " + std::to_string(layer) +
                        " position " + std::to_string(position));
        }
      }
      if (ok) {
        st->step_us.Record(Micros(Clock::now() - t0));
        st->step_done_us.push_back(st->Since(Clock::now()));
        ++st->decode_steps;
      }
    }
    if (ok) st->decode_end_us.push_back(st->Since(Clock::now()));
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    if (!status.ok()) {
      st->Error(status.error_code(), "ExtendStream", status.error_message());
      ok = false;
    } else if (!ok && !recorded) {
      st->Error(grpc::StatusCode::UNKNOWN, "ExtendStream", "stream ended early");
    }
    return ok;
  }

  Live MakeSession(int64_t index) {
    Live s;
    s.index = index;
    s.plan = plans_[static_cast<size_t>(index) % plans_.size()];
    const uint64_t seed = o_.run.seed;
    s.key = [seed, index](int64_t p) { return SessionTokenKey(seed, index, p); };
    s.verify = ShouldVerify(seed, index, o_.run.verify_fraction);
    return s;
  }

  // Create + prefill; records the prefill latency. False (and the sequence released) on error.
  bool Open(av1::SequenceService::Stub* stub, Live* s, Stats* st) {
    ++st->sessions;
    const auto t0 = Clock::now();
    if (!Create(stub, s->plan.reserve_tokens(), &s->id, st)) return false;
    if (!Prefill(stub, s, 0, st)) {
      ReleaseSeq(stub, s->id, st);
      return false;
    }
    st->prefill_us.Record(Micros(Clock::now() - t0));
    st->prefill_done_us.push_back(st->Since(Clock::now()));
    return true;
  }

  void Work(Stats* st) {
    auto stub = av1::SequenceService::NewStub(Channel());
    if (o_.workload == "mooncake") {
      for (int64_t i; (i = Claim()) >= 0;) Mooncake(stub.get(), i, st);
      return;
    }
    if (o_.decode_api == "batch") {
      WorkBatch(stub.get(), st);
      return;
    }
    for (int64_t i; (i = Claim()) >= 0;) {
      Live s = MakeSession(i);
      if (!Open(stub.get(), &s, st)) continue;
      const bool ok = Decode(stub.get(), &s, st);
      ReleaseSeq(stub.get(), s.id, st);
      if (ok) ++st->sessions_ok;
    }
  }

  // Groups of up to --batch-sessions sessions decoded in lockstep, one ExtendBatch per step and
  // layer holding every session still generating.
  void WorkBatch(av1::SequenceService::Stub* stub, Stats* st) {
    for (;;) {
      std::vector<Live> group;
      while (static_cast<int>(group.size()) < std::max(1, o_.batch_sessions)) {
        const int64_t i = Claim();
        if (i < 0) break;
        Live s = MakeSession(i);
        if (Open(stub, &s, st)) group.push_back(std::move(s));
      }
      if (group.empty()) return;
      int64_t max_gen = 0;
      for (const auto& s : group) max_gen = std::max(max_gen, s.plan.generated_tokens);
      for (int64_t step = 0; step < max_gen; ++step) {
        std::vector<Live*> active;
        for (auto& s : group) {
          if (!s.failed && step < s.plan.generated_tokens) active.push_back(&s);
        }
        if (active.empty()) break;
        if (Interrupt::Requested()) {
          for (Live* s : active) {
            s->failed = true;
            ++st->sessions_cut;
          }
          break;
        }
        const auto t0 = Clock::now();
        for (int layer = 0; layer < o_.layers; ++layer) {
          av1::ExtendBatchRequest req;
          std::vector<Live*> sent;
          for (Live* s : active) {
            if (s->failed) continue;
            BuildExtend(shape_, s->id, layer, DecodePosition(s->plan, step), 1, s->key,
                        req.add_steps());
            sent.push_back(s);
          }
          if (sent.empty()) break;
          grpc::ClientContext ctx;
          const Interrupt::ScopedCall cancellable(&ctx);
          Deadline(&ctx);
          av1::ExtendBatchResponse resp;
          const grpc::Status status = stub->ExtendBatch(&ctx, req, &resp);
          if (!status.ok() || resp.results_size() != static_cast<int>(sent.size())) {
            for (Live* s : sent) {
              s->failed = true;
              st->Error(status.ok() ? grpc::StatusCode::INTERNAL : status.error_code(),
                        "ExtendBatch",
                        status.ok() ? "wrong number of results" : status.error_message());
            }
            break;
          }
          for (size_t j = 0; j < sent.size(); ++j) {
            const av1::ExtendResult& r = resp.results(static_cast<int>(j));
            Live* s = sent[j];
            if (r.code() != 0) {
              s->failed = true;
              st->Error(static_cast<grpc::StatusCode>(r.code()), "ExtendBatch", r.message());
              continue;
            }
            st->Server(r.response());
            if (s->verify) {
              const int64_t position = DecodePosition(s->plan, step);
              st->Check(VerifyExtend(shape_, layer, position, 1, s->key, r.response()),
                        "sequence " + std::to_string(s->index) + " layer " +
                            std::to_string(layer) + " position " + std::to_string(position));
            }
          }
        }
        const auto done = Clock::now();
        const int64_t us = Micros(done - t0);
        for (Live* s : active) {
          if (s->failed) continue;
          st->step_us.Record(us);
          st->step_done_us.push_back(st->Since(done));
          ++st->decode_steps;
          if (step + 1 == s->plan.generated_tokens) st->decode_end_us.push_back(st->Since(done));
        }
      }
      for (auto& s : group) {
        ReleaseSeq(stub, s.id, st);
        if (!s.failed) ++st->sessions_ok;
      }
    }
  }

  void Mooncake(av1::SequenceService::Stub* stub, int64_t index, Stats* st) {
    const MooncakeRequest& req = requests_[static_cast<size_t>(index) % requests_.size()];
    Live s;
    s.index = index;
    s.plan.context_tokens = ScaleTokens(req.input_length, o_.scaling);
    s.plan.generated_tokens = ScaleGenerated(req.output_length, o_.gen_scale, o_.max_gen);
    const uint64_t seed = o_.run.seed;
    const double scale = o_.scaling.scale;
    const int64_t context = s.plan.context_tokens;
    const MooncakeRequest* r = &req;
    s.key = [seed, r, scale, context, index](int64_t p) {
      return MooncakeTokenKey(seed, *r, scale, context, index, p);
    };
    s.verify = ShouldVerify(seed, index, o_.run.verify_fraction);
    ++st->sessions;
    const auto t0 = Clock::now();
    int64_t fork_length = 0;
    if (auto match = cache_.Acquire(req.hash_ids)) {
      fork_length = ForkLength(match->shared_blocks, scale, match->context_tokens, context);
      if (fork_length > 0) {
        grpc::ClientContext ctx;
        const Interrupt::ScopedCall cancellable(&ctx);
        Deadline(&ctx);
        av1::ForkSequenceRequest freq;
        freq.set_sequence_id(match->sequence_id);
        freq.set_length(fork_length);
        av1::ForkSequenceResponse fresp;
        const grpc::Status status = stub->ForkSequence(&ctx, freq, &fresp);
        cache_.Release(match->sequence_id);
        if (!status.ok()) {
          st->Error(status.error_code(), "ForkSequence", status.error_message());
          return;
        }
        s.id = fresp.sequence().sequence_id();
        ++st->forks;
        st->tokens_saved += fork_length;
      } else {
        cache_.Release(match->sequence_id);
      }
    }
    if (s.id.empty() && !Create(stub, s.plan.reserve_tokens(), &s.id, st)) return;
    if (!Prefill(stub, &s, fork_length, st)) {
      ReleaseSeq(stub, s.id, st);
      return;
    }
    st->prefill_us.Record(Micros(Clock::now() - t0));
    st->prefill_done_us.push_back(st->Since(Clock::now()));
    if (!Decode(stub, &s, st)) {
      ReleaseSeq(stub, s.id, st);
      return;
    }
    ++st->sessions_ok;
    for (const auto& id : cache_.Insert(req.hash_ids, s.id, context)) {
      ++st->evictions;
      ReleaseSeq(stub, id, st);
    }
  }

  const SessionOptions& o_;
  const std::vector<SessionPlan>& plans_;
  const std::vector<MooncakeRequest>& requests_;
  const int64_t count_;
  const Shape shape_;
  PrefixCache cache_;
  Clock::time_point start_;
  std::atomic<int64_t> next_{0};
};

nlohmann::json LatencyJson(const LatencySummary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

std::string Fmt(double x, int precision = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, x);
  return buf;
}

std::string LatencyLine(const std::string& name, const LatencySummary& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-22s n=%-8lld p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  mean %.3f ms\n",
                name.c_str(), static_cast<long long>(s.count), s.p50, s.p90, s.p99, s.max, s.mean);
  return buf;
}

}  // namespace

SessionReport RunSessions(const SessionOptions& options, const std::vector<SessionPlan>& plans,
                          const std::vector<MooncakeRequest>& requests, int64_t count) {
  SessionRunner runner(options, plans, requests, count);
  return runner.Run();
}

std::string FormatSessionReport(const SessionReport& r) {
  std::ostringstream out;
  out << "target                 " << r.target << "\n"
      << "workload               " << r.workload << "\n"
      << "shape                  " << r.shape << " layers=" << r.layers << "\n"
      << "decode api             " << r.decode_api
      << (r.decode_api == "batch" ? " (up to " + std::to_string(r.batch_sessions) + " sessions)"
                                  : "")
      << "\n"
      << "concurrency            " << r.concurrency << "\n";
  if (!r.stop_reason.empty()) out << "stopped                " << r.stop_reason << "\n";
  if (!r.interrupted_by.empty()) {
    out << "INTERRUPTED            by " << r.interrupted_by << ": partial report; planned "
        << (r.planned >= 0 ? std::to_string(r.planned) + " sessions"
                           : std::string("open-ended (--duration)"))
        << ", completed " << r.sessions - r.sessions_cut << ", cut short " << r.sessions_cut
        << "\n";
  }
  out << "sessions               " << r.sessions << " (" << r.sessions_ok << " ok)\n"
      << "wall                   " << Fmt(r.wall_s) << " s\n"
      << "prefill tokens         " << r.prefill_tokens << "\n"
      << "decode steps           " << r.decode_steps << " (" << Fmt(r.decode_steps_per_s, 1)
      << " steps/s)\n";
  if (r.steady_window_s > 0) {
    out << "steady decode          " << r.steady_decode_steps << " steps in "
        << Fmt(r.steady_window_s, 3) << " s (" << Fmt(r.steady_decode_steps_per_s, 1)
        << " steps/s, all sessions decoding: after the last prefill, before the first "
           "session ended)\n";
  }
  out << LatencyLine("prefill latency", r.prefill_ms) << LatencyLine("decode step latency", r.step_ms);
  if (r.message_ms.count > 0) out << LatencyLine("stream message latency", r.message_ms);
  if (r.server_batch_size.count > 0) {
    out << "server batch size      mean " << Fmt(r.server_batch_size.mean, 2) << "  p50 "
        << Fmt(r.server_batch_size.p50, 0) << "  p99 " << Fmt(r.server_batch_size.p99, 0)
        << "  max " << Fmt(r.server_batch_size.max, 0)
        << " (sequence steps per launch, from ExecutionReport)\n";
    out << LatencyLine("server queue time", r.server_queue_ms)
        << LatencyLine("server time/step", r.server_total_ms);
  }
  if (r.server_batch_ms.count > 0) {
    out << LatencyLine("server batch wall", r.server_batch_ms)
        << LatencyLine("server batch kernels", r.server_batch_kernel_ms)
        << LatencyLine("server own time/batch", r.server_overhead_ms)
        << LatencyLine("  of which copies", r.server_copy_ms);
  }
  if (r.workload.rfind("mooncake", 0) == 0) {
    out << "forks                  " << r.forks << " (" << r.tokens_saved
        << " tokens per layer shared, " << r.prefix_evictions << " prefix-cache evictions)\n";
  }
  int64_t errors = 0;
  for (const auto& [code, n] : r.errors) errors += n;
  out << "errors                 " << errors << "\n";
  for (const auto& [code, n] : r.errors) {
    out << "  " << code << " x " << n << ": " << r.first_messages.at(code) << "\n";
  }
  out << "verified               " << r.verified << " outputs, " << r.mismatches
      << " mismatches (worst rel error " << r.worst_rel_error << ")\n";
  if (!r.first_mismatch.empty()) out << "  first mismatch: " << r.first_mismatch << "\n";
  if (r.kv_pages_used_after >= 0) {
    out << "kv pages used after    " << r.kv_pages_used_after << "\n";
  }
  return out.str();
}

nlohmann::json SessionReportToJson(const SessionReport& r) {
  nlohmann::json j;
  j["target"] = r.target;
  j["workload"] = r.workload;
  j["shape"] = r.shape;
  j["layers"] = r.layers;
  j["decode_api"] = r.decode_api;
  j["batch_sessions"] = r.batch_sessions;
  j["concurrency"] = r.concurrency;
  j["verify_fraction"] = r.verify_fraction;
  j["wall_s"] = r.wall_s;
  j["sessions"] = r.sessions;
  j["sessions_ok"] = r.sessions_ok;
  j["interrupted"] = !r.interrupted_by.empty();
  j["interrupted_by"] = r.interrupted_by;
  j["planned"] = r.planned;
  j["completed"] = r.sessions - r.sessions_cut;
  j["sessions_cut"] = r.sessions_cut;
  j["prefill_tokens"] = r.prefill_tokens;
  j["decode_steps"] = r.decode_steps;
  j["decode_steps_per_s"] = r.decode_steps_per_s;
  j["steady_window_s"] = r.steady_window_s;
  j["steady_decode_steps"] = r.steady_decode_steps;
  j["steady_decode_steps_per_s"] = r.steady_decode_steps_per_s;
  j["prefill_latency_ms"] = LatencyJson(r.prefill_ms);
  j["decode_step_latency_ms"] = LatencyJson(r.step_ms);
  j["stream_message_latency_ms"] = LatencyJson(r.message_ms);
  j["server_batch_size"] = LatencyJson(r.server_batch_size);
  j["server_queue_ms"] = LatencyJson(r.server_queue_ms);
  j["server_total_ms"] = LatencyJson(r.server_total_ms);
  j["server_batch_ms"] = LatencyJson(r.server_batch_ms);
  j["server_batch_kernel_ms"] = LatencyJson(r.server_batch_kernel_ms);
  j["server_overhead_ms"] = LatencyJson(r.server_overhead_ms);
  j["server_copy_ms"] = LatencyJson(r.server_copy_ms);
  j["errors"] = r.errors;
  j["first_error_messages"] = r.first_messages;
  j["verified"] = r.verified;
  j["mismatches"] = r.mismatches;
  j["worst_rel_error"] = r.worst_rel_error;
  j["first_mismatch"] = r.first_mismatch;
  j["forks"] = r.forks;
  j["tokens_saved"] = r.tokens_saved;
  j["prefix_evictions"] = r.prefix_evictions;
  if (r.kv_pages_used_after >= 0) j["kv_pages_used_after"] = r.kv_pages_used_after;
  if (!r.stop_reason.empty()) j["stop_reason"] = r.stop_reason;
  return j;
}

std::string SessionCsvHeader() {
  return "workload,decode_api,layers,concurrency,sessions,sessions_ok,errors,wall_s,"
         "prefill_tokens,decode_steps,decode_steps_per_s,prefill_p50_ms,prefill_p90_ms,"
         "prefill_p99_ms,step_p50_ms,step_p90_ms,step_p99_ms,message_p50_ms,message_p99_ms,"
         "verified,mismatches,forks,tokens_saved";
}

std::string SessionCsvRow(const SessionReport& r) {
  int64_t errors = 0;
  for (const auto& [code, n] : r.errors) errors += n;
  std::ostringstream o;
  o << CsvField(r.workload) << "," << r.decode_api << "," << r.layers << "," << r.concurrency
    << "," << r.sessions << "," << r.sessions_ok << "," << errors << "," << Fmt(r.wall_s) << ","
    << r.prefill_tokens << "," << r.decode_steps << "," << Fmt(r.decode_steps_per_s) << ","
    << Fmt(r.prefill_ms.p50) << "," << Fmt(r.prefill_ms.p90) << "," << Fmt(r.prefill_ms.p99)
    << "," << Fmt(r.step_ms.p50) << "," << Fmt(r.step_ms.p90) << "," << Fmt(r.step_ms.p99) << ","
    << Fmt(r.message_ms.p50) << "," << Fmt(r.message_ms.p99) << "," << r.verified << ","
    << r.mismatches << "," << r.forks << "," << r.tokens_saved;
  return o.str();
}

}  // namespace attn::loadgen
