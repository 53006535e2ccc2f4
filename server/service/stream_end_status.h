// The statuses that end a SequenceService stream (ExtendStream, ExtendBatchStream) for reasons
// outside the stream's own messages: shutdown, a revoked token, the client gone. One text for
// both streams, so a client sees the same words whichever stream it had open.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>

namespace attn::stream_end {

/// UNAVAILABLE: the server drains (SIGTERM); the replica's sequences go with it.
inline grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "server is shutting down: this stream is closed; the sequences of this "
                      "replica go with it (open them on another replica)");
}

/// UNAUTHENTICATED: the stream's identity lost its last token (token file reloaded by SIGHUP).
inline grpc::Status Revoked() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "the token of this stream's identity was revoked (the token file was "
                      "reloaded without it): the stream is closed and the identity's sequences "
                      "were released");
}

/// What a client that cancelled, or whose deadline passed, sees: DEADLINE_EXCEEDED once the
/// call's deadline is past, else CANCELLED (also SharedMemoryLease's, whose shutdown and
/// revocation texts are its own).
inline grpc::Status ClientGone(const grpc::CallbackServerContext& context) {
  if (std::chrono::system_clock::now() >= context.deadline()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

}  // namespace attn::stream_end
