#include "batching/batch_scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "common/deadline.h"

namespace attn {
namespace {

int64_t SteadyNowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Sets (*view)[i].barrier for every item i whose exclusive key an earlier item [0, i) has, as
/// a set of seen keys would, without copying a key: the keyed items' indices are sorted by
/// (key, index) in `order` (reused from call to call).
template <typename ItemAt>
void MarkRepeatedKeys(size_t n, ItemAt item_at, std::vector<QueuedItem>* view,
                      std::vector<size_t>* order) {
  order->clear();
  for (size_t i = 0; i < n; ++i) {
    if (!item_at(i).ExclusiveKey().empty()) order->push_back(i);
  }
  if (order->size() < 2) return;
  std::sort(order->begin(), order->end(), [&item_at](size_t a, size_t b) {
    const int c = item_at(a).ExclusiveKey().compare(item_at(b).ExclusiveKey());
    return c < 0 || (c == 0 && a < b);
  });
  for (size_t k = 1; k < order->size(); ++k) {
    if (item_at((*order)[k]).ExclusiveKey() == item_at((*order)[k - 1]).ExclusiveKey()) {
      (*view)[(*order)[k]].barrier = true;
    }
  }
}

}  // namespace

BatchScheduler::BatchScheduler(const BatchSchedulerOptions& options, BatchExecutor executor,
                               std::function<int64_t()> now_us)
    : options_(options),
      executor_(std::move(executor)),
      now_us_(now_us ? std::move(now_us) : SteadyNowUs) {
  const int n = std::max(1, options_.threads);
  threads_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

BatchScheduler::~BatchScheduler() { Stop(); }

Status BatchScheduler::Enqueue(std::unique_ptr<BatchItem>* item) {
  std::vector<std::unique_ptr<BatchItem>> one;
  one.push_back(std::move(*item));
  Status s = Enqueue(&one);
  if (!s.ok()) *item = std::move(one.front());
  return s;
}

bool BatchScheduler::InlineOkLocked(const std::vector<std::unique_ptr<BatchItem>>& items,
                                    int64_t now_us) const {
  if (options_.inline_max_tokens <= 0 || !queues_.empty() || stopping_ ||
      running_ >= std::max(1, options_.threads)) {
    return false;
  }
  // Exactly the batch an idle executor would take at once: the policy's decision over these
  // items alone must be "run all of them now" (so a --max-queue-delay-us wait, the request and
  // token limits and two steps of one sequence all keep them queued).
  int64_t tokens = 0;
  std::vector<QueuedItem>& view = inline_view_;
  view.clear();
  for (const auto& item : items) {
    if (item->signature != items.front()->signature) return false;
    tokens += item->tokens;
    view.push_back(QueuedItem{item->tokens, now_us, false});
  }
  if (tokens > options_.inline_max_tokens) return false;
  MarkRepeatedKeys(
      items.size(), [&items](size_t i) -> const BatchItem& { return *items[i]; }, &view,
      &inline_order_);
  const BatchDecision d = Decide(view.data(), view.size(), now_us, options_.policy);
  return d.kind == BatchDecision::Kind::kRunNow && d.count == items.size();
}

Status BatchScheduler::Enqueue(std::vector<std::unique_ptr<BatchItem>>* items) {
  if (items->empty()) return Status::Ok();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return Unavailable(options_.name + " queue is stopping (server shutdown)");
    const int64_t waiting = queued_requests_.load();
    const int64_t asked = static_cast<int64_t>(items->size());
    if (waiting > 0 && waiting + asked > options_.max_queued) {
      return ResourceExhausted(options_.name + " queue is full: " + std::to_string(waiting) +
                               " waiting, " + std::to_string(asked) + " more asked, limit " +
                               std::to_string(options_.max_queued) + " (--max-queue-requests)");
    }
    const int64_t now = now_us_();
    if (InlineOkLocked(*items, now)) {
      ++running_;
      lock.unlock();
      std::vector<std::unique_ptr<BatchItem>> batch = std::move(*items);
      items->clear();
      for (auto& item : batch) item->enqueued_us = item->dequeued_us = now;
      inline_runs_.fetch_add(1);
      Execute(batch);
      lock.lock();
      --running_;
      // Wake an executor that waits for this slot (work queued behind this run), or Stop.
      const bool wake = (slot_waiters_ > 0 && !queues_.empty()) || stopping_;
      lock.unlock();
      if (wake) cv_.notify_all();
      return Status::Ok();
    }
    for (auto& item : *items) {
      item->enqueued_us = now;
      queued_requests_.fetch_add(1);
      queued_tokens_.fetch_add(item->tokens);
      queues_[item->signature].push_back(std::move(item));
    }
  }
  items->clear();
  cv_.notify_all();
  return Status::Ok();
}

void BatchScheduler::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sweep_ = true;
  }
  cv_.notify_one();
}

void BatchScheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  // Inline runs still on their callers' threads finish before the scheduler may go away.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return running_ == 0; });
}

