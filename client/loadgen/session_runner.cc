// SessionRunner's run and sequence lifecycle: workers, channels and deadlines, claiming
// session indices, create / prefill / release, the mooncake replay with its prefix forks, and the
// --check-kv-released query at the end. The decode APIs are in session_decode.cc.
#include "loadgen/session_runner.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "attention/v1/attention.grpc.pb.h"
#include "loadgen/channel_security.h"
#include "loadgen/interrupt.h"
#include "loadgen/release_retry.h"
#include "loadgen/session_verify.h"
#include "loadgen/token_keys.h"
#include "loadgen/verify.h"

namespace attn::loadgen {

namespace av1 = attention::v1;
using Clock = SessionClock;

SessionRunner::SessionRunner(const SessionOptions& o, const std::vector<SessionPlan>& plans,
                             const std::vector<MooncakeRequest>& requests, int64_t count)
    : o_(o),
      plans_(plans),
      requests_(requests),
      count_(count),
      shape_{o.run.shape.heads, o.run.shape.kv_heads, o.run.shape.head_dim, o.run.shape.dtype},
      cache_(static_cast<size_t>(std::max<int64_t>(o.prefix_cache_sequences, 1))) {}

SessionReport SessionRunner::Run() {
  start_ = Clock::now();
  const double start_unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Once a second on stderr: decode steps done, their rate, p50/p99 and errors so far.
  Progress progress(o_.progress, stderr, "decode steps");
  std::vector<SessionStats> per(static_cast<size_t>(o_.run.concurrency));
  for (auto& p : per) {
    p.start = start_;
    p.progress = o_.progress ? &progress : nullptr;  // --quiet: no lock per step
  }
  progress.Start();
  std::vector<std::thread> threads;
  for (int w = 0; w < o_.run.concurrency; ++w) {
    threads.emplace_back([this, &per, w] { Work(&per[static_cast<size_t>(w)]); });
  }
  for (auto& t : threads) t.join();
  progress.Stop();
  SessionStats all;
  for (const auto& s : per) all.Merge(s);
  // Release what the prefix cache still holds.
  if (o_.workload == "mooncake") {
    auto stub = av1::SequenceService::NewStub(Channel());
    for (const auto& id : cache_.Drain()) ReleaseSeq(stub.get(), id, &all);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start_).count();
  SessionReport r;
  FillSessionReport(all, wall, &r);
  r.start_unix_s = start_unix_s;
  if (o_.check_kv_released) CheckKvReleased(&r);
  return r;
}

// --check-kv-released: the KV pages (GetServerInfo) and the live sequences (GetLoad) the server
// still holds, or why unknown.
void SessionRunner::CheckKvReleased(SessionReport* r) const {
  auto stub = av1::AttentionService::NewStub(Channel());
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(o_.run.deadline_ms);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  av1::GetServerInfoResponse info;
  grpc::Status st = stub->GetServerInfo(&ctx, av1::GetServerInfoRequest(), &info);
  if (st.ok()) {
    r->kv_pages_used_after = 0;
    for (const auto& c : info.kv_cache().classes()) r->kv_pages_used_after += c.pages_used();
    grpc::ClientContext load_ctx;
    load_ctx.set_deadline(deadline);
    av1::GetLoadResponse load;
    st = stub->GetLoad(&load_ctx, av1::GetLoadRequest(), &load);
    if (st.ok()) r->sequences_after = load.sequences();
  }
  if (!st.ok()) {
    r->stop_reason = "GetServerInfo/GetLoad failed: " + StatusCodeName(st.error_code()) + ": " +
                     st.error_message();
  }
}

std::shared_ptr<grpc::Channel> SessionRunner::Channel() const {
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
void SessionRunner::Deadline(grpc::ClientContext* ctx) const {
  ctx->set_deadline(Interrupt::CapDeadline(std::chrono::system_clock::now() +
                                           std::chrono::milliseconds(o_.run.deadline_ms)));
}

// True (and the session counted as cut) when SIGINT/SIGTERM arrived: the session stops at
// this step boundary.
bool SessionRunner::Cut(SessionStats* st) {
  if (!Interrupt::Requested()) return false;
  ++st->sessions_cut;
  return true;
}

// Claims the next session/request index, or -1 when the run is over.
int64_t SessionRunner::Claim() {
  if (Interrupt::Requested()) return -1;
  if (o_.run.duration_s > 0 &&
      std::chrono::duration<double>(Clock::now() - start_).count() >= o_.run.duration_s) {
    return -1;
  }
  const int64_t i = next_.fetch_add(1);
  return count_ >= 0 && i >= count_ ? -1 : i;
}

// Releases are cleanup, also after SIGINT/SIGTERM: never cancelled by the interrupt (that would
// leave the sequence's KV pages held on the server), retried on UNAVAILABLE (release_retry.h)
// within --deadline-ms, or within kReleaseAfterInterruptMs once interrupted. A release that
// still failed is counted (releases_failed) besides its error.
void SessionRunner::ReleaseSeq(Stub* stub, const std::string& id, SessionStats* st) {
  ReleaseRetryPolicy policy;
  policy.budget_ms = Interrupt::Requested()
                         ? std::min<int64_t>(o_.run.deadline_ms, kReleaseAfterInterruptMs)
                         : o_.run.deadline_ms;
  const ReleaseOutcome r = ReleaseWithRetry(stub, id, policy);
  st->release_retries += r.attempts - 1;
  if (r.status.ok()) return;
  ++st->releases_failed;
  st->Error(r.status.error_code(), "ReleaseSequence", r.status.error_message());
}

bool SessionRunner::Create(Stub* stub, int64_t reserve, std::string* id, SessionStats* st) {
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
bool SessionRunner::ExtendUnary(Stub* stub, LiveSession* s, int layer, int64_t position, int64_t t,
                                bool prefill, SessionStats* st) {
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
  st->Server(resp, prefill);
  if (s->verify) {
    st->Check(VerifyExtend(shape_, layer, position, t, s->key, resp, o_.run.tolerance),
              "sequence " + std::to_string(s->index) + " layer " + std::to_string(layer) +
                  " position " + std::to_string(position));
  }
  return true;
}

// Prefill [from, context) on every layer.
bool SessionRunner::Prefill(Stub* stub, LiveSession* s, int64_t from, SessionStats* st) {
  for (int layer = 0; layer < o_.layers; ++layer) {
    if (Cut(st)) return false;
    if (!ExtendUnary(stub, s, layer, from, s->plan.context_tokens - from, /*prefill=*/true, st)) {
      return false;
    }
  }
  st->prefill_tokens += s->plan.context_tokens - from;
  return true;
}

LiveSession SessionRunner::MakeSession(int64_t index) {
  LiveSession s;
  s.index = index;
  s.plan = plans_[static_cast<size_t>(index) % plans_.size()];
  const uint64_t seed = o_.run.seed;
  s.key = [seed, index](int64_t p) { return SessionTokenKey(seed, index, p); };
  s.verify = ShouldVerify(seed, index, o_.run.verify_fraction);
  return s;
}

// Create + prefill; records the prefill latency. False (and the sequence released) on error.
bool SessionRunner::Open(Stub* stub, LiveSession* s, SessionStats* st) {
  ++st->sessions;
  const auto t0 = Clock::now();
  if (!Create(stub, s->plan.reserve_tokens(), &s->id, st)) return false;
  if (!Prefill(stub, s, 0, st)) {
    ReleaseSeq(stub, s->id, st);
    return false;
  }
  st->prefill_us.Record(SessionMicros(Clock::now() - t0));
  st->prefill_done_us.push_back(st->Since(Clock::now()));
  return true;
}

void SessionRunner::Work(SessionStats* st) {
  auto stub = av1::SequenceService::NewStub(Channel());
  if (o_.workload == "mooncake") {
    for (int64_t i; (i = Claim()) >= 0;) Mooncake(stub.get(), i, st);
    return;
  }
  if (o_.decode_api == "batch" || o_.decode_api == "packed" || o_.decode_api == "packed-stream") {
    WorkBatch(stub.get(), st);
    return;
  }
  for (int64_t i; (i = Claim()) >= 0;) {
    LiveSession s = MakeSession(i);
    if (!Open(stub.get(), &s, st)) continue;
    const bool ok = Decode(stub.get(), &s, st);
    ReleaseSeq(stub.get(), s.id, st);
    if (ok) ++st->sessions_ok;
  }
}

// The prefix-cache entry sharing the most leading hash blocks with `req`, forked into `s->id`
// when it shares at least one token (`*fork_length` of them). False when ForkSequence failed
// (counted); true otherwise, `s->id` left empty when there was nothing to fork.
bool SessionRunner::Fork(Stub* stub, const MooncakeRequest& req, LiveSession* s,
                         int64_t* fork_length, SessionStats* st) {
  auto match = cache_.Acquire(req.hash_ids);
  if (!match) return true;
  *fork_length = ForkLength(match->shared_blocks, o_.scaling.scale, match->context_tokens,
                            s->plan.context_tokens);
  if (*fork_length <= 0) {
    cache_.Release(match->sequence_id);
    return true;
  }
  grpc::ClientContext ctx;
  const Interrupt::ScopedCall cancellable(&ctx);
  Deadline(&ctx);
  av1::ForkSequenceRequest freq;
  freq.set_sequence_id(match->sequence_id);
  freq.set_length(*fork_length);
  av1::ForkSequenceResponse fresp;
  const grpc::Status status = stub->ForkSequence(&ctx, freq, &fresp);
  cache_.Release(match->sequence_id);
  if (!status.ok()) {
    st->Error(status.error_code(), "ForkSequence", status.error_message());
    return false;
  }
  s->id = fresp.sequence().sequence_id();
  ++st->forks;
  st->tokens_saved += *fork_length;
  return true;
}

// One Mooncake request: fork the longest cached prefix (else create), prefill the rest, decode,
// then keep the sequence in the prefix cache (releasing what that evicts).
void SessionRunner::Mooncake(Stub* stub, int64_t index, SessionStats* st) {
  const MooncakeRequest& req = requests_[static_cast<size_t>(index) % requests_.size()];
  LiveSession s;
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
  if (!Fork(stub, req, &s, &fork_length, st)) return;
  if (s.id.empty() && !Create(stub, s.plan.reserve_tokens(), &s.id, st)) return;
  if (!Prefill(stub, &s, fork_length, st)) {
    ReleaseSeq(stub, s.id, st);
    return;
  }
  st->prefill_us.Record(SessionMicros(Clock::now() - t0));
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

}  // namespace attn::loadgen
