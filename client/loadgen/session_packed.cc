// SessionRunner's packed decode APIs (issue 18): packed (one packed ExtendBatch per step and
// layer: one q, k and v tensor for the whole group, one o back) and packed-stream (the group
// split into --batches-in-flight micro-batches on one ExtendBatchStream, each micro-batch's next
// layer written as soon as its previous layer's reply arrives, so that many batches are in
// flight at once and the server's work overlaps the wire; replies are matched by tag).
// Message latency (message_us) is one call's or one stream message's write → reply, request
// building excluded; step_us is a whole decode step of the group through every layer. With
// --region host the tensors' bytes go through a leased shared-memory region (shm_region.h):
// the message latency then includes the client's copies of q, k, v into the region and of o
// out of it (what a frontend whose tensors live elsewhere pays).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loadgen/dtype_codec.h"
#include "loadgen/interrupt.h"
#include "loadgen/session_runner.h"
#include "loadgen/session_verify.h"

namespace attn::loadgen {

namespace av1 = attention::v1;
using Clock = SessionClock;

namespace {

void SetPackedTensor(av1::Tensor* t, av1::DType dtype, int64_t rows, int64_t heads, int64_t h,
                     std::string bytes) {
  t->set_dtype(dtype);
  t->add_shape(rows);
  t->add_shape(heads);
  t->add_shape(h);
  t->set_data(std::move(bytes));
}

// The tag of micro-batch `chunk` on `layer` in a packed stream.
uint64_t Tag(int layer, size_t chunk) { return (static_cast<uint64_t>(layer) << 32) | chunk; }

}  // namespace

void SessionRunner::BuildPacked(const std::vector<LiveSession*>& sessions, int layer,
                                int64_t step, av1::ExtendBatchRequest* req) const {
  req->Clear();
  av1::PackedExtendBatch* p = req->mutable_packed();
  p->set_layer(layer);
  std::string q, k, v;
  for (const LiveSession* s : sessions) {
    const int64_t position = DecodePosition(s->plan, step);
    av1::PackedStep* ps = p->add_steps();
    ps->set_sequence_id(s->id);
    ps->set_position(position);
    ps->set_query_tokens(1);
    q += TokenBytes(s->key, layer, 0, position, 1, shape_.n * shape_.h, shape_.dtype);
    k += TokenBytes(s->key, layer, 1, position, 1, shape_.k * shape_.h, shape_.dtype);
    v += TokenBytes(s->key, layer, 2, position, 1, shape_.k * shape_.h, shape_.dtype);
  }
  const auto rows = static_cast<int64_t>(sessions.size());
  SetPackedTensor(p->mutable_q(), shape_.dtype, rows, shape_.n, shape_.h, std::move(q));
  SetPackedTensor(p->mutable_k(), shape_.dtype, rows, shape_.k, shape_.h, std::move(k));
  SetPackedTensor(p->mutable_v(), shape_.dtype, rows, shape_.k, shape_.h, std::move(v));
}

void SessionRunner::StageInRegion(const GroupRegion& region, const std::vector<LiveSession*>& sent,
                                  av1::ExtendBatchRequest* req) {
  const PackedLayout& l = region.layout;
  const int64_t row0 = sent.front()->slot;
  const auto rows = static_cast<int64_t>(sent.size());
  av1::PackedExtendBatch* p = req->mutable_packed();
  struct Part {
    av1::Tensor* tensor;
    int64_t offset, row;
    av1::RegionSlice* slice;
  } parts[3] = {{p->mutable_q(), l.q, l.q_row, p->mutable_q_region()},
                {p->mutable_k(), l.k, l.kv_row, p->mutable_k_region()},
                {p->mutable_v(), l.v, l.kv_row, p->mutable_v_region()}};
  for (Part& part : parts) {
    const int64_t at = part.offset + row0 * part.row;
    std::memcpy(region.shm->data() + at, part.tensor->data().data(), part.tensor->data().size());
    region.shm->Slice(at, rows * part.row, part.slice);
    part.tensor->clear_data();
  }
  region.shm->Slice(l.o + row0 * l.q_row, rows * l.q_row, p->mutable_o_region());
}

void SessionRunner::TakeFromRegion(const GroupRegion& region, const std::vector<LiveSession*>& sent,
                                   av1::ExtendBatchResponse* resp) {
  if (resp->code() != 0 || resp->steps_size() != static_cast<int>(sent.size())) return;
  const PackedLayout& l = region.layout;
  const char* o = region.shm->data() + l.o + sent.front()->slot * l.q_row;
  resp->mutable_o()->set_data(o, static_cast<size_t>(l.q_row) * sent.size());
}

bool SessionRunner::TakePacked(const std::vector<LiveSession*>& sent, int layer, int64_t step,
                               const av1::ExtendBatchResponse& resp, const char* method,
                               SessionStats* st) {
  const int64_t row_bytes = shape_.n * shape_.h * DTypeSize(shape_.dtype);
  const bool sizes_ok =
      resp.code() == 0 && resp.steps_size() == static_cast<int>(sent.size()) &&
      static_cast<int64_t>(resp.o().data().size()) == row_bytes * static_cast<int64_t>(sent.size());
  if (!sizes_ok) {
    const auto code = resp.code() != 0 ? static_cast<grpc::StatusCode>(resp.code())
                                       : grpc::StatusCode::INTERNAL;
    const std::string msg = resp.code() != 0 ? resp.message() : "wrong number of results or o rows";
    for (LiveSession* s : sent) {
      s->failed = true;
      st->Error(code, method, msg);
    }
    return false;
  }
  st->Server(resp.report());
  for (size_t j = 0; j < sent.size(); ++j) {
    const av1::PackedStepResult& r = resp.steps(static_cast<int>(j));
    LiveSession* s = sent[j];
    if (r.code() != 0) {
      s->failed = true;
      st->Error(static_cast<grpc::StatusCode>(r.code()), method, r.message());
      continue;
    }
    if (!s->verify) continue;
    const int64_t position = DecodePosition(s->plan, step);
    av1::ExtendResponse one;  // this step's rows of o, in the per-step form VerifyExtend takes
    one.set_length(r.length());
    one.mutable_o()->set_dtype(resp.o().dtype());
    one.mutable_o()->set_data(resp.o().data().substr(j * static_cast<size_t>(row_bytes),
                                                     static_cast<size_t>(row_bytes)));
    st->Check(VerifyExtend(shape_, layer, position, 1, s->key, one, o_.run.tolerance),
              "sequence " + std::to_string(s->index) + " layer " + std::to_string(layer) +
                  " position " + std::to_string(position));
  }
  return true;
}

// --decode-api packed: one packed ExtendBatch per layer holding every session still going.
void SessionRunner::PackedStep(Stub* stub, std::vector<LiveSession*> active, int64_t step,
                               const GroupRegion* region, SessionStats* st) {
  const auto t0 = Clock::now();
  av1::ExtendBatchRequest req;
  for (int layer = 0; layer < o_.layers; ++layer) {
    std::vector<LiveSession*> sent;
    for (LiveSession* s : active) {
      if (!s->failed) sent.push_back(s);
    }
    if (sent.empty()) break;
    BuildPacked(sent, layer, step, &req);
    grpc::ClientContext ctx;
    const Interrupt::ScopedCall cancellable(&ctx);
    Deadline(&ctx);
    av1::ExtendBatchResponse resp;
    const auto w = Clock::now();
    if (region != nullptr) StageInRegion(*region, sent, &req);
    const grpc::Status status = stub->ExtendBatch(&ctx, req, &resp);
    if (status.ok() && region != nullptr) TakeFromRegion(*region, sent, &resp);
    st->message_us.Record(SessionMicros(Clock::now() - w));
    if (!status.ok()) {
      for (LiveSession* s : sent) {
        s->failed = true;
        st->Error(status.error_code(), "ExtendBatch", status.error_message());
      }
      break;
    }
    if (!TakePacked(sent, layer, step, resp, "ExtendBatch", st)) break;
  }
  FinishGroupStep(active, step, Clock::now() - t0, st);
}

// --decode-api packed-stream: one decode step of the group through every layer, the group split
// into up to --batches-in-flight micro-batches, all in flight on `stream` at once.
bool SessionRunner::PackedStreamStep(BatchStream* stream, std::vector<LiveSession*> active,
                                     int64_t step, const GroupRegion* region, SessionStats* st) {
  const auto t0 = Clock::now();
  std::vector<LiveSession*> live;
  for (LiveSession* s : active) {
    if (!s->failed) live.push_back(s);
  }
  const size_t chunks = std::min(live.size(), static_cast<size_t>(std::max(1, o_.batches_in_flight)));
  std::vector<std::vector<LiveSession*>> chunk(chunks);
  for (size_t i = 0; i < live.size(); ++i) chunk[i * chunks / live.size()].push_back(live[i]);
  std::map<uint64_t, SessionClock::time_point> written;  // tag → when it was written
  av1::ExtendBatchRequest req;
  auto send = [&](size_t c, int layer) {
    std::vector<LiveSession*> sent;
    for (LiveSession* s : chunk[c]) {
      if (!s->failed) sent.push_back(s);
    }
    chunk[c] = sent;
    if (sent.empty()) return true;
    BuildPacked(sent, layer, step, &req);
    req.set_tag(Tag(layer, c));
    written[req.tag()] = Clock::now();
    if (region != nullptr) StageInRegion(*region, sent, &req);
    return stream->Write(req);
  };
  bool ok = true;
  for (size_t c = 0; ok && c < chunks; ++c) ok = send(c, 0);
  av1::ExtendBatchResponse resp;
  while (ok && !written.empty()) {
    if (!stream->Read(&resp)) {
      ok = false;
      break;
    }
    const auto it = written.find(resp.tag());
    if (it == written.end()) {
      st->Error(grpc::StatusCode::INTERNAL, "ExtendBatchStream",
                "a reply with a tag that is not in flight");
      ok = false;
      break;
    }
    const int layer = static_cast<int>(resp.tag() >> 32);
    const auto c = static_cast<size_t>(resp.tag() & 0xffffffffu);
    if (region != nullptr) TakeFromRegion(*region, chunk[c], &resp);
    st->message_us.Record(SessionMicros(Clock::now() - it->second));
    written.erase(it);
    TakePacked(chunk[c], layer, step, resp, "ExtendBatchStream", st);
    if (layer + 1 < o_.layers) ok = send(c, layer + 1);
  }
  if (!ok) {
    for (LiveSession* s : live) s->failed = true;
  }
  FinishGroupStep(active, step, Clock::now() - t0, st);
  return ok;
}

// Records a finished decode step of the group for each session that is still going.
void SessionRunner::FinishGroupStep(const std::vector<LiveSession*>& active, int64_t step,
                                    SessionClock::duration took, SessionStats* st) {
  const auto done = Clock::now();
  const int64_t us = SessionMicros(took);
  for (LiveSession* s : active) {
    if (s->failed) continue;
    st->StepDone(us);
    st->step_done_us.push_back(st->Since(done));
    ++st->decode_steps;
    if (step + 1 == s->plan.generated_tokens) st->decode_end_us.push_back(st->Since(done));
  }
}

}  // namespace attn::loadgen
