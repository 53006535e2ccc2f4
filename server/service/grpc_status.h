// The one conversion from the project's Status (attn/common/status.h) to a grpc::Status, used
// by every service when it finishes a call.
// Pure; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include "attn/common/status.h"
#include "common/client_text.h"

namespace attn {

/// A grpc::Status with the same code as `status` and its message capped by CapStatusMessage
/// (at most kMaxStatusMessageBytes, cut at a UTF-8 boundary); OK for an OK status.
inline grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      CapStatusMessage(status.message()));
}

}  // namespace attn
