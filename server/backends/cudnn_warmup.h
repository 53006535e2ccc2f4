// The --cudnn-warmup list: which cuDNN graph buckets to build at start (kernels/cudnn graph
// cache), so request-path builds reach zero for common traffic.
//
// Format: entries separated by ';', each "dtype:N:K:H:mask:Tmin-Tmax" with dtype bf16|fp16,
// mask none|top_left|bottom_right, and T = S over every power of two in [Tmin, Tmax] (B = 1).
// Each T yields two shapes: one with lengths (the ragged bucketed graph every padded or varlen
// request with B = 1 and T, S <= the bucket uses) and one without (the dense graph of exactly
// that shape). Stats (LSE) graphs are not warmed: return_lse requests build theirs on first use.
// Example (the default): "bf16:8:8:64:bottom_right:64-4096" (attention-loadgen's shape).
// Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/common/status.h"

namespace attn {

/// Parses `spec` (empty: no shapes). INVALID_ARGUMENT naming the bad entry and field.
StatusOr<std::vector<kernels::AttentionShape>> ParseCudnnWarmup(const std::string& spec);

}  // namespace attn
