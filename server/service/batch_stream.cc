// SequenceServiceImpl's ExtendBatchStream (sequence.proto): batches in flight. Each message is
// one ExtendBatchRequest run through the unary ExtendBatch's path (RunExtendBatch, either form)
// and answered by one ExtendBatchResponse carrying its tag as soon as it completes, so answers
// may come out of order. A request-level error (what would fail a unary ExtendBatch, a message
// that does not parse, a request over the limits) is that response's code and message, and the
// stream goes on. At most --max-batches-in-flight requests of one stream are worked on at a
// time: a request counts from its read until its response is written, and the next message is
// read only while fewer are in flight. Writes are serialised: one outstanding, the others
// queued in completion order.
//
// The stream is raw (ByteBuffer in and out), like ExtendStream (sequence_stream.cc), so that a
// message that does not parse is answered instead of ending the stream, and a response that
// cannot be serialised is replaced by an INTERNAL one naming its tag.
//
// Ending: the client half-closing ends the stream OK once every request read is answered; a
// cancelled client, a failed write, shutdown (EndStreams: UNAVAILABLE) and a revoked token
// (UNAUTHENTICATED) stop the reads and end the stream once the requests in flight are done
// (their steps finish or are dropped; gRPC's Finish is never called while one still runs).
#include <spdlog/spdlog.h>

#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "service/sequence_service.h"
#include "service/stream_end_status.h"
#include "validation/sequence_validator.h"

namespace attn {

namespace pb = attention::v1;
using Clock = std::chrono::steady_clock;

// State under mu_: reading_ (a read is outstanding, or its message is still being parsed out of
// in_: a read started meanwhile, from OnWriteDone, would overwrite the buffer), writing_ (a
// write is outstanding; queued_ holds the serialised responses waiting for it), in_flight_
// (requests read and not yet written), half_closed_ (the client closed its side), end_ (the
// status the stream ends with once nothing is in flight: shutdown, revocation, cancellation, a
// failed write), finished_ (Finish was called; exactly once).
class SequenceServiceImpl::BatchStreamReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public internal::EndableStream {
 public:
  BatchStreamReactor(SequenceServiceImpl *service, grpc::CallbackServerContext *context)
      : service_(service), context_(context), max_in_flight_(service->max_batches_in_flight_) {
    service_->CallStarted();  // streams on existing sequences are served while draining
    std::optional<grpc::Status> end;
    if (grpc::Status admitted = service_->gate_->Admit(*context, nullptr, &owner_);
        !admitted.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        end = EndNow(admitted);
      }
      FinishNow(end);
      return;
    }
    {
      std::lock_guard<std::mutex> registry(service_->streams_mu_);
      service_->streams_.insert(this);
      registered_ = true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (service_->ending_streams_.load()) {
        end = EndNow(ShuttingDown());
      } else {
        MaybeRead();
      }
    }
    FinishNow(end);
  }

