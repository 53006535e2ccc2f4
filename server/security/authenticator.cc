#include "security/authenticator.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <utility>

namespace attn::security {
namespace {

constexpr char kUnauthenticated[] =
    "missing or unknown bearer token: send the metadata \"authorization: Bearer <token>\" "
    "with a token from the server's --auth-token-file";

}  // namespace

const char* AuthModeName(AuthMode mode) {
  switch (mode) {
    case AuthMode::kToken: return "token";
    case AuthMode::kClientCertificate: return "client-certificate";
    default: return "none";
  }
}

std::string BearerToken(std::string_view h) {
  constexpr std::string_view kScheme = "bearer";
  if (h.size() <= kScheme.size()) return std::string();
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(h[i])) != kScheme[i]) return std::string();
  }
  size_t i = kScheme.size();
  if (h[i] != ' ') return std::string();
  while (i < h.size() && h[i] == ' ') ++i;
  return std::string(h.substr(i));
}

StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const std::string& token_file,
                                                               bool client_certificates) {
  auto a = std::make_unique<Authenticator>();
  if (!token_file.empty()) {
    auto table = TokenTable::Load(token_file);
    if (!table.ok()) return table.status();
    a->mode_ = AuthMode::kToken;
    a->token_file_ = token_file;
    a->table_ = std::make_shared<const TokenTable>(std::move(*table));
  } else if (client_certificates) {
    a->mode_ = AuthMode::kClientCertificate;
  }
  return a;
}

std::shared_ptr<const TokenTable> Authenticator::table() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

size_t Authenticator::tokens() const {
  auto t = table();
  return t ? t->size() : 0;
}

Status Authenticator::Reload(std::vector<std::string>* revoked) {
  if (mode_ != AuthMode::kToken) return Status::Ok();
  auto fresh = TokenTable::Load(token_file_);
  if (!fresh.ok()) return fresh.status();
  auto next = std::make_shared<const TokenTable>(std::move(*fresh));
  std::shared_ptr<const TokenTable> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::exchange(table_, next);
  }
  if (revoked != nullptr) {
    revoked->clear();
    const std::vector<std::string> before = old->Identities(), after = next->Identities();
    std::set_difference(before.begin(), before.end(), after.begin(), after.end(),
                        std::back_inserter(*revoked));
  }
  return Status::Ok();
}

grpc::Status Authenticator::Authenticate(const grpc::ServerContextBase& context,
                                         std::string* identity) const {
  const auto& md = context.client_metadata();
  switch (mode_) {
    case AuthMode::kToken: {
      const auto it = md.find("authorization");
      std::string token;
      if (it != md.end()) token = BearerToken(std::string_view(it->second.data(), it->second.size()));
      std::optional<std::string> who;
      if (!token.empty()) who = table()->Find(token);
      if (!who.has_value()) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kUnauthenticated);
      *identity = std::move(*who);
      return grpc::Status::OK;
    }
    case AuthMode::kClientCertificate: {
      const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      if (auth != nullptr && auth->IsPeerAuthenticated()) {
        const std::vector<grpc::string_ref> peer = auth->GetPeerIdentity();
        if (!peer.empty() && peer[0].size() > 0) {
          *identity = std::string(peer[0].data(), peer[0].size());
          return grpc::Status::OK;
        }
      }
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "no verified client certificate identity (the server requires mutual "
                          "TLS: --tls-client-ca)");
    }
    default: {
      const auto it = md.find("x-attn-identity");
      *identity = it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
      return grpc::Status::OK;
    }
  }
}

}  // namespace attn::security
