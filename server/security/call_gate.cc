#include "security/call_gate.h"

#include "common/client_text.h"
#include "security/tensor_limit.h"

namespace attn::security {

grpc::Status CallGate::CheckRequest(const google::protobuf::Message& request) const {
  const Status s = CheckTensorElements(request, max_tensor_elements_);
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), CapStatusMessage(s.message()));
}

grpc::Status CallGate::Admit(const grpc::ServerContextBase& context,
                             const google::protobuf::Message* request,
                             std::string* identity) const {
  grpc::Status s = auth_->Authenticate(context, identity);
  if (!s.ok() || request == nullptr) return s;
  return CheckRequest(*request);
}

const CallGate& OpenGate() {
  static const CallGate* const gate = new CallGate();
  return *gate;
}

grpc::ServerUnaryReactor* Reject(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace attn::security
