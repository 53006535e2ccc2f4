// SequenceServiceImpl's ExtendStream (sequence.proto): the stream reactor, and ending streams
// for shutdown (EndStreams) and for revoked identities (RevokeIdentities).
//
// The stream is registered raw (ByteBuffer in and out, sequence_service.h) so that this file
// parses each message and serialises each result itself: gRPC's typed reader reports a message
// that fails to parse exactly like the client half-closing (the stream ended OK and the valid
// messages after it never ran), and a result gRPC failed to serialise would be lost although
// its step was applied.
#include <spdlog/spdlog.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "service/extend_response.h"
#include "service/sequence_service.h"
#include "service/stream_end_status.h"
#include "validation/sequence_validator.h"

namespace attn {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;

// One stream: read a message, parse it, run its step in the step batcher, write its result,
// read the next. State under mu_: reading_ (a read is outstanding), finished_ (Finish was
// called; it is called exactly once), ending_ (EndStreams: finish instead of reading the next
// message), revoked_ (RevokeIdentities: likewise, with UNAUTHENTICATED).
class SequenceServiceImpl::StreamReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public internal::EndableStream {
 public:
  StreamReactor(SequenceServiceImpl *service, grpc::CallbackServerContext *context)
      : service_(service), context_(context) {
    service_->CallStarted();  // streams on existing sequences are served while draining
    if (grpc::Status admitted = service_->gate_->Admit(*context, nullptr, &owner_);
        !admitted.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      End(admitted);
      return;
    }
    {
      std::lock_guard<std::mutex> registry(service_->streams_mu_);
      service_->streams_.insert(this);
      registered_ = true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (service_->ending_streams_.load()) {
      End(ShuttingDown());
      return;
    }
    reading_ = true;
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      if (finished_) return;  // ended by EndStreams/RevokeIdentities while the read was out
      if (!ok) {
        // The client closed its side (OK), or cancelled or vanished: count what it saw.
        End(context_->IsCancelled() ? ClientGone() : grpc::Status::OK);
        return;
      }
    }
    ++messages_;
    result_.Clear();
    // Every message authenticates again: a token revoked by SIGHUP stops the stream here even
    // if RevokeIdentities has not reached it yet.
    std::string who;
    grpc::Status auth = service_->gate_->authenticator().Authenticate(*context_, &who);
    if (!auth.ok() || who != owner_) {
      std::lock_guard<std::mutex> lock(mu_);
      End(auth.ok() ? Revoked() : auth);
      return;
    }
    request_.Clear();
    if (grpc::Status parsed =
            grpc::SerializationTraits<pb::ExtendRequest>::Deserialize(&in_, &request_);
        !parsed.ok()) {
      // grpc's parser usually gives no reason: then the message says none, not "()".
      const std::string why = parsed.error_message().empty()
                                  ? std::string()
                                  : " (" + Utf8SafeEcho(parsed.error_message(), 256) + ")";
      SetResult(InvalidArgument(
          "message " + std::to_string(messages_) +
          " of this stream is not a valid attention.v1.ExtendRequest" + why +
          ": nothing of it was applied; the stream goes on with the next message"));
      Write();
      return;
    }
    if (grpc::Status limit = service_->gate_->CheckRequest(request_); !limit.ok()) {
      SetResult(Status(static_cast<StatusCode>(limit.error_code()), limit.error_message()));
      Write();
      return;
    }
    // Continuous batching: the step joins steps of other streams and calls.
    auto args = service_->ValidateStep(request_);
    if (!args.ok()) {
      SetResult(args.status());
      Write();
      return;
    }
    if (Status w = service_->CheckWork(StepScorePairs(*args), args->q_shape[2]); !w.ok()) {
      SetResult(w);
      Write();
      return;
    }
    std::vector<StepRequest> steps;
    steps.push_back(NewStep(context_, owner_, std::move(*args)));
    steps[0].done = [this, received = steps[0].received](StepResult &&r) {
      if (r.status.ok()) {
        FillExtendResponse(r, service_->backend_->name(), service_->backend_->device(), received,
                           result_.mutable_response());
      }
      SetResult(r.status);
      Write();
    };
    service_->InstrumentStep(metrics::Method::kExtendStream, &steps[0]);
    if (Status s = service_->steps_->Enqueue(&steps); !s.ok()) {
      SetResult(s);
      Write();
    }
  }
  void OnCancel() override { service_->steps_->Notify(); }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      End(context_->IsCancelled()
              ? ClientGone()
              : grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
      return;
    }
    if (ending_) {
      End(ShuttingDown());
      return;
    }
    if (revoked_) {
      End(Revoked());
      return;
    }
    reading_ = true;
    StartRead(&in_);
  }
  void OnDone() override {
    if (registered_) {
      std::lock_guard<std::mutex> registry(service_->streams_mu_);
      service_->streams_.erase(this);
    }
    service_->CallDone();
    delete this;
  }
  /// EndStreams: finish now when waiting for a message, else after the current step's write.
  /// Called with the service's streams_mu_ held (so this reactor outlives the call).
  void EndForShutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    ending_ = true;
    if (reading_) End(ShuttingDown());  // the outstanding read completes with ok=false
  }
  /// RevokeIdentities: as EndForShutdown with UNAUTHENTICATED when the stream is `identity`'s;
  /// true when it is. Called with the service's streams_mu_ held.
  bool EndIfOwnedBy(const std::string &identity) override {
    if (owner_ != identity) return false;  // owner_ is constant once registered
    std::lock_guard<std::mutex> lock(mu_);
    revoked_ = true;
    if (reading_) End(Revoked());
    return true;
  }

 private:
  static grpc::Status ShuttingDown() { return stream_end::ShuttingDown(); }
  static grpc::Status Revoked() { return stream_end::Revoked(); }
  grpc::Status ClientGone() const { return stream_end::ClientGone(*context_); }
  /// Finishes the stream once and counts it (one ExtendStream observation per stream). Called
  /// with mu_ held.
  void End(const grpc::Status &st) {
    if (finished_) return;
    finished_ = true;
    Finish(st);
    service_->Observe(metrics::Method::kExtendStream, static_cast<StatusCode>(st.error_code()),
                      start_);
  }
  void SetResult(const Status &s) {
    if (s.ok()) return;
    result_.clear_response();
    result_.set_code(static_cast<int32_t>(s.code()));
    // A protobuf string must be valid UTF-8, or the client cannot parse this result.
    result_.set_message(Utf8SafeEcho(s.message(), std::numeric_limits<size_t>::max()));
  }
  /// Serialises result_ and writes it. A result that cannot be serialised is replaced by an
  /// INTERNAL result saying whether its step was applied (and the layer's length then), so an
  /// applied step is never answered with nothing.
  void Write() {
    out_.Clear();
    bool own = false;
    grpc::Status s = grpc::SerializationTraits<pb::ExtendResult>::Serialize(result_, &out_, &own);
    if (!s.ok()) {
      pb::ExtendResult failed;
      failed.set_code(static_cast<int32_t>(StatusCode::kInternal));
      failed.set_message("the result of message " + std::to_string(messages_) +
                         " could not be serialised (" + Utf8SafeEcho(s.error_message(), 256) + ")" +
                         (result_.code() == 0 ? "; its step was applied: layer length now " +
                                                    std::to_string(result_.response().length())
                                              : "; its step was not applied"));
      spdlog::error("ExtendStream: {}", failed.message());
      out_.Clear();
      grpc::SerializationTraits<pb::ExtendResult>::Serialize(failed, &out_, &own);
    }
    StartWrite(&out_);
  }

  SequenceServiceImpl *service_;
  grpc::CallbackServerContext *const context_;
  const Clock::time_point start_ = Clock::now();
  std::string owner_;  // set once in the constructor
  grpc::ByteBuffer in_, out_;
  int64_t messages_ = 0;  // messages read so far (1-based number of the current one)
  pb::ExtendRequest request_;
  pb::ExtendResult result_;
  std::mutex mu_;
  bool reading_ = false, finished_ = false, ending_ = false, revoked_ = false;
  bool registered_ = false;  // in service_->streams_ (set in the constructor only)
};

