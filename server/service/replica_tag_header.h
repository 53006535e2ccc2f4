// The x-attn-replica-tag response header (issue 19 item 4): every call this server answers
// carries its replica tag (kv_cache/sequence_id.h: the 8 hex digits that prefix the sequence ids
// it mints) in its initial metadata, so an L7 proxy (Envoy, GKE Gateway) or a client can learn
// which replica answered and route later calls on a sequence to it.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace attn {

/// Response header (initial metadata) name; lowercase as HTTP/2 requires.
inline constexpr char kReplicaTagHeader[] = "x-attn-replica-tag";

/// A server interceptor factory whose interceptors add `kReplicaTagHeader: tag` to the initial
/// metadata of every call (any service: attention.v1, health, reflection), also on calls that
/// fail before a response. Thread-safe; the tag never changes after construction.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeReplicaTagInterceptor(
    std::string tag);

}  // namespace attn
