// The checks every RPC of attention.v1 passes before it runs, in one place:
// authentication (Authenticator: UNAUTHENTICATED, else the caller's identity)
// and the per-request tensor element limit (RESOURCE_EXHAUSTED). Handlers call
// Admit first thing and finish the call with its status when it is not OK;
// grpc.health.v1 (served by gRPC itself) never passes through here.
// Thread-safety: all methods are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include "security/authenticator.h"

namespace attn::security {

class CallGate {
 public:
  /// No authentication and no element limit.
  CallGate() : CallGate(std::make_shared<Authenticator>(), 0) {}
  /// `max_tensor_elements`: 0 = unlimited.
  CallGate(std::shared_ptr<const Authenticator> authenticator, int64_t max_tensor_elements)
      : auth_(std::move(authenticator)), max_tensor_elements_(max_tensor_elements) {}

  /// Authenticates the call into *identity and checks `request` (nullable: a
  /// stream before its first message) against the element limit.
  grpc::Status Admit(const grpc::ServerContextBase& context,
                     const google::protobuf::Message* request, std::string* identity) const;
  /// The element limit alone (each message of a stream).
  grpc::Status CheckRequest(const google::protobuf::Message& request) const;

  const Authenticator& authenticator() const { return *auth_; }
  int64_t max_tensor_elements() const { return max_tensor_elements_; }

 private:
  std::shared_ptr<const Authenticator> auth_;
  const int64_t max_tensor_elements_;
};

/// A gate with no authentication and no limit (identity: x-attn-identity),
/// for services built without one.
const CallGate& OpenGate();

/// Finishes a unary call with `status` at once and returns its reactor.
grpc::ServerUnaryReactor* Reject(grpc::CallbackServerContext* context, const grpc::Status& status);

}  // namespace attn::security
