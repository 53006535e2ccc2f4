// SessionRunner's per-step decode APIs (--decode-api): extend (one unary Extend per token and
// layer), stream (one ExtendStream per session, per-message latency) and batch (groups of up to
// --batch-sessions sessions decoded in lockstep, one ExtendBatch per step and layer, a
// sub-message per step); the group loop also runs the packed APIs (session_packed.cc).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "loadgen/dtype_codec.h"
#include "loadgen/interrupt.h"
#include "loadgen/session_runner.h"
#include "loadgen/session_verify.h"

namespace attn::loadgen {

namespace av1 = attention::v1;
using Clock = SessionClock;

// Decodes every generated token of one session through Extend or ExtendStream.
bool SessionRunner::Decode(Stub* stub, LiveSession* s, SessionStats* st) {
  if (s->plan.generated_tokens == 0) return true;
  if (o_.decode_api == "stream") return DecodeStream(stub, s, st);
  for (int64_t step = 0; step < s->plan.generated_tokens; ++step) {
    if (Cut(st)) return false;
    const auto t0 = Clock::now();
    for (int layer = 0; layer < o_.layers; ++layer) {
      if (!ExtendUnary(stub, s, layer, DecodePosition(s->plan, step), 1, /*prefill=*/false, st)) {
        return false;
      }
    }
    st->StepDone(SessionMicros(Clock::now() - t0));
    st->step_done_us.push_back(st->Since(Clock::now()));
    ++st->decode_steps;
  }
  st->decode_end_us.push_back(st->Since(Clock::now()));
  return true;
}

// Decodes every generated token of one session on one ExtendStream: one message per layer and
// step, each written and its result read before the next.
bool SessionRunner::DecodeStream(Stub* stub, LiveSession* s, SessionStats* st) {
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
      st->message_us.Record(SessionMicros(Clock::now() - w));
      if (result.code() != 0) {
        st->Error(static_cast<grpc::StatusCode>(result.code()), "ExtendStream", result.message());
        recorded = true;
        ok = false;
        break;
      }
      st->Server(result.response());
      if (s->verify) {
        st->Check(
            VerifyExtend(shape_, layer, position, 1, s->key, result.response(), o_.run.tolerance),
            "sequence " + std::to_string(s->index) + " layer " + std::to_string(layer) +
                " position " + std::to_string(position));
      }
    }
    if (ok) {
      st->StepDone(SessionMicros(Clock::now() - t0));
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

// Claims and opens (create + prefill) up to --batch-sessions sessions; empty when the run is
// over.
std::vector<LiveSession> SessionRunner::OpenGroup(Stub* stub, SessionStats* st) {
  std::vector<LiveSession> group;
  while (static_cast<int>(group.size()) < std::max(1, o_.batch_sessions)) {
    const int64_t i = Claim();
    if (i < 0) break;
    LiveSession s = MakeSession(i);
    if (Open(stub, &s, st)) group.push_back(std::move(s));
  }
  return group;
}

// Groups of up to --batch-sessions sessions decoded in lockstep, one ExtendBatch (per-step or
// packed) per step and layer holding every session still generating, or (packed-stream) one
// ExtendBatchStream per group carrying every step's micro-batches.
void SessionRunner::WorkBatch(Stub* stub, SessionStats* st) {
  for (;;) {
    std::vector<LiveSession> group = OpenGroup(stub, st);
    if (group.empty()) return;
    int64_t max_gen = 0;
    for (const auto& s : group) max_gen = std::max(max_gen, s.plan.generated_tokens);
    grpc::ClientContext ctx;
    const Interrupt::ScopedCall cancellable(&ctx);
    Deadline(&ctx);
    std::unique_ptr<BatchStream> stream;
    if (o_.decode_api == "packed-stream" && max_gen > 0) stream = stub->ExtendBatchStream(&ctx);
    GroupRegion region;
    const bool packed = o_.decode_api == "packed" || o_.decode_api == "packed-stream";
    if (packed && o_.region == "host" && max_gen > 0) {
      for (size_t i = 0; i < group.size(); ++i) group[i].slot = static_cast<int64_t>(i);
      region.layout = PackedLayout::For(static_cast<int64_t>(group.size()), shape_.n, shape_.k,
                                        shape_.h, DTypeSize(shape_.dtype));
      std::string error;
      grpc::StatusCode code = grpc::StatusCode::OK;
      region.shm =
          ShmRegion::Create(stub, region.layout.bytes, o_.run.connect_timeout_ms, &code, &error);
      if (!region.shm) {
        st->Error(code, "SharedMemoryLease", error);
        for (auto& s : group) s.failed = true;
      }
    }
    for (int64_t step = 0; step < max_gen; ++step) {
      std::vector<LiveSession*> active;
      for (auto& s : group) {
        if (!s.failed && step < s.plan.generated_tokens) active.push_back(&s);
      }
      if (active.empty()) break;
      if (Interrupt::Requested()) {
        for (LiveSession* s : active) {
          s->failed = true;
          ++st->sessions_cut;
        }
        break;
      }
      if (!GroupStep(stub, stream.get(), std::move(active), step,
                     region.shm ? &region : nullptr, st)) {
        break;
      }
    }
    if (stream) {
      stream->WritesDone();
      const grpc::Status status = stream->Finish();
      if (!status.ok() && !Interrupt::Requested()) {
        st->Error(status.error_code(), "ExtendBatchStream", status.error_message());
      }
    }
    for (auto& s : group) {
      ReleaseSeq(stub, s.id, st);
      if (!s.failed) ++st->sessions_ok;
    }
  }
}

bool SessionRunner::GroupStep(Stub* stub, BatchStream* stream, std::vector<LiveSession*> active,
                              int64_t step, const GroupRegion* region, SessionStats* st) {
  if (stream != nullptr) return PackedStreamStep(stream, std::move(active), step, region, st);
  if (o_.decode_api == "packed") {
    PackedStep(stub, std::move(active), step, region, st);
  } else {
    BatchStep(stub, std::move(active), step, st);
  }
  return true;
}

// Decode step `step` of every session in `active` through every layer, one ExtendBatch per
// layer; a session whose step failed is marked failed and left out of the later layers.
void SessionRunner::BatchStep(Stub* stub, std::vector<LiveSession*> active, int64_t step,
                              SessionStats* st) {
  const auto t0 = Clock::now();
  for (int layer = 0; layer < o_.layers; ++layer) {
    av1::ExtendBatchRequest req;
    std::vector<LiveSession*> sent;
    for (LiveSession* s : active) {
      if (s->failed) continue;
      BuildExtend(shape_, s->id, layer, DecodePosition(s->plan, step), 1, s->key, req.add_steps());
      sent.push_back(s);
    }
    if (sent.empty()) break;
    grpc::ClientContext ctx;
    const Interrupt::ScopedCall cancellable(&ctx);
    Deadline(&ctx);
    av1::ExtendBatchResponse resp;
    const grpc::Status status = stub->ExtendBatch(&ctx, req, &resp);
    if (!status.ok() || resp.results_size() != static_cast<int>(sent.size())) {
      for (LiveSession* s : sent) {
        s->failed = true;
        st->Error(status.ok() ? grpc::StatusCode::INTERNAL : status.error_code(), "ExtendBatch",
                  status.ok() ? "wrong number of results" : status.error_message());
      }
      break;
    }
    for (size_t j = 0; j < sent.size(); ++j) {
      const av1::ExtendResult& r = resp.results(static_cast<int>(j));
      LiveSession* s = sent[j];
      if (r.code() != 0) {
        s->failed = true;
        st->Error(static_cast<grpc::StatusCode>(r.code()), "ExtendBatch", r.message());
        continue;
      }
      st->Server(r.response());
      if (s->verify) {
        const int64_t position = DecodePosition(s->plan, step);
        st->Check(VerifyExtend(shape_, layer, position, 1, s->key, r.response(), o_.run.tolerance),
                  "sequence " + std::to_string(s->index) + " layer " + std::to_string(layer) +
                      " position " + std::to_string(position));
      }
    }
  }
  FinishGroupStep(active, step, Clock::now() - t0, st);
}

}  // namespace attn::loadgen
