#include "health/health_listener.h"

#include "common/without_reflection.h"

namespace attn::health {

StatusOr<std::unique_ptr<HealthListener>> HealthListener::Start(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size() ||
      address.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
      address.size() - colon - 1 > 5 || std::stoi(address.substr(colon + 1)) > 65535) {
    return InvalidArgument("--health-address: expected host:port with port in [0, 65535], got \"" +
                           address + "\"");
  }
  const int requested = std::stoi(address.substr(colon + 1));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<HealthListener> l(new HealthListener());
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &l->port_);
  builder.SetMaxReceiveMessageSize(64 << 10);  // health requests are tiny
  builder.RegisterCallbackGenericService(&l->unimplemented_);
  l->server_ = builder.BuildAndStart();
  if (!l->server_ || l->port_ == 0 || (requested != 0 && l->port_ != requested)) {
    if (l->server_) l->server_->Shutdown(std::chrono::system_clock::now());
    l->stopped_ = true;
    return Unavailable("--health-address: could not listen on " + address +
                       " (address in use or not local?)");
  }
  return l;
}

void HealthListener::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (stopped_ || !server_) return;
  stopped_ = true;
  server_->Shutdown(deadline);
  server_->Wait();
}

HealthListener::~HealthListener() { Shutdown(std::chrono::system_clock::now()); }

}  // namespace attn::health
