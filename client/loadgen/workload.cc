#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>

#include "loadgen/dtype_codec.h"
#include "loadgen/random_normal.h"

namespace attn::loadgen {
namespace {

void FillTensor(attention::v1::Tensor* tensor, attention::v1::DType dtype,
                const std::vector<int64_t>& shape, NormalGenerator* rng,
                std::vector<float>* scratch) {
  tensor->set_dtype(dtype);
  int64_t count = 1;
  for (int64_t extent : shape) {
    tensor->add_shape(extent);
    count *= extent;
  }
  scratch->resize(static_cast<size_t>(count));
  rng->Fill(scratch->data(), count);
  std::string* data = tensor->mutable_data();
  data->clear();
  data->reserve(static_cast<size_t>(count) * DTypeSize(dtype));
  EncodeValues(scratch->data(), count, dtype, data);
}

}  // namespace

std::string ValidateShape(const ModelShape& shape) {
  if (shape.batch < 1) return "--batch must be >= 1";
  if (shape.heads < 1) return "--heads must be >= 1";
  if (shape.kv_heads < 1) return "--kv-heads must be >= 1";
  if (shape.head_dim < 1) return "--head-dim must be >= 1";
  if (shape.heads % shape.kv_heads != 0) {
    return "--heads (" + std::to_string(shape.heads) + ") must be a multiple of --kv-heads (" +
           std::to_string(shape.kv_heads) + ")";
  }
  return "";
}

int64_t ScaleTokens(int64_t tokens, const TokenScaling& scaling) {
  const double scaled = std::round(static_cast<double>(tokens) * scaling.scale);
  const double clamped = std::clamp(scaled, static_cast<double>(scaling.min_tokens),
                                    static_cast<double>(scaling.max_tokens));
  return static_cast<int64_t>(clamped);
}

RequestPlan::RequestPlan(std::vector<TraceRecord> rows, const TokenScaling& scaling,
                         double time_scale)
    : rows_(std::move(rows)), scaling_(scaling), time_scale_(time_scale) {
  if (rows_.size() >= 2) {
    const double span = rows_.back().time_s - rows_.front().time_s;
    cycle_s_ = span + span / static_cast<double>(rows_.size() - 1);
  }
}

RequestPlan RequestPlan::Fixed(int64_t tokens) {
  RequestPlan plan;
  TraceRecord row;
  row.context_tokens = tokens;
  plan.rows_.push_back(row);
  plan.scaling_.min_tokens = tokens;
  plan.scaling_.max_tokens = tokens;
  return plan;
}

PlannedRequest RequestPlan::At(int64_t index) const {
  const int64_t n = rows();
  const TraceRecord& row = rows_[static_cast<size_t>(index % n)];
  PlannedRequest planned;
  planned.tokens = ScaleTokens(row.context_tokens, scaling_);
  if (time_scale_ > 0) {
    planned.scheduled = true;
    const double trace_offset =
        row.time_s - rows_.front().time_s + static_cast<double>(index / n) * cycle_s_;
    planned.send_offset_s = trace_offset * time_scale_;
  }
  return planned;
}

void BuildAttendRequest(const ModelShape& shape, int64_t tokens, uint64_t seed,
                        attention::v1::AttendRequest* request) {
  request->Clear();
  request->set_layout(attention::v1::LAYOUT_PADDED);
  NormalGenerator rng(seed);
  std::vector<float> scratch;
  FillTensor(request->mutable_q(), shape.dtype, {shape.batch, tokens, shape.heads, shape.head_dim},
             &rng, &scratch);
  FillTensor(request->mutable_k(), shape.dtype,
             {shape.batch, tokens, shape.kv_heads, shape.head_dim}, &rng, &scratch);
  FillTensor(request->mutable_v(), shape.dtype,
             {shape.batch, tokens, shape.kv_heads, shape.head_dim}, &rng, &scratch);
  request->mutable_mask()->set_causal(shape.causal);
  request->set_backend(shape.backend);
  request->set_return_lse(shape.return_lse);
}

bool ShouldVerify(uint64_t seed, int64_t index, double fraction) {
  if (fraction <= 0) return false;
  if (fraction >= 1) return true;
  const uint64_t h = SplitMix64(seed ^ SplitMix64(0x5eedf00dull + static_cast<uint64_t>(index)));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

uint64_t RequestSeed(uint64_t seed, int64_t index) {
  return SplitMix64(SplitMix64(seed) + static_cast<uint64_t>(index));
}

}  // namespace attn::loadgen
