#include "loadgen/session_workload.h"

#include <algorithm>
#include <cmath>

#include "loadgen/session_runner.h"

namespace attn::loadgen {

int64_t ScaleGenerated(int64_t generated, double gen_scale, int64_t max_gen) {
  const double scaled = std::round(static_cast<double>(generated) * gen_scale);
  return std::clamp<int64_t>(static_cast<int64_t>(scaled), 0, std::max<int64_t>(max_gen, 0));
}

SessionPlan PlanSession(const TraceRecord& row, const TokenScaling& scaling, double gen_scale,
                        int64_t max_gen) {
  SessionPlan p;
  p.context_tokens = ScaleTokens(row.context_tokens, scaling);
  p.generated_tokens = ScaleGenerated(row.generated_tokens, gen_scale, max_gen);
  return p;
}

SessionReport RunSessions(const SessionOptions& options, const std::vector<SessionPlan>& plans,
                          const std::vector<MooncakeRequest>& requests, int64_t count) {
  SessionRunner runner(options, plans, requests, count);
  return runner.Run();
}

}  // namespace attn::loadgen
