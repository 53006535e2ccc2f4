// Per-identity accounting and limits of the KV cache (--max-sequences-per-identity,
// --max-pages-per-identity): live sequences and KV pages held by each identity.
//
// Pages are counted as distinct physical pages: a page counts once for its
// identity however many of that identity's sequences reference it (forks share
// pages copy-on-write, and a fork always belongs to its parent's identity, so
// a page is never shared between identities). A page is charged when it is
// allocated (including reserve_tokens reservations and copy-on-write copies)
// and credited when its last reference is dropped (release, truncation,
// eviction, expiry). Both counts return to 0 when an identity's sequences are
// all gone. A limit of 0 means unlimited. Reservations are all or nothing: a
// refused reservation changes no count.
// Thread-safety: all methods are safe from any thread (one internal mutex,
// never held while calling out).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attn/common/status.h"

namespace attn::security {

struct IdentityLimits {
  int64_t max_sequences = 0;  ///< live sequences per identity; 0 = unlimited
  int64_t max_pages = 0;      ///< KV pages per identity; 0 = unlimited
};

struct IdentityUsage {
  int64_t sequences = 0;
  int64_t pages = 0;
};

class IdentityQuota {
 public:
  explicit IdentityQuota(IdentityLimits limits = {}) : limits_(limits) {}

  /// Counts one more live sequence for `identity`. Errors: RESOURCE_EXHAUSTED
  /// with the limit, the current count and the request, and nothing changes.
  Status AddSequence(const std::string& identity);
  /// Counts one sequence less.
  void RemoveSequence(const std::string& identity);
  /// Charges `n` pages to `identity`. Errors: RESOURCE_EXHAUSTED with the
  /// limit, the pages held and the pages requested; nothing changes.
  Status ReservePages(const std::string& identity, int64_t n);
  /// Credits `n` pages back.
  void ReturnPages(const std::string& identity, int64_t n);

  /// Current usage of `identity` (zeros when it holds nothing).
  IdentityUsage Usage(const std::string& identity) const;
  /// Number of identities holding a sequence or a page.
  size_t identities() const;
  const IdentityLimits& limits() const { return limits_; }

 private:
  void EraseIfIdle(std::unordered_map<std::string, IdentityUsage>::iterator it);  // mu_ held

  const IdentityLimits limits_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, IdentityUsage> usage_;
};

}  // namespace attn::security
