// `attention-loadgen sweep`: the codelab's tables. For each point of a sequence-length, batch or
// head-layout (MHA/GQA/MQA) sweep and each backend, a short closed-loop fixed workload; a table,
// a CSV and (through plot_sweep.py / matplotlib) a PNG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
std::vector<SweepPoint> SweepPoints(const std::string& kind, const ModelShape& base,
                                    int64_t tokens, const std::vector<int64_t>& seqs,
                                    const std::vector<int64_t>& batches, std::string* error);

/// One measured (point, backend).
struct SweepRow {
  SweepPoint point;
  std::string backend;
  Report report;
};

/// The table printed for `rows` (ends with a newline).
std::string FormatSweepTable(const std::string& kind, const std::vector<SweepRow>& rows);

/// The CSV of `rows`, header included (ends with a newline).
std::string SweepCsv(const std::string& kind, const std::vector<SweepRow>& rows);

}  // namespace attn::loadgen
