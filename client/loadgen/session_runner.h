// SessionRunner: runs a session or mooncake workload (session_workload.h) on --concurrency
// workers, each with its own channel and SessionStats. session_runner.cc holds the run, the
// sequence lifecycle (create, prefill, release, fork) and the mooncake replay;
// session_decode.cc the per-step decode APIs (Extend, ExtendStream, ExtendBatch);
// session_packed.cc the packed ones (packed ExtendBatch, ExtendBatchStream).
// Internal to attn_loadgen: callers use RunSessions.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/v1/sequence.grpc.pb.h"
#include "loadgen/prefix_cache.h"
#include "loadgen/session_requests.h"
#include "loadgen/session_stats.h"
#include "loadgen/session_workload.h"
#include "loadgen/shm_region.h"

namespace attn::loadgen {

/// One live sequence of a worker.
struct LiveSession {
  int64_t index = 0;
  std::string id;
  SessionPlan plan;
  TokenKeyFn key;
  bool verify = false;
  bool failed = false;
  int64_t slot = 0;  ///< grouped APIs: the session's row in its group (ShmRegion's layout)
};

/// --region host: a group's leased region and its layout (null region: bytes in the message).
struct GroupRegion {
  std::unique_ptr<ShmRegion> shm;
  PackedLayout layout;
};

/// After SIGINT/SIGTERM, the deadline of each ReleaseSequence (see SessionRunner::ReleaseSeq).
inline constexpr int64_t kReleaseAfterInterruptMs = 1000;

/// One run; not reusable. The references must outlive it.
class SessionRunner {
 public:
  SessionRunner(const SessionOptions& o, const std::vector<SessionPlan>& plans,
                const std::vector<MooncakeRequest>& requests, int64_t count);

  /// Runs every worker to the end (count, duration or SIGINT/SIGTERM) and reports.
  SessionReport Run();

 private:
  using Stub = attention::v1::SequenceService::Stub;
  using BatchStream = grpc::ClientReaderWriter<attention::v1::ExtendBatchRequest,
                                               attention::v1::ExtendBatchResponse>;

  // --- session_runner.cc: the run and the sequence lifecycle.
  std::shared_ptr<grpc::Channel> Channel() const;
  void Deadline(grpc::ClientContext* ctx) const;
  static bool Cut(SessionStats* st);
  int64_t Claim();
  void CheckKvReleased(SessionReport* r) const;
  void ReleaseSeq(Stub* stub, const std::string& id, SessionStats* st);
  bool Create(Stub* stub, int64_t reserve, std::string* id, SessionStats* st);
  bool ExtendUnary(Stub* stub, LiveSession* s, int layer, int64_t position, int64_t t, bool prefill,
                   SessionStats* st);
  bool Prefill(Stub* stub, LiveSession* s, int64_t from, SessionStats* st);
  LiveSession MakeSession(int64_t index);
  bool Open(Stub* stub, LiveSession* s, SessionStats* st);
  void Work(SessionStats* st);
  void Mooncake(Stub* stub, int64_t index, SessionStats* st);
  bool Fork(Stub* stub, const MooncakeRequest& req, LiveSession* s, int64_t* fork_length,
            SessionStats* st);

  // --- session_decode.cc: the decode APIs.
  bool Decode(Stub* stub, LiveSession* s, SessionStats* st);
  bool DecodeStream(Stub* stub, LiveSession* s, SessionStats* st);
  void WorkBatch(Stub* stub, SessionStats* st);
  std::vector<LiveSession> OpenGroup(Stub* stub, SessionStats* st);
  void BatchStep(Stub* stub, std::vector<LiveSession*> active, int64_t step, SessionStats* st);
  /// One group decode step over `stream` (packed-stream); false when the stream broke.
  bool GroupStep(Stub* stub, BatchStream* stream, std::vector<LiveSession*> active, int64_t step,
                 const GroupRegion* region, SessionStats* st);

  // --- session_packed.cc: the packed decode APIs (packed, packed-stream).
  /// `req` := the packed ExtendBatch of one decode step of `sessions` on `layer`.
  void BuildPacked(const std::vector<LiveSession*>& sessions, int layer, int64_t step,
                   attention::v1::ExtendBatchRequest* req) const;
  /// Takes a packed reply for `sent`: per-step errors, the batch's report, verification.
  /// False (every session of `sent` failed) when the reply itself is an error or malformed.
  bool TakePacked(const std::vector<LiveSession*>& sent, int layer, int64_t step,
                  const attention::v1::ExtendBatchResponse& resp, const char* method,
                  SessionStats* st);
  /// --region host: moves `req`'s q, k and v bytes into the rows of `region` that start at
  /// `sent`'s first session's slot and names them (and o's rows) in the request.
  static void StageInRegion(const GroupRegion& region, const std::vector<LiveSession*>& sent,
                            attention::v1::ExtendBatchRequest* req);
  /// --region host: copies a packed reply's o rows out of the region into resp->o().data().
  static void TakeFromRegion(const GroupRegion& region, const std::vector<LiveSession*>& sent,
                             attention::v1::ExtendBatchResponse* resp);
  /// `region`: null, or the group's leased region (--region host).
  void PackedStep(Stub* stub, std::vector<LiveSession*> active, int64_t step,
                  const GroupRegion* region, SessionStats* st);
  bool PackedStreamStep(BatchStream* stream, std::vector<LiveSession*> active, int64_t step,
                        const GroupRegion* region, SessionStats* st);
  void FinishGroupStep(const std::vector<LiveSession*>& active, int64_t step,
                       SessionClock::duration took, SessionStats* st);

  const SessionOptions& o_;
  const std::vector<SessionPlan>& plans_;
  const std::vector<MooncakeRequest>& requests_;
  const int64_t count_;
  const SessionShape shape_;
  PrefixCache cache_;
  SessionClock::time_point start_;
  std::atomic<int64_t> next_{0};
};

}  // namespace attn::loadgen
