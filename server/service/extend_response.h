// The ExtendResponse of a sequence step that ran OK, built from the step batcher's neutral
// result (batching/step_batcher.h StepResult); used by Extend, ExtendBatch and ExtendStream (and the report of a packed ExtendBatch).
// Thread-safety: pure over its arguments (one response per call).
#pragma once

#include <chrono>
#include <string>

#include "attention/v1/sequence.pb.h"
#include "batching/step_batcher.h"

namespace attn {

/// Fills `response` from `result` (status OK): o (the (T, N, H) output; its bytes are moved out
/// of result.o; unset for an append-only step), length, replayed and the ExecutionReport: the paged backend that ran (`backend`,
/// its name, e.g. "paged-gpu") and its `device` ("cpu" or "gpu"), the launch's batch size and
/// tokens (1 and T for a replay), flops (0 for a replay), and the times (decode, queue, kernel,
/// copies, batch wall and kernel time in µs; total_us from `received` until now).
void FillExtendResponse(StepResult& result, const std::string& backend, const std::string& device,
                        std::chrono::steady_clock::time_point received,
                        attention::v1::ExtendResponse* response);

/// The ExecutionReport part of FillExtendResponse: backend, reason, batch size and tokens, flops
/// and times of the step `result` (status OK), total_us from `received` until now.
void FillExecutionReport(const StepResult& result, const std::string& backend,
                         const std::string& device, std::chrono::steady_clock::time_point received,
                         attention::v1::ExecutionReport* report);

}  // namespace attn
