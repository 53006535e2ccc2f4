#include "kv_cache/sequence_store.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <unordered_map>
#include <vector>

#include "kv_cache/sequence_id.h"

namespace attn {
namespace {

int64_t SteadyNowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char *GoneReason(SequenceState s) {
  switch (s) {
    case SequenceState::kEvicted:
      return "was evicted (least recently used, to make room in the KV cache)";
    case SequenceState::kExpired:
      return "expired (idle longer than --sequence-ttl-s)";
    case SequenceState::kRevoked:
      return "was released when its owner's last token was revoked (token file reloaded)";
    default:
      return "was released";
  }
}

}  // namespace

SequenceStore::SequenceStore(PagePool *pool, const SequenceStoreOptions &options,
                             std::function<int64_t()> now_us)
    : pool_(pool),
      options_(options),
      now_us_(now_us ? std::move(now_us) : SteadyNowUs),
      quota_(options.owner_limits),
      replay_budget_(std::make_shared<ByteBudget>(options.replay_cache_bytes)),
      metadata_budget_(std::make_shared<ByteBudget>(options.sequence_metadata_bytes)) {}

StatusOr<BudgetCharge> SequenceStore::ChargeMetadata(const SequenceConfig &config,
                                                     const char *what) const {
  const int64_t bytes = SequenceMetadataBytes(config);
  BudgetCharge charge(metadata_budget_, bytes);
  if (!charge.ok()) {
    return ResourceExhausted(
        std::string(what) + ": a sequence of " + std::to_string(config.num_layers) +
        " layers needs " + std::to_string(bytes) + " bytes of host metadata; live sequences hold " +
        std::to_string(metadata_budget_->used()) + " of the " +
        std::to_string(metadata_budget_->cap()) +
        " allowed (--sequence-metadata-bytes): release sequences or use fewer layers");
  }
  return charge;
}

SequenceStore::~SequenceStore() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto &[id, s] : live_) {
    for (LayerState &l : s->layers) {
      pool_->Release(s->sub, l.table.pages().data(), l.table.num_blocks());
      pool_->Release(s->sub, l.spare.data(), static_cast<int64_t>(l.spare.size()));
    }
  }
}

int64_t SequenceStore::live_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(live_.size());
}

std::string SequenceStore::NewId() {
  std::random_device rd;  // /dev/urandom: unguessable ids
  for (;;) {
    std::string id = NewSequenceId(options_.replica_tag, rd);  // replica tag + 96 random bits
    if (live_.count(id) == 0 && tombstones_.count(id) == 0) return id;
  }
}

Status SequenceStore::NotFound(const std::string &id, const std::string &owner) const {
  const std::string tag = ReplicaTagOfId(id);
  if (!tag.empty() && tag != ReplicaTagHex(options_.replica_tag)) {
    return attn::NotFound("sequence " + id + " was not created by this replica (its replica tag " +
                          "is " + tag + ", this replica's is " +
                          ReplicaTagHex(options_.replica_tag) +
                          "): send calls on a sequence to the replica that created it "
                          "(SequenceInfo.replica_address)");
  }
  auto t = tombstones_.find(id);
  if (t != tombstones_.end() && t->second.owner == owner) {
    return attn::NotFound("sequence " + id + " " + GoneReason(t->second.why));
  }
  return attn::NotFound("sequence " + id + " not found (unknown or released)");
}

