#include "backends/paged/extend_batch.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <tuple>
#include <vector>

namespace attn {
namespace {

// Steps that may share one launch: same sub-pool, q dtype, q heads and scale (ordered as the
// tuple, so groups launch in the same order as before: by key).
struct GroupKey {
  const void *pool = nullptr;
  int dtype = 0;
  int64_t heads = 0;
  uint32_t scale_bits = 0;
  auto Tie() const { return std::tie(pool, dtype, heads, scale_bits); }
  bool operator==(const GroupKey &o) const { return Tie() == o.Tie(); }
  bool operator<(const GroupKey &o) const { return Tie() < o.Tie(); }
};

GroupKey KeyOf(const PreparedExtend &p) {
  GroupKey k;
  std::memcpy(&k.scale_bits, &p.attend.query.scale, sizeof(k.scale_bits));
  k.pool = p.attend.layer.pool.k_pages;
  k.dtype = static_cast<int>(p.attend.query.dtype);
  k.heads = p.attend.query.num_heads;
  return k;
}

/// What one RunExtendSteps call works in, kept per thread from call to call so that a batch
/// allocates nothing once these have grown to the largest batch seen. `prep` is indexed by step;
/// it is resized (not grown) before any step is prepared, so no PreparedExtend moves after
/// PrepareExtend (their pointers refer into them).
struct Scratch {
  std::vector<size_t> order, now, later, members;
  std::vector<PreparedExtend> prep;
  std::vector<GroupKey> key;      // per step: its group (valid for steps that launch)
  std::vector<char> launches;     // per step: prepared OK and not a replay
  std::vector<GroupKey> groups;   // distinct keys, sorted
  std::vector<PagedAppendItem> appends;
  std::vector<PagedAttendItem> attends;
  bool busy = false;  // in use by a RunExtendSteps call on this thread
};

/// Lock order: sequence id, ties in step order (what a stable sort gives); a second step on a
/// sequence already in this batch goes to `later` (it would wait on a lock this thread holds).
void OrderSteps(const BatchedExtend *steps, size_t n, Scratch &sc) {
  sc.order.resize(n);
  for (size_t i = 0; i < n; ++i) sc.order[i] = i;
  auto before = [steps](size_t a, size_t b) {
    const int c = steps[a].args->sequence_id.compare(steps[b].args->sequence_id);
    return c < 0 || (c == 0 && a < b);
  };
  if (!std::is_sorted(sc.order.begin(), sc.order.end(), before)) {
    std::sort(sc.order.begin(), sc.order.end(), before);
  }
  sc.now.clear();
  sc.later.clear();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = sc.order[k];
    if (k > 0 && steps[i].args->sequence_id == steps[sc.order[k - 1]].args->sequence_id) {
      sc.later.push_back(i);
    } else {
      sc.now.push_back(i);
    }
  }
}

void RunSteps(SequenceStore *store, PagedAttentionBackend *backend, BatchedExtend *steps, size_t n,
              LaunchTimes *total, StepPhases &ph, Scratch &sc) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  };
  auto t0 = Clock::now();
  OrderSteps(steps, n, sc);
  sc.prep.clear();
  sc.prep.resize(n);
  sc.key.resize(n);
  sc.launches.assign(n, 0);
  sc.groups.clear();
  for (size_t i : sc.now) {
    BatchedExtend &s = steps[i];
    s.launch_size = 0;
    s.launch_tokens = 0;
    bool unwanted = false;
    StillWanted check;
    if (s.still_wanted) {
      check = [&s, &unwanted]() {
        Status w = s.still_wanted();
        unwanted = !w.ok();
        return w;
      };
    }
    s.status = PrepareExtend(store, backend, *s.owner, *s.args, s.o, s.outcome, &sc.prep[i], check);
    s.dropped = unwanted;
    if (!s.status.ok() || sc.prep[i].replayed) continue;
    if (s.still_running) {
      s.stopped = Status::Ok();
      sc.prep[i].attend.stop = &s.still_running;
      sc.prep[i].attend.stopped = &s.stopped;
    }
    sc.launches[i] = 1;
    sc.key[i] = KeyOf(sc.prep[i]);
    if (std::find(sc.groups.begin(), sc.groups.end(), sc.key[i]) == sc.groups.end()) {
      sc.groups.push_back(sc.key[i]);
    }
  }
  std::sort(sc.groups.begin(), sc.groups.end());
  ph.prepare_ns += since(t0);
  for (const GroupKey &group : sc.groups) {
    sc.members.clear();
    sc.appends.clear();
    sc.attends.clear();
    int64_t tokens = 0;
    for (size_t i : sc.now) {
      if (!sc.launches[i] || !(sc.key[i] == group)) continue;
      sc.members.push_back(i);
      sc.appends.push_back(sc.prep[i].append);
      sc.attends.push_back(sc.prep[i].attend);
      tokens += sc.prep[i].attend.query.tokens;
    }
    // Appends first: each step's attention reads its own new keys (one round trip on a GPU).
    LaunchTimes times;
    t0 = Clock::now();
    Status s = backend->AppendAttendBatch(sc.appends.data(), sc.attends.data(), sc.appends.size(),
                                          &times);
    ph.launch_ns += since(t0);
    if (total != nullptr) *total += times;
    t0 = Clock::now();
    for (size_t m = 0; m < sc.members.size(); ++m) {
      BatchedExtend &step = steps[sc.members[m]];
      PreparedExtend &p = sc.prep[sc.members[m]];
      if (!s.ok() || !step.stopped.ok()) {  // the launch failed, or stopped this step alone
        step.status = s.ok() ? step.stopped : s;
        step.dropped = s.ok();
        AbortExtend(store, &p, step.o);
        continue;
      }
      p.append.saturations = sc.appends[m].saturations;
      CommitExtend(store, &p, *step.o, times, step.outcome);
      step.launch_size = static_cast<int64_t>(sc.members.size());
      step.launch_tokens = tokens;
    }
    ph.commit_ns += since(t0);
  }
  sc.prep.clear();  // unlocks replays and failed steps' sequences (none are held on error)
}

}  // namespace

void RunExtendSteps(SequenceStore *store, PagedAttentionBackend *backend, BatchedExtend *steps,
                    size_t n, LaunchTimes *total, StepPhases *phases) {
  if (n == 0) return;
  StepPhases local;
  StepPhases &ph = phases != nullptr ? *phases : local;
  thread_local Scratch mine;
  Scratch fresh;  // only when this thread's scratch is in use (not on the batcher's path)
  Scratch &sc = mine.busy ? fresh : mine;
  sc.busy = true;
  RunSteps(store, backend, steps, n, total, ph, sc);
  std::vector<size_t> later;
  later.swap(sc.later);  // empty (no allocation) unless a batch held a sequence twice
  sc.busy = false;
  for (size_t i : later) RunExtendSteps(store, backend, &steps[i], 1, total, phases);
  later.clear();
  later.swap(sc.later);  // hand the capacity back
}

}  // namespace attn
