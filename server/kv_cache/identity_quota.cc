#include "kv_cache/identity_quota.h"

#include "common/client_text.h"

namespace attn::security {
namespace {

std::string Who(const std::string& identity) {
  return identity.empty() ? std::string("anonymous identity")
                          : "identity \"" + EchoClientText(identity) + "\"";
}

}  // namespace

void IdentityQuota::EraseIfIdle(std::unordered_map<std::string, IdentityUsage>::iterator it) {
  if (it->second.sequences <= 0 && it->second.pages <= 0) usage_.erase(it);
}

Status IdentityQuota::AddSequence(const std::string& identity) {
  std::lock_guard<std::mutex> lock(mu_);
  IdentityUsage& u = usage_[identity];
  if (limits_.max_sequences > 0 && u.sequences + 1 > limits_.max_sequences) {
    const int64_t current = u.sequences;
    EraseIfIdle(usage_.find(identity));
    return ResourceExhausted(Who(identity) + " has " + std::to_string(current) +
                             " live sequences, the limit (--max-sequences-per-identity) is " +
                             std::to_string(limits_.max_sequences) +
                             "; requested 1 more: release a sequence first");
  }
  ++u.sequences;
  return Status::Ok();
}

void IdentityQuota::RemoveSequence(const std::string& identity) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = usage_.find(identity);
  if (it == usage_.end()) return;
  --it->second.sequences;
  EraseIfIdle(it);
}

Status IdentityQuota::ReservePages(const std::string& identity, int64_t n) {
  if (n <= 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  IdentityUsage& u = usage_[identity];
  if (limits_.max_pages > 0 && u.pages + n > limits_.max_pages) {
    const int64_t current = u.pages;
    EraseIfIdle(usage_.find(identity));
    return ResourceExhausted(Who(identity) + " holds " + std::to_string(current) +
                             " KV pages, the limit (--max-pages-per-identity) is " +
                             std::to_string(limits_.max_pages) + "; requested " +
                             std::to_string(n) + " more");
  }
  u.pages += n;
  return Status::Ok();
}

void IdentityQuota::ReturnPages(const std::string& identity, int64_t n) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = usage_.find(identity);
  if (it == usage_.end()) return;
  it->second.pages -= n;
  EraseIfIdle(it);
}

IdentityUsage IdentityQuota::Usage(const std::string& identity) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = usage_.find(identity);
  return it == usage_.end() ? IdentityUsage{} : it->second;
}

size_t IdentityQuota::identities() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_.size();
}

}  // namespace attn::security