StatusOr<LockedSequence> SequenceStore::Create(const std::string &owner, SequenceConfig config) {
  const KvLayoutClass cls{config.num_kv_heads, config.head_dim, config.kv_dtype};
  StatusOr<SubPool *> sub = pool_->GetClass(cls);
  if (!sub.ok()) return sub.status();
  auto seq = std::make_shared<Sequence>(std::string(), owner, std::move(config), *sub);
  StatusOr<BudgetCharge> charge = ChargeMetadata(seq->config, "CreateSequence");
  if (!charge.ok()) {
    SweepExpired();  // expired sequences' metadata must not refuse a new one
    charge = ChargeMetadata(seq->config, "CreateSequence");
    if (!charge.ok()) return charge.status();
  }
  seq->metadata = std::move(*charge);  // before the layers are built
  const int32_t pt = pool_->page_tokens();
  seq->layers.reserve(static_cast<size_t>(seq->config.num_layers));
  for (int32_t l = 0; l < seq->config.num_layers; ++l) seq->layers.emplace_back(pt);
  const int64_t per_layer = BlockTable::BlocksFor(seq->config.reserve_tokens, pt);
  // Refuse a reservation the whole pool could never hold before allocating its page list
  // (2^24 tokens x 4096 layers would be a 16 GiB vector; found by tests/fuzz).
  const int64_t reserve_pages = per_layer * seq->config.num_layers;
  const int64_t max_pages =
      static_cast<int64_t>(pool_->pool_bytes()) / (2 * std::max<int64_t>(1, (*sub)->page_bytes()));
  if (reserve_pages > max_pages) {
    return ResourceExhausted("reserve_tokens: " + std::to_string(seq->config.reserve_tokens) +
                             " tokens x " + std::to_string(seq->config.num_layers) +
                             " layers need " + std::to_string(reserve_pages) +
                             " KV pages; the whole cache holds at most " +
                             std::to_string(max_pages) + " of this layout");
  }
  ATTN_RETURN_IF_ERROR(AddOwnedSequence(owner));
  if (per_layer > 0) {
    std::vector<int32_t> pages(static_cast<size_t>(per_layer * seq->config.num_layers));
    if (Status s = AllocatePages(seq.get(), static_cast<int64_t>(pages.size()), pages.data());
        !s.ok()) {
      quota_.RemoveSequence(owner);
      return s;
    }
    for (int32_t l = 0; l < seq->config.num_layers; ++l) {
      seq->layers[l].spare.assign(pages.begin() + l * per_layer,
                                  pages.begin() + (l + 1) * per_layer);
    }
  }
  if (!seq->config.k_scales.empty()) {
    const size_t K = static_cast<size_t>(seq->config.num_kv_heads);
    for (size_t l = 0; l < seq->layers.size(); ++l) {
      seq->layers[l].k_scales.assign(seq->config.k_scales.begin() + l * K,
                                     seq->config.k_scales.begin() + (l + 1) * K);
      seq->layers[l].v_scales.assign(seq->config.v_scales.begin() + l * K,
                                     seq->config.v_scales.begin() + (l + 1) * K);
    }
  }
  auto reg = Register(std::move(seq));
  if (!reg.ok()) return reg.status();
  LockedSequence out{*reg, std::unique_lock<std::mutex>((*reg)->mu)};
  return out;
}

StatusOr<std::shared_ptr<Sequence>> SequenceStore::Register(std::shared_ptr<Sequence> seq) {
  std::lock_guard<std::mutex> lock(mu_);
  seq->id = NewId();
  seq->last_used_us = now_us_();
  lru_.push_front(seq.get());
  seq->lru_it = lru_.begin();
  live_[seq->id] = seq;
  return seq;
}

void SequenceStore::SweepExpiredLocked() {
  if (options_.ttl_s <= 0) return;
  const int64_t now = now_us_();
  const int64_t ttl_us = static_cast<int64_t>(options_.ttl_s * 1e6);
  std::vector<std::shared_ptr<Sequence>> old;  // keeps each alive while its lock is held
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (now - (*it)->last_used_us <= ttl_us) break;
    old.push_back(live_.at((*it)->id));
  }
  for (const auto &s : old) {
    std::unique_lock<std::mutex> l(s->mu, std::try_to_lock);
    if (!l.owns_lock()) continue;  // in use: not idle
    DropLocked(s.get(), SequenceState::kExpired);
    expirations_.fetch_add(1);
  }
}

void SequenceStore::SweepExpired() {
  std::lock_guard<std::mutex> lock(mu_);
  SweepExpiredLocked();
}

int64_t SequenceStore::DropLocked(Sequence *s, SequenceState why) {
  int64_t freed = 0;
  for (LayerState &l : s->layers) {
    freed += pool_->Release(s->sub, l.table.pages().data(), l.table.num_blocks());
    freed += pool_->Release(s->sub, l.spare.data(), static_cast<int64_t>(l.spare.size()));
    l.table = BlockTable(l.table.page_tokens());
    l.spare.clear();
    l.last = LastStep();
  }
  quota_.ReturnPages(s->owner, freed);
  quota_.RemoveSequence(s->owner);
  s->state = why;
  lru_.erase(s->lru_it);
  if (why != SequenceState::kReleased && options_.max_tombstones > 0) {
    if (tombstones_.size() >= options_.max_tombstones) {
      tombstones_.erase(tombstone_order_.front());
      tombstone_order_.pop_front();
    }
    tombstones_[s->id] = Tombstone{s->owner, why};
    tombstone_order_.push_back(s->id);
  }
  live_.erase(s->id);  // may destroy *s when no caller holds it: do this last
  return freed;
}

