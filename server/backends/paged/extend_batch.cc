#include "backends/paged/extend_batch.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace attn {
namespace {

// Steps that may share one launch: same sub-pool, q dtype, q heads and scale.
using GroupKey = std::tuple<const void *, int, int64_t, uint32_t>;

GroupKey KeyOf(const PreparedExtend &p) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &p.attend.query.scale, sizeof(scale_bits));
  return {p.attend.layer.pool.k_pages, static_cast<int>(p.attend.query.dtype),
          p.attend.query.num_heads, scale_bits};
}

}  // namespace

void RunExtendSteps(SequenceStore *store, PagedAttentionBackend *backend, BatchedExtend *steps,
                    size_t n, LaunchTimes *total, StepPhases *phases) {
  if (n == 0) return;
  using Clock = std::chrono::steady_clock;
  StepPhases local;
  StepPhases &ph = phases != nullptr ? *phases : local;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  };
  auto t0 = Clock::now();
  // Lock order: sequence id. A second step on a sequence already in this batch waits for the
  // batch to finish (it would otherwise wait on a lock this thread holds).
  std::vector<size_t> order(n), later;
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return steps[a].args->sequence_id < steps[b].args->sequence_id;
  });
  std::vector<size_t> now;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k > 0 && steps[order[k]].args->sequence_id == steps[order[k - 1]].args->sequence_id) {
      later.push_back(order[k]);
    } else {
      now.push_back(order[k]);
    }
  }
  std::vector<std::unique_ptr<PreparedExtend>> prep(n);
  std::map<GroupKey, std::vector<size_t>> groups;
  for (size_t i : now) {
    BatchedExtend &s = steps[i];
    s.launch_size = 0;
    s.launch_tokens = 0;
    prep[i] = std::make_unique<PreparedExtend>();
    bool unwanted = false;
    StillWanted check;
    if (s.still_wanted) {
      check = [&s, &unwanted]() {
        Status w = s.still_wanted();
        unwanted = !w.ok();
        return w;
      };
    }
    s.status =
        PrepareExtend(store, backend, *s.owner, *s.args, s.o, s.outcome, prep[i].get(), check);
    s.dropped = unwanted;
    if (s.status.ok() && !prep[i]->replayed) groups[KeyOf(*prep[i])].push_back(i);
  }
  ph.prepare_ns += since(t0);
  std::vector<PagedAppendItem> appends;
  std::vector<PagedAttendItem> attends;
  for (auto &[key, members] : groups) {
    appends.clear();
    attends.clear();
    int64_t tokens = 0;
    for (size_t i : members) {
      appends.push_back(prep[i]->append);
      attends.push_back(prep[i]->attend);
      tokens += prep[i]->attend.query.tokens;
    }
    // Appends first: each step's attention reads its own new keys (one round trip on a GPU).
    LaunchTimes times;
    t0 = Clock::now();
    Status s = backend->AppendAttendBatch(appends.data(), attends.data(), appends.size(), &times);
    ph.launch_ns += since(t0);
    if (total != nullptr) *total += times;
    t0 = Clock::now();
    for (size_t m = 0; m < members.size(); ++m) {
      BatchedExtend &step = steps[members[m]];
      PreparedExtend &p = *prep[members[m]];
      if (!s.ok()) {
        step.status = s;
        AbortExtend(store, &p, step.o);
        continue;
      }
      p.append.saturations = appends[m].saturations;
      CommitExtend(store, &p, *step.o, times, step.outcome);
      step.launch_size = static_cast<int64_t>(members.size());
      step.launch_tokens = tokens;
    }
    ph.commit_ns += since(t0);
  }
  prep.clear();  // unlocks replays and failed steps' sequences (none are held on error)
  for (size_t i : later) RunExtendSteps(store, backend, &steps[i], 1, total, phases);
}

}  // namespace attn