  void OnReadDone(bool ok) override {
    auto job = std::make_shared<Job>();
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // reading_ stays set while in_ is parsed (below): no read may reuse it before.
      if (finished_ || !ok) reading_ = false;
      if (finished_) return;
      if (!ok) {
        // The client closed its side (OK once everything read is answered), or cancelled.
        half_closed_ = true;
        if (context_->IsCancelled()) SetEnd(ClientGone());
        end = TakeEnd();
      } else {
        job->number = ++messages_;
        ++in_flight_;
      }
    }
    if (!ok) {
      FinishNow(end);
      return;
    }
    // Every message authenticates again: a token revoked by SIGHUP stops the stream here even
    // if RevokeIdentities has not reached it yet. The message is not run.
    std::string who;
    grpc::Status auth = service_->gate_->authenticator().Authenticate(*context_, &who);
    if (!auth.ok() || who != owner_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        reading_ = false;
        --in_flight_;
        SetEnd(auth.ok() ? Revoked() : auth);
        end = TakeEnd();
      }
      FinishNow(end);
      return;
    }
    const grpc::Status parsed =
        grpc::SerializationTraits<pb::ExtendBatchRequest>::Deserialize(&in_, &job->request);
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      MaybeRead();  // in_ is free again; the next message may come while this one runs
    }
    if (!parsed.ok()) {
      const std::string why = parsed.error_message().empty()
                                  ? std::string()
                                  : " (" + Utf8SafeEcho(parsed.error_message(), 256) + ")";
      Complete(job, InvalidArgument("message " + std::to_string(job->number) +
                                    " of this stream is not a valid attention.v1."
                                    "ExtendBatchRequest" + why +
                                    ": nothing of it was applied; the stream goes on with the "
                                    "next message"));
      return;
    }
    if (grpc::Status limit = service_->gate_->CheckRequest(job->request); !limit.ok()) {
      Complete(job, Status(static_cast<StatusCode>(limit.error_code()), limit.error_message()));
      return;
    }
    service_->RunExtendBatch(context_, owner_, metrics::Method::kExtendBatchStream,
                             &job->request, &job->response,
                             [this, job](const Status &s) { Complete(job, s); });
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      writing_buffer_.reset();
      --in_flight_;
      if (!ok) {
        in_flight_ -= static_cast<int64_t>(queued_.size());  // never written
        queued_.clear();
        write_failed_ = true;
        SetEnd(context_->IsCancelled()
                   ? ClientGone()
                   : grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
      } else {
        WriteNext();
        MaybeRead();
      }
      end = TakeEnd();
    }
    FinishNow(end);
  }
  void OnCancel() override { service_->steps_->Notify(); }
  void OnDone() override {
    if (registered_) {
      std::lock_guard<std::mutex> registry(service_->streams_mu_);
      service_->streams_.erase(this);
    }
    service_->CallDone();
    delete this;
  }
  void EndForShutdown() override {
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      SetEnd(ShuttingDown());
      end = TakeEnd();  // now when nothing is in flight (a read out completes with ok=false)
    }
    FinishNow(end);
  }
  bool EndIfOwnedBy(const std::string &identity) override {
    if (owner_ != identity) return false;  // owner_ is constant once registered
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      SetEnd(Revoked());
      end = TakeEnd();
    }
    FinishNow(end);
    return true;
  }

 private:
  /// One request read and its response (alive until the response is serialised).
  struct Job {
    int64_t number = 0;  // 1-based message number in this stream
    pb::ExtendBatchRequest request;
    pb::ExtendBatchResponse response;
  };

  static grpc::Status ShuttingDown() { return stream_end::ShuttingDown(); }
  static grpc::Status Revoked() { return stream_end::Revoked(); }
  grpc::Status ClientGone() const { return stream_end::ClientGone(*context_); }

  /// The request `job` ended with `s`: its response (request-level errors as code and message)
  /// is serialised and written, or queued behind the write outstanding.
  void Complete(const std::shared_ptr<Job> &job, const Status &s) {
    pb::ExtendBatchResponse &r = job->response;
    if (!s.ok()) {
      r.Clear();
      r.set_code(static_cast<int32_t>(s.code()));
      // A protobuf string must be valid UTF-8, or the client cannot parse this response.
      r.set_message(Utf8SafeEcho(s.message(), std::numeric_limits<size_t>::max()));
    }
    r.set_tag(job->request.tag());
    auto out = std::make_unique<grpc::ByteBuffer>();
    bool own = false;
    grpc::Status ser = grpc::SerializationTraits<pb::ExtendBatchResponse>::Serialize(r, out.get(),
                                                                                      &own);
    if (!ser.ok()) {
      pb::ExtendBatchResponse failed;
      failed.set_tag(job->request.tag());
      failed.set_code(static_cast<int32_t>(StatusCode::kInternal));
      failed.set_message("the response to message " + std::to_string(job->number) +
                         " could not be serialised (" + Utf8SafeEcho(ser.error_message(), 256) +
                         ")" + (s.ok() ? "; its steps ran (see GetSequence for the lengths)"
                                       : "; nothing of it was applied"));
      spdlog::error("ExtendBatchStream: {}", failed.message());
      out = std::make_unique<grpc::ByteBuffer>();
      grpc::SerializationTraits<pb::ExtendBatchResponse>::Serialize(failed, out.get(), &own);
    }
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!write_failed_ && !finished_) {
        queued_.push_back(std::move(out));
        WriteNext();
        return;
      }
      --in_flight_;
      end = TakeEnd();
    }
    FinishNow(end);
  }
  /// Starts the next queued write when none is outstanding. With mu_ held.
  void WriteNext() {
    if (writing_ || queued_.empty()) return;
    writing_ = true;
    writing_buffer_ = std::move(queued_.front());
    queued_.pop_front();
    StartWrite(writing_buffer_.get());
  }
  /// Reads the next message when the stream is open and fewer than max_in_flight_ requests are
  /// in flight. With mu_ held.
  void MaybeRead() {
    if (reading_ || finished_ || half_closed_ || end_.has_value()) return;
    if (in_flight_ >= max_in_flight_) return;  // OnWriteDone reads on when one is answered
    reading_ = true;
    StartRead(&in_);
  }
  /// Remembers the first reason to end the stream (no more reads from now). With mu_ held.
  void SetEnd(const grpc::Status &st) {
    if (!end_.has_value()) end_ = st;
  }
  /// The status to finish with when the stream should end now (a reason, or the client's
  /// half-close, and nothing in flight); marks it finished. With mu_ held.
  std::optional<grpc::Status> TakeEnd() {
    if (finished_ || in_flight_ > 0) return std::nullopt;
    if (!end_.has_value() && !half_closed_) return std::nullopt;
    finished_ = true;
    return end_.has_value() ? *end_ : grpc::Status::OK;
  }
  /// Finishes the stream with `st` when set (TakeEnd's) and counts it; without mu_ held (the
  /// reactor may be deleted as soon as Finish is called: nothing of it is touched after).
  void FinishNow(const std::optional<grpc::Status> &st) {
    if (!st.has_value()) return;
    SequenceServiceImpl *service = service_;
    const Clock::time_point start = start_;
    const grpc::Status copy = *st;
    Finish(copy);
    service->Observe(metrics::Method::kExtendBatchStream,
                     static_cast<StatusCode>(copy.error_code()), start);
  }
  /// Finishes at once (admission refused, shutting down before the first read). With mu_ held.
  std::optional<grpc::Status> EndNow(const grpc::Status &st) {
    finished_ = true;
    return st;
  }

  SequenceServiceImpl *service_;
  grpc::CallbackServerContext *const context_;
  const int64_t max_in_flight_;
  const Clock::time_point start_ = Clock::now();
  std::string owner_;  // set once in the constructor
  grpc::ByteBuffer in_;
  std::mutex mu_;
  int64_t messages_ = 0;
  int64_t in_flight_ = 0;
  std::deque<std::unique_ptr<grpc::ByteBuffer>> queued_;
  std::unique_ptr<grpc::ByteBuffer> writing_buffer_;
  std::optional<grpc::Status> end_;
  bool reading_ = false, writing_ = false, half_closed_ = false, finished_ = false;
  bool write_failed_ = false;
  bool registered_ = false;  // in service_->streams_ (set in the constructor only)
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> *
SequenceServiceImpl::ExtendBatchStream(grpc::CallbackServerContext *context) {
  return new BatchStreamReactor(this, context);
}

}  // namespace attn