StatusOr<LockedSequence> SequenceStore::Acquire(const std::string &id, const std::string &owner) {
  std::shared_ptr<Sequence> seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    SweepExpiredLocked();
    auto it = live_.find(id);
    if (it == live_.end() || it->second->owner != owner) return NotFound(id, owner);
    seq = it->second;
    seq->last_used_us = now_us_();
    lru_.splice(lru_.begin(), lru_, seq->lru_it);
  }
  std::unique_lock<std::mutex> l(seq->mu);
  if (seq->state != SequenceState::kLive) {
    return attn::NotFound("sequence " + id + " " + GoneReason(seq->state));
  }
  LockedSequence out{std::move(seq), std::move(l)};
  return out;
}

Status SequenceStore::Release(const std::string &id, const std::string &owner,
                              int64_t *pages_freed) {
  auto locked = Acquire(id, owner);
  if (!locked.ok()) return locked.status();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t freed = DropLocked(locked->seq.get(), SequenceState::kReleased);
  if (pages_freed != nullptr) *pages_freed = freed;
  return Status::Ok();
}

int64_t SequenceStore::ReleaseOwner(const std::string &owner, int64_t *pages_freed) {
  std::vector<std::shared_ptr<Sequence>> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto &[id, s] : live_) {
      if (s->owner == owner) mine.push_back(s);
    }
  }
  int64_t released = 0, freed = 0;
  for (const auto &s : mine) {
    std::unique_lock<std::mutex> l(s->mu);  // waits for a step in progress on it
    if (s->state != SequenceState::kLive) continue;
    std::lock_guard<std::mutex> lock(mu_);
    freed += DropLocked(s.get(), SequenceState::kRevoked);
    ++released;
  }
  revocations_.fetch_add(released);
  if (pages_freed != nullptr) *pages_freed = freed;
  return released;
}

StatusOr<LockedSequence> SequenceStore::Fork(const std::string &id, const std::string &owner,
                                             std::optional<int64_t> length) {
  if (length.has_value() && *length < 0) {
    return InvalidArgument("length: expected >= 0, got " + std::to_string(*length));
  }
  auto parent = Acquire(id, owner);
  if (!parent.ok()) return parent.status();
  Sequence *p = parent->seq.get();
  SequenceConfig cfg = p->config;
  cfg.reserve_tokens = 0;
  StatusOr<BudgetCharge> charge = ChargeMetadata(cfg, "ForkSequence");
  if (!charge.ok()) {
    SweepExpired();
    charge = ChargeMetadata(cfg, "ForkSequence");
    if (!charge.ok()) return charge.status();
  }
  ATTN_RETURN_IF_ERROR(AddOwnedSequence(owner));  // shared pages are already charged
  auto child = std::make_shared<Sequence>(std::string(), owner, std::move(cfg), p->sub);
  child->metadata = std::move(*charge);
  for (const LayerState &pl : p->layers) {
    LayerState cl(pl.table.page_tokens());
    cl.table = pl.table;
    if (length.has_value()) cl.table.Truncate(*length);  // drops references not yet taken
    cl.k_scales = pl.k_scales;
    cl.v_scales = pl.v_scales;
    pool_->Retain(p->sub, cl.table.pages().data(), cl.table.num_blocks());
    child->layers.push_back(std::move(cl));
  }
  child->fp8_saturations = 0;
  auto reg = Register(std::move(child));
  if (!reg.ok()) return reg.status();
  parent->lock.unlock();
  LockedSequence out{*reg, std::unique_lock<std::mutex>((*reg)->mu)};
  return out;
}

