#include "loadgen/channel_security.h"

#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace attn::loadgen {
namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return !in.bad();
}

// Adds the bearer token to every call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // outlives every call: the channel owns the factory
};

}  // namespace

std::string LoadChannelSecurity(ChannelSecurity* s) {
  if (s->cert_file.empty() != s->key_file.empty()) {
    return "--tls-cert and --tls-key go together (mutual TLS)";
  }
  if (!s->ca_file.empty() || !s->cert_file.empty()) s->tls = true;
  if (!s->ca_file.empty() && !ReadFile(s->ca_file, &s->ca_pem)) {
    return "--tls-ca: cannot read " + s->ca_file;
  }
  if (!s->cert_file.empty() && !ReadFile(s->cert_file, &s->cert_pem)) {
    return "--tls-cert: cannot read " + s->cert_file;
  }
  if (!s->key_file.empty() && !ReadFile(s->key_file, &s->key_pem)) {
    return "--tls-key: cannot read " + s->key_file;
  }
  if (!s->token_file.empty()) {
    std::string raw;
    if (!ReadFile(s->token_file, &raw)) return "--token-file: cannot read " + s->token_file;
    const size_t b = raw.find_first_not_of(" \t\r\n");
    const size_t e = raw.find_last_not_of(" \t\r\n");
    if (b == std::string::npos) return "--token-file: " + s->token_file + " is empty";
    s->token = raw.substr(b, e - b + 1);
  }
  return "";
}

std::shared_ptr<grpc::Channel> MakeSecureChannel(const std::string& target,
                                                 const ChannelSecurity& s,
                                                 grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (s.tls) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = s.ca_pem;
    o.pem_cert_chain = s.cert_pem;
    o.pem_private_key = s.key_pem;
    creds = grpc::SslCredentials(o);
    if (!s.server_name.empty()) args.SetSslTargetNameOverride(s.server_name);
  }
  if (s.token.empty()) return grpc::CreateCustomChannel(target, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> icpt;
  icpt.push_back(std::make_unique<TokenInterceptorFactory>(s.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args,
                                                                  std::move(icpt));
}

}  // namespace attn::loadgen