void SequenceServiceImpl::EndStreams() {
  {
    std::lock_guard<std::mutex> registry(streams_mu_);
    ending_streams_.store(true);
    for (internal::EndableStream *stream : streams_) stream->EndForShutdown();
  }
  EndLeases();
}

int64_t SequenceServiceImpl::RevokeIdentities(const std::vector<std::string> &identities) {
  int64_t released_total = 0;
  for (const std::string &identity : identities) {
    // Sequences first, then the streams: a client that sees its stream end UNAUTHENTICATED
    // finds its sequences already released (in the other order a GetServerInfo right after
    // the stream's end could still count them).
    int64_t pages = 0;
    const int64_t released = store_->ReleaseOwner(identity, &pages);
    released_total += released;
    const int64_t leases = RevokeLeases(identity);
    int64_t streams = 0;
    {
      std::lock_guard<std::mutex> registry(streams_mu_);
      for (internal::EndableStream *stream : streams_) {
        streams += stream->EndIfOwnedBy(identity) ? 1 : 0;
      }
    }
    spdlog::warn(
        "token revoked: identity \"{}\" has no token left; {} open streams and {} "
        "shared-memory leases ended (UNAUTHENTICATED), {} sequences released ({} KV pages "
        "freed)",
        identity, streams, leases, released, pages);
  }
  return released_total;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> *SequenceServiceImpl::ExtendStream(
    grpc::CallbackServerContext *context) {
  return new StreamReactor(this, context);
}

}  // namespace attn
