// ReleaseWithRetry (client/loadgen/release_retry.h) against an in-process SequenceService whose
// ReleaseSequence answers a scripted list of statuses: UNAVAILABLE is retried a bounded number
// of times, other statuses are final, NOT_FOUND after a lost reply counts as released; the
// counts reach the report. No network (the channel is in-process), no timing asserted.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "attention/v1/sequence.grpc.pb.h"
#include "loadgen/release_retry.h"
#include "loadgen/session_report.h"
#include "loadgen/session_stats.h"

namespace attn::loadgen {
namespace {

namespace av1 = attention::v1;

// Answers each ReleaseSequence with the next scripted status (OK once the script is used up)
// and counts the calls.
class ScriptedRelease final : public av1::SequenceService::Service {
 public:
  explicit ScriptedRelease(std::deque<grpc::StatusCode> script) : script_(std::move(script)) {}
  grpc::Status ReleaseSequence(grpc::ServerContext*, const av1::ReleaseSequenceRequest* req,
                               av1::ReleaseSequenceResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    last_id_ = req->sequence_id();
    if (script_.empty()) return grpc::Status::OK;
    const grpc::StatusCode code = script_.front();
    script_.pop_front();
    return code == grpc::StatusCode::OK ? grpc::Status::OK : grpc::Status(code, "scripted");
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::string last_id() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_id_;
  }

 private:
  std::mutex mu_;
  std::deque<grpc::StatusCode> script_;
  int calls_ = 0;
  std::string last_id_;
};

// The scripted service on an in-process server, and a stub to it.
struct Harness {
  explicit Harness(std::deque<grpc::StatusCode> script) : service(std::move(script)) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = av1::SequenceService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  }
  ~Harness() { server->Shutdown(); }
  ScriptedRelease service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<av1::SequenceService::Stub> stub;
};

ReleaseRetryPolicy FastPolicy(int attempts) {
  ReleaseRetryPolicy p;
  p.max_attempts = attempts;
  p.first_backoff_ms = 1;
  p.budget_ms = 60000;
  return p;
}

using Code = grpc::StatusCode;

TEST(ReleaseRetry, UnavailableIsRetriedUntilTheReleaseSucceeds) {
  Harness h({Code::UNAVAILABLE, Code::UNAVAILABLE});
  const ReleaseOutcome r = ReleaseWithRetry(h.stub.get(), "seq-1", FastPolicy(4));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(h.service.calls(), 3);
  EXPECT_EQ(h.service.last_id(), "seq-1");
}

TEST(ReleaseRetry, TriesAreBoundedAndTheLastStatusIsReported) {
  Harness h({Code::UNAVAILABLE, Code::UNAVAILABLE, Code::UNAVAILABLE, Code::UNAVAILABLE,
             Code::UNAVAILABLE});
  const ReleaseOutcome r = ReleaseWithRetry(h.stub.get(), "seq-2", FastPolicy(3));
  EXPECT_EQ(r.status.error_code(), Code::UNAVAILABLE);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(h.service.calls(), 3);
}

TEST(ReleaseRetry, OtherErrorsAreFinal) {
  for (Code code : {Code::PERMISSION_DENIED, Code::INVALID_ARGUMENT, Code::NOT_FOUND}) {
    Harness h({code});
    const ReleaseOutcome r = ReleaseWithRetry(h.stub.get(), "seq-3", FastPolicy(4));
    EXPECT_EQ(r.status.error_code(), code);
    EXPECT_EQ(r.attempts, 1);
    EXPECT_EQ(h.service.calls(), 1);
  }
}

TEST(ReleaseRetry, NotFoundAfterAnUnavailableCountsAsReleased) {
  Harness h({Code::UNAVAILABLE, Code::NOT_FOUND});
  const ReleaseOutcome r = ReleaseWithRetry(h.stub.get(), "seq-4", FastPolicy(4));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.attempts, 2);
}

TEST(ReleaseRetry, NoRetryWhenTheWaitWouldPassTheBudget) {
  Harness h({Code::UNAVAILABLE, Code::UNAVAILABLE});
  ReleaseRetryPolicy p = FastPolicy(4);
  p.first_backoff_ms = 3600 * 1000;  // far past the budget: give up instead of waiting
  p.budget_ms = 60000;
  const ReleaseOutcome r = ReleaseWithRetry(h.stub.get(), "seq-5", p);
  EXPECT_EQ(r.status.error_code(), Code::UNAVAILABLE);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(h.service.calls(), 1);
}

// The counts reach the report: merged over workers, printed, and in the JSON.
TEST(ReleaseRetry, RetriesAndFailedReleasesAreReported) {
  SessionStats a, b;
  a.release_retries = 3;
  b.release_retries = 1;
  b.releases_failed = 1;
  a.Merge(b);
  SessionReport r;
  FillSessionReport(a, 1.0, &r);
  EXPECT_EQ(r.release_retries, 4);
  EXPECT_EQ(r.releases_failed, 1);
  EXPECT_NE(FormatSessionReport(r).find("releases failed        1 (after 4 retries"),
            std::string::npos);
  const nlohmann::json j = SessionReportToJson(r);
  EXPECT_EQ(j["release_retries"], 4);
  EXPECT_EQ(j["releases_failed"], 1);
  SessionReport clean;
  EXPECT_EQ(FormatSessionReport(clean).find("releases failed"), std::string::npos);
}

}  // namespace
}  // namespace attn::loadgen
