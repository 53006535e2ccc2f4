// A ServerBuilder option that keeps gRPC server reflection off one server.
// Linking grpc++_reflection registers the reflection plugin for every
// ServerBuilder of the process; the health-only listener must serve nothing but
// grpc.health.v1, and with token authentication the main listener must not
// answer reflection without a token (reflection is served by gRPC itself and
// cannot be authenticated by our handlers).
#pragma once

#include <memory>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>

namespace attn {

class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>> kept;
    for (auto& p : *plugins) {
      if (dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) == nullptr) {
        kept.push_back(std::move(p));
      }
    }
    plugins->swap(kept);
  }
};

}  // namespace attn
