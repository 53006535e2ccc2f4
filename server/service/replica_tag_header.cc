#include "service/replica_tag_header.h"

#include <utility>

namespace attn {
namespace {

// Adds the header at the one hook point where the server's initial metadata is still open.
class ReplicaTagInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ReplicaTagInterceptor(const std::string* tag) : tag_(tag) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kReplicaTagHeader, *tag_);
    }
    methods->Proceed();
  }

 private:
  const std::string* tag_;  // owned by the factory, which outlives the server's calls
};

class ReplicaTagInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ReplicaTagInterceptorFactory(std::string tag) : tag_(std::move(tag)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new ReplicaTagInterceptor(&tag_);  // gRPC owns and deletes it
  }

 private:
  const std::string tag_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeReplicaTagInterceptor(
    std::string tag) {
  return std::make_unique<ReplicaTagInterceptorFactory>(std::move(tag));
}

}  // namespace attn