void SequenceStore::Truncate(Sequence *seq, int64_t length) {
  const int64_t reserved = BlockTable::BlocksFor(seq->config.reserve_tokens, pool_->page_tokens());
  for (LayerState &l : seq->layers) {
    if (l.table.length() <= length) continue;
    std::vector<int32_t> dropped = l.table.Truncate(length);
    l.last = LastStep();
    std::vector<int32_t> release;
    for (int32_t page : dropped) {
      const int64_t held = l.table.num_blocks() + static_cast<int64_t>(l.spare.size());
      if (held < reserved && pool_->RefCount(seq->sub, page) == 1) {
        l.spare.push_back(page);  // keep the reservation
      } else {
        release.push_back(page);
      }
    }
    quota_.ReturnPages(seq->owner, pool_->Release(seq->sub, release.data(),
                                                  static_cast<int64_t>(release.size())));
  }
}

Status SequenceStore::AddOwnedSequence(const std::string &owner) {
  if (quota_.AddSequence(owner).ok()) return Status::Ok();
  SweepExpired();  // the owner's expired sequences no longer count
  return quota_.AddSequence(owner);
}

Status SequenceStore::AllocatePages(Sequence *seq, int64_t n, int32_t *out) {
  if (!quota_.ReservePages(seq->owner, n).ok()) {
    SweepExpired();  // the owner's expired sequences' pages no longer count
    ATTN_RETURN_IF_ERROR(quota_.ReservePages(seq->owner, n));
  }
  Status s = AllocateFromPool(seq, n, out);
  if (!s.ok()) quota_.ReturnPages(seq->owner, n);
  return s;
}

Status SequenceStore::AllocateFromPool(Sequence *seq, int64_t n, int32_t *out) {
  Status s = pool_->Allocate(seq->sub, n, out);
  if (s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  SweepExpiredLocked();  // expired sequences never refuse live ones their pages
  if (pool_->Allocate(seq->sub, n, out).ok()) return Status::Ok();
  if (!options_.evict_idle) return s;
  // Idle sequences of the same class, least recently used first, until their exclusive pages
  // suffice: the caller's own first; another identity's only while that identity holds more
  // than its fair share (this class's pages / identities holding sequences), so an identity
  // within its share never loses sequences to another's allocations.
  const int64_t available = pool_->AvailablePages(seq->sub);
  int64_t class_used = 0;
  for (const KvClassStats &c : pool_->Stats()) {
    if (c.layout == seq->sub->layout()) class_used = c.pages_used;
  }
  const int64_t fair_share =
      (class_used + available) / std::max<int64_t>(1, static_cast<int64_t>(quota_.identities()));
  std::unordered_map<std::string, int64_t> held;  // other identities' pages, victims deducted
  int64_t gain = 0;
  std::vector<std::pair<std::shared_ptr<Sequence>, std::unique_lock<std::mutex>>> victims;
  for (const bool own : {true, false}) {
    for (auto it = lru_.rbegin(); it != lru_.rend() && available + gain < n; ++it) {
      Sequence *c = *it;
      if (c == seq || c->sub != seq->sub || (c->owner == seq->owner) != own) continue;
      int64_t *other = nullptr;
      if (!own) {
        other = &held.try_emplace(c->owner, quota_.Usage(c->owner).pages).first->second;
        if (*other <= fair_share) continue;  // within its share: not evictable by others
      }
      std::unique_lock<std::mutex> l(c->mu, std::try_to_lock);
      if (!l.owns_lock()) continue;  // in use
      int64_t frees = 0;
      for (const LayerState &layer : c->layers) {
        for (int32_t page : layer.table.pages()) frees += pool_->RefCount(c->sub, page) == 1;
        frees += static_cast<int64_t>(layer.spare.size());
      }
      gain += frees;
      if (other != nullptr) *other -= frees;
      victims.emplace_back(live_.at(c->id), std::move(l));
    }
  }
  if (available + gain < n) return s;  // evicting would not help: harm nothing
  for (auto &[victim, l] : victims) {
    DropLocked(victim.get(), SequenceState::kEvicted);
    evictions_.fetch_add(1);
    l.unlock();
  }
  return pool_->Allocate(seq->sub, n, out);
}

int64_t SequenceStore::ReleasePages(Sequence *seq, const int32_t *pages, int64_t n) {
  const int64_t freed = pool_->Release(seq->sub, pages, n);
  quota_.ReturnPages(seq->owner, freed);
  return freed;
}

}  // namespace attn
