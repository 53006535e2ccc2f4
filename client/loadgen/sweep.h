// `attention-loadgen sweep`: the codelab's tables. For each point of a sequence-length, batch or
// head-layout (MHA/GQA/MQA) sweep and each backend, a short closed-loop fixed workload; a table,
// a CSV and (through plot_sweep.py / matplotlib) a PNG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/v1/attention.pb.h"
#include "loadgen/runner.h"

namespace attn::loadgen {

/// One point of a sweep: a label and the shape/tokens it runs.
struct SweepPoint {
  std::string label;  // e.g. "T=256", "B=4", "MHA K=8"
  ModelShape shape;   // backend not set
  int64_t tokens = 0;
};

/// The points of sweep `kind` ("seq", "batch", "heads") around `base`/`tokens`. seq: each of
/// `seqs` tokens; batch: each of `batches`; heads: MHA (K=N), GQA (K=N/4, at least 1) and MQA
/// (K=1), duplicates removed. Returns an empty vector and sets `error` on a bad kind/shape.
std::vector<SweepPoint> SweepPoints(const std::string& kind, const ModelShape& base, int64_t tokens,
                                    const std::vector<int64_t>& seqs,
                                    const std::vector<int64_t>& batches, std::string* error);

/// One measured (point, backend).
struct SweepRow {
  SweepPoint point;
  std::string backend;
  Report report;
};

/// Checks that every name in `backends` is one of `server`'s backends and available there ("",
/// the server's default, and "auto", the server's choice, always pass). Returns "" when all are,
/// else a message naming the first missing (or unavailable, with its reason) backend and the
/// server's available ones.
std::string CheckSweepBackends(const attention::v1::GetServerInfoResponse& server,
                               const std::vector<std::string>& backends);

/// The PNG's title: the sweep, the server's device, the backends and the server's version, the
/// base shape (B unless the batch sweep varies it, T = `tokens` unless the seq sweep varies it,
/// N, K unless the heads sweep varies it, H, dtype, mask) and `date`.
std::string SweepTitle(const std::string& kind, const attention::v1::GetServerInfoResponse& server,
                       const ModelShape& base, int64_t tokens, const std::string& backends,
                       const std::string& date);

/// The table printed for `rows` (ends with a newline). A row with no OK request shows "n/a".
std::string FormatSweepTable(const std::string& kind, const std::vector<SweepRow>& rows);

/// The CSV of `rows`, header included (ends with a newline). A row with no OK request has empty
/// latency, rate and TFLOP/s cells (never 0); the last column, error, holds the first error
/// ("CODE: message") of any row with failed requests, else is empty.
std::string SweepCsv(const std::string& kind, const std::vector<SweepRow>& rows);

}  // namespace attn::loadgen