int64_t BatchScheduler::RefuseQueued(const Status& why) {
  std::vector<std::unique_ptr<BatchItem>> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [signature, queue] : queues_) {
      for (auto& item : queue) {
        Removed(*item);
        refused.push_back(std::move(item));
      }
    }
    queues_.clear();
  }
  cv_.notify_all();
  for (auto& item : refused) item->Drop(why);
  return static_cast<int64_t>(refused.size());
}

Status BatchScheduler::Dead(const BatchItem& item) {
  // When the deadline passes gRPC also cancels the call: AbandonedStatus says which it was (log,
  // metrics).
  if (std::chrono::system_clock::now() >= item.deadline() || item.Cancelled()) {
    return AbandonedStatus(item.deadline(), "while queued; the call was not computed");
  }
  return Status::Ok();
}

void BatchScheduler::Removed(const BatchItem& item) {
  queued_requests_.fetch_sub(1);
  queued_tokens_.fetch_sub(item.tokens);
}

void BatchScheduler::SweepLocked(std::vector<std::pair<std::unique_ptr<BatchItem>, Status>>* dead) {
  for (auto it = queues_.begin(); it != queues_.end();) {
    Queue& q = it->second;
    Queue keep;
    for (auto& item : q) {
      Status s = Dead(*item);
      if (s.ok()) {
        keep.push_back(std::move(item));
      } else {
        Removed(*item);
        dead->emplace_back(std::move(item), std::move(s));
      }
    }
    q.swap(keep);
    it = q.empty() ? queues_.erase(it) : std::next(it);
  }
}

void BatchScheduler::Loop() {
  std::vector<QueuedItem> view;
  std::vector<std::pair<std::unique_ptr<BatchItem>, Status>> dead;
  std::vector<std::unique_ptr<BatchItem>> batch;
  std::vector<size_t> key_order;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (sweep_) {
      sweep_ = false;
      SweepLocked(&dead);
    }
    if (!dead.empty()) {
      lock.unlock();
      for (auto& [item, status] : dead) item->Drop(status);
      dead.clear();
      lock.lock();
      continue;
    }
    if (queues_.empty()) {
      if (stopping_) return;
      cv_.wait(lock);
      continue;
    }
    // Pick the run-now batch whose head has waited longest; else the earliest wake-up.
    const int64_t now = now_us_();
    Queue* best = nullptr;
    std::map<std::string, Queue>::iterator best_it;
    BatchDecision best_d;
    int64_t wait_us = std::numeric_limits<int64_t>::max();
    for (auto it = queues_.begin(); it != queues_.end(); ++it) {
      Queue& q = it->second;
      const size_t limit = static_cast<size_t>(
          std::min<int64_t>(static_cast<int64_t>(q.size()),
                            std::max<int64_t>(1, options_.policy.max_batch_requests) + 1));
      view.clear();
      for (size_t i = 0; i < limit; ++i) {
        view.push_back(QueuedItem{q[i]->tokens, q[i]->enqueued_us, false});
      }
      MarkRepeatedKeys(
          limit, [&q](size_t i) -> const BatchItem& { return *q[i]; }, &view, &key_order);
      BatchDecision d = Decide(view.data(), view.size(), now, options_.policy);
      if (d.kind == BatchDecision::Kind::kWait && stopping_) d.kind = BatchDecision::Kind::kRunNow;
      if (d.kind == BatchDecision::Kind::kRunNow) {
        if (best == nullptr || q.front()->enqueued_us < best->front()->enqueued_us) {
          best = &q;
          best_it = it;
          best_d = d;
        }
      } else if (d.kind == BatchDecision::Kind::kWait) {
        wait_us = std::min(wait_us, d.wait_us);
      }
    }
    if (best == nullptr) {
      cv_.wait_for(lock, std::chrono::microseconds(wait_us));
      continue;
    }
    if (running_ >= std::max(1, options_.threads)) {
      // An inline run holds the last slot: wait for it (it notifies when it ends).
      ++slot_waiters_;
      cv_.wait(lock);
      --slot_waiters_;
      continue;
    }
    const int64_t taken_at = now_us_();
    for (size_t i = 0; i < best_d.count; ++i) {
      std::unique_ptr<BatchItem> item = std::move(best->front());
      best->pop_front();
      Removed(*item);
      item->dequeued_us = taken_at;
      batch.push_back(std::move(item));
    }
    if (best->empty()) queues_.erase(best_it);
    const bool more = !queues_.empty();
    ++running_;
    lock.unlock();
    if (more) cv_.notify_one();  // another thread may take the next batch
    Execute(batch);
    batch.clear();
    lock.lock();
    --running_;
  }
}

void BatchScheduler::Execute(std::vector<std::unique_ptr<BatchItem>>& batch) {
  {
    // Expired or cancelled work is dropped before launch, never computed.
    size_t live = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      Status s = Dead(*batch[i]);
      if (!s.ok()) {
        batch[i]->Drop(s);
        batch[i].reset();
      } else {
        if (live != i) batch[live] = std::move(batch[i]);
        ++live;
      }
    }
    batch.resize(live);
    if (!batch.empty()) {
      batches_run_.fetch_add(1);
      items_run_.fetch_add(static_cast<int64_t>(batch.size()));
      executor_(batch);
    }
  }
}

}  // namespace attn
