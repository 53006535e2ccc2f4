// Workloads: which requests to send, when, and the AttendRequest each one becomes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/v1/attention.grpc.pb.h"
#include "loadgen/trace.h"

namespace attn::loadgen {

/// The attention shape every request uses; T = S = the request's (scaled) token count.
struct ModelShape {
  int64_t batch = 1;      // B
  int64_t heads = 8;      // N, query heads
  int64_t kv_heads = 8;   // K, key/value heads (N % K == 0)
  int64_t head_dim = 64;  // H
  attention::v1::DType dtype = attention::v1::BFLOAT16;
  attention::v1::CausalAlignment causal = attention::v1::CAUSAL_BOTTOM_RIGHT;
  std::string backend;  // empty: the server's default
  bool return_lse = false;
};

/// Returns an error message if `shape` is unusable (non-positive extents, N % K != 0, ...),
/// else an empty string.
std::string ValidateShape(const ModelShape& shape);

/// How trace token counts map to request lengths.
struct TokenScaling {
  double scale = 1.0;
  int64_t min_tokens = 1;
  int64_t max_tokens = 16384;
};

/// round(tokens × scale) (halves away from zero), clamped to [min_tokens, max_tokens].
int64_t ScaleTokens(int64_t tokens, const TokenScaling& scaling);

/// One planned request: its query/key length and when it may be sent.
struct PlannedRequest {
  int64_t tokens = 0;        // T = S
  bool scheduled = false;    // true when the plan replays arrival times (time scale > 0)
  double send_offset_s = 0;  // earliest send time, seconds after the run starts
};

/// The sequence of requests of a run. Request i replays row (offset + i) of the trace, cycling
/// back to the first row when past the end (each cycle shifted by the trace's span plus its mean
/// gap so that send times keep increasing).
class RequestPlan {
 public:
  /// A plan over `rows` (already offset). `time_scale` 0 ignores timestamps (send at once);
  /// > 0 schedules row i at (time_i − time_0) × time_scale seconds.
  RequestPlan(std::vector<TraceRecord> rows, const TokenScaling& scaling, double time_scale);

  /// A plan whose every request has `tokens` tokens and no schedule.
  static RequestPlan Fixed(int64_t tokens);

  /// Request `index` (any index >= 0; cycles through the rows).
  PlannedRequest At(int64_t index) const;

  /// Number of distinct rows before the plan cycles.
  int64_t rows() const { return static_cast<int64_t>(rows_.size()); }

 private:
  RequestPlan() = default;
  std::vector<TraceRecord> rows_;
  TokenScaling scaling_;
  double time_scale_ = 0;
  double cycle_s_ = 0;
};

/// Builds the AttendRequest for a causal self-attention problem over `tokens` tokens:
/// q (B,T,N,H), k and v (B,T,K,H) in shape.dtype, PADDED layout, no lengths, default scale,
/// filled with standard-normal values drawn from a generator seeded with `seed`.
void BuildAttendRequest(const ModelShape& shape, int64_t tokens, uint64_t seed,
                        attention::v1::AttendRequest* request);

/// Whether request `index` is sampled for verification: a deterministic function of
/// (seed, index) that is true for a `fraction` of indices.
bool ShouldVerify(uint64_t seed, int64_t index, double fraction);

/// The per-request input seed derived from the run seed and the request index.
uint64_t RequestSeed(uint64_t seed, int64_t index);

}  // namespace attn::loadgen
