// The registry of stateful sequences (DESIGN.md §3, §7): ids that name their
// replica (tag + 96 random bits, kv_cache/sequence_id.h),
// ownership by identity, page accounting with reservations, copy-on-write
// forks, truncation, LRU eviction of idle sequences (optional) and an idle TTL
// (optional), with an injectable clock.
//
// Every operation on a sequence holds that sequence's lock for its whole
// duration (calls on one sequence are serialised; different sequences run in
// parallel). Lock order: sequence lock, then the store lock, then the page
// pool's lock; the store never blocks on a sequence lock while holding its own
// (eviction and expiry only try_lock, so busy sequences are never dropped).
// NOT_FOUND is returned for unknown ids, released sequences and sequences of
// another identity alike; only the owner learns that its sequence was "evicted"
// or "expired". Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "attn/common/status.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/replay_output.h"
#include "kv_cache/sequence.h"
#include "kv_cache/identity_quota.h"

namespace attn {

struct SequenceStoreOptions {
  bool evict_idle = false;        ///< evict least-recently-used idle sequences when out of pages
  double ttl_s = 0.0;             ///< drop sequences idle longer than this; 0 = never
  size_t max_tombstones = 65536;  ///< evicted/expired ids remembered for their NOT_FOUND reason
  /// Per-owner limits (0: unlimited); usage is always counted (quota()).
  security::IdentityLimits owner_limits;
  /// This replica's tag: the first 8 hex digits of every id it mints (kv_cache/sequence_id.h).
  uint32_t replica_tag = 0;
  /// host:port this replica is reachable at (--advertise-address; may be empty), reported in
  /// SequenceInfo.replica_address.
  std::string replica_address;
  /// Host bytes the stored outputs of last steps (exact replays) may hold in all
  /// (--replay-cache-bytes; replay_output.h). 0: no step is replayable.
  int64_t replay_cache_bytes = int64_t{512} << 20;
  /// Host bytes the live sequences' own metadata may hold in all (--sequence-metadata-bytes;
  /// SequenceMetadataBytes per sequence, charged at Create and Fork): without it a client could
  /// hold gigabytes of host memory with sequences of many layers and no KV pages.
  int64_t sequence_metadata_bytes = int64_t{1} << 30;
};

/// A live sequence with its lock held. Move-only.
struct LockedSequence {
  std::shared_ptr<Sequence> seq;
  std::unique_lock<std::mutex> lock;
};

class SequenceStore {
 public:
  /// `pool` is not owned. `now_us` is a monotonic clock in microseconds (null:
  /// steady_clock).
  SequenceStore(PagePool *pool, const SequenceStoreOptions &options,
                std::function<int64_t()> now_us = nullptr);
  ~SequenceStore();

  /// Creates a sequence owned by `owner` with `config` (already validated by
  /// the caller), reserving BlocksFor(reserve_tokens) pages per layer. Returns
  /// it locked. Errors: RESOURCE_EXHAUSTED (pages needed, pages free; or the
  /// owner's sequence/page limit with the numbers) and nothing is created.
  StatusOr<LockedSequence> Create(const std::string &owner, SequenceConfig config);
  /// The live sequence `id` of `owner`, locked, and marked used now.
  /// Errors: NOT_FOUND (unknown, released, another owner's; "evicted"/"expired"
  /// for the owner).
  StatusOr<LockedSequence> Acquire(const std::string &id, const std::string &owner);
  /// Drops a sequence; *pages_freed (nullable) counts pages that returned to
  /// the pool.
  Status Release(const std::string &id, const std::string &owner, int64_t *pages_freed);
  /// Drops every live sequence of `owner` (waiting for a step in progress on each), as
  /// state "revoked": used when the owner's last token is revoked. Returns how many;
  /// *pages_freed (nullable) counts pages that returned to the pool.
  int64_t ReleaseOwner(const std::string &owner, int64_t *pages_freed);
  /// A child sharing the parent's pages (first `length` tokens of each layer
  /// when given), returned locked; the shared pages are not charged to the
  /// owner again. Errors: NOT_FOUND; INVALID_ARGUMENT for a negative length;
  /// RESOURCE_EXHAUSTED at the owner's sequence limit.
  StatusOr<LockedSequence> Fork(const std::string &id, const std::string &owner,
                                std::optional<int64_t> length);
  /// Cuts every layer of a locked sequence back to at most `length` tokens.
  void Truncate(Sequence *seq, int64_t length);

  /// Takes `n` pages for `seq` (whose lock the caller holds) and charges them to seq's
  /// owner. Before refusing, expired sequences are swept; then, with evict_idle, idle
  /// sequences of the same layout class are evicted: seq's owner's own first (least recently
  /// used first), another identity's only while that identity holds more pages than its fair
  /// share (the class's pages, used plus available, divided by the identities holding
  /// sequences; an identity's pages are counted over all classes). All or nothing;
  /// RESOURCE_EXHAUSTED otherwise (the owner's page limit, or the cache).
  Status AllocatePages(Sequence *seq, int64_t n, int32_t *out);
  /// Drops one reference from each page of `seq`'s class; returns pages freed.
  int64_t ReleasePages(Sequence *seq, const int32_t *pages, int64_t n);
  /// Drops sequences idle longer than the TTL (also done on every lookup, before refusing
  /// for lack of pages, sequence count or metadata, and on a timer: kv_cache/ttl_sweeper.h).
  void SweepExpired();

  PagePool *pool() const { return pool_; }
  /// Live sequences and KV pages per owner (kv_cache/identity_quota.h).
  const security::IdentityQuota &quota() const { return quota_; }
  /// The budget stored replay outputs are charged to (replay_output.h).
  const std::shared_ptr<ByteBudget> &replay_budget() const { return replay_budget_; }
  const std::shared_ptr<ByteBudget> &metadata_budget() const { return metadata_budget_; }
  const SequenceStoreOptions &options() const { return options_; }
  int64_t now_us() const { return now_us_(); }
  int64_t live_sequences() const;
  int64_t evictions() const { return evictions_.load(); }
  int64_t expirations() const { return expirations_.load(); }
  /// Sequences dropped by ReleaseOwner (their owner's token was revoked).
  int64_t revocations() const { return revocations_.load(); }
  void AddSaturations(int64_t n) { saturations_.fetch_add(n); }
  int64_t saturations() const { return saturations_.load(); }

 private:
  std::string NewId();  // store lock held
  Status AllocateFromPool(Sequence *seq, int64_t n, int32_t *out);
  StatusOr<std::shared_ptr<Sequence>> Register(std::shared_ptr<Sequence> seq);
  void SweepExpiredLocked();
  /// quota_.AddSequence, once more after a sweep when refused.
  Status AddOwnedSequence(const std::string &owner);
  // Frees `s`'s pages and forgets it; store lock and s->mu held.
  int64_t DropLocked(Sequence *s, SequenceState why);
  Status NotFound(const std::string &id,
                  const std::string &owner) const;  // store lock held

  PagePool *const pool_;
  const SequenceStoreOptions options_;
  std::function<int64_t()> now_us_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Sequence>> live_;
  std::list<Sequence *> lru_;  ///< front: most recently used
  struct Tombstone {
    std::string owner;
    SequenceState why;
  };
  std::unordered_map<std::string, Tombstone> tombstones_;
  std::deque<std::string> tombstone_order_;
  std::atomic<int64_t> evictions_{0};
  std::atomic<int64_t> expirations_{0};
  std::atomic<int64_t> revocations_{0};
  std::atomic<int64_t> saturations_{0};
  security::IdentityQuota quota_;
  std::shared_ptr<ByteBudget> replay_budget_;
  std::shared_ptr<ByteBudget> metadata_budget_;
  /// Charges a new sequence's metadata (`what`: "create" or "fork" for the message); on
  /// RESOURCE_EXHAUSTED nothing is charged.
  StatusOr<BudgetCharge> ChargeMetadata(const SequenceConfig &config, const char *what) const;
};

}  // namespace attn
