#include "backends/calibration_runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"

namespace attn {
namespace {

using kernels::AttentionShape;
using kernels::DType;

double Tolerance(DType d) {
  switch (d) {
    case DType::kFloat32: return 1e-5;
    case DType::kFloat16: return 2e-3;
    case DType::kBFloat16: return 1e-2;
    case DType::kFloat8E4M3: return 6e-2;
  }
  return 0;
}

/// Random normal inputs in the shape's dtype, and their float values.
struct Inputs {
  std::vector<uint8_t> q, k, v;
};

std::vector<uint8_t> RandomTensor(int64_t n, DType d, std::mt19937_64* rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * kernels::DTypeSize(d));
  for (int64_t i = 0; i < n; ++i) {
    const float x = dist(*rng);
    if (d == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = d == DType::kBFloat16 ? kernels::FloatToBf16(x) : kernels::FloatToFp16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

double ToDouble(const uint8_t* p, DType d) {
  if (d == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::kBFloat16 ? kernels::Bf16ToFloat(h) : kernels::Fp16ToFloat(h);
}

Inputs MakeInputs(const AttentionShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.q = RandomTensor(s.q_elements(), s.dtype, &rng);
  in.k = RandomTensor(s.kv_elements(), s.dtype, &rng);
  in.v = RandomTensor(s.kv_elements(), s.dtype, &rng);
  return in;
}

AttentionTensors Tensors(const Inputs& in, std::vector<uint8_t>* o) {
  AttentionTensors t;
  t.q = in.q.data();
  t.k = in.k.data();
  t.v = in.v.data();
  t.o = o->data();
  return t;
}

/// Relative L2 error of `b` on `s` against float64, or the failure.
StatusOr<double> ParityError(Backend* b, const AttentionShape& s, uint64_t seed) {
  const Inputs in = MakeInputs(s, seed);
  std::vector<uint8_t> o(static_cast<size_t>(s.q_elements()) * kernels::DTypeSize(s.dtype));
  ExecuteTimes times;
  ATTN_RETURN_IF_ERROR(b->Execute(s, Tensors(in, &o), &times));
  std::vector<double> ref(s.q_elements());
  ATTN_RETURN_IF_ERROR(kernels::CpuAttentionF64(s, Tensors(in, &o), ref.data(), nullptr));
  double num = 0, den = 0;
  const int esz = kernels::DTypeSize(s.dtype);
  for (int64_t i = 0; i < s.q_elements(); ++i) {
    const double got = ToDouble(o.data() + esz * i, s.dtype);
    if (std::isnan(got)) return 1e300;
    num += (got - ref[i]) * (got - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

StatusOr<CalibrationTable> RunCalibration(const std::vector<Backend*>& backends,
                                          const CalibrationOptions& options,
                                          const std::string& device_key) {
  std::vector<Backend*> use;
  for (Backend* b : backends) {
    if (b->available() && b->name() != "cpu") use.push_back(b);
  }
  if (use.empty()) {
    for (Backend* b : backends) {
      if (b->available()) use.push_back(b);
    }
  }
  std::vector<CalibrationSample> samples;
  uint64_t seed = options.seed;
  for (const AttentionShape& shape : GridShapes(options.grid)) {
    const std::string bucket = BucketOf(shape, options.grid.lengths);
    std::string line;
    for (Backend* b : use) {
      CalibrationSample cs;
      cs.bucket = bucket;
      cs.backend = b->name();
      Status sup = b->Supports(shape);
      if (!sup.ok()) {
        cs.note = "unsupported: " + sup.message();
        samples.push_back(cs);
        continue;
      }
      AttentionShape small = shape;
      small.max_q_len = small.max_kv_len = std::min(shape.max_q_len, options.parity_len);
      auto err = b->Supports(small).ok() ? ParityError(b, small, ++seed)
                                         : StatusOr<double>(b->Supports(small));
      if (!err.ok()) {
        if (err.status().code() == StatusCode::kInternal) return err.status();
        cs.note = "parity run failed: " + err.status().message();
        samples.push_back(cs);
        continue;
      }
      if (!(*err <= Tolerance(shape.dtype))) {
        cs.note = "parity failed: rel_l2 " + std::to_string(*err);
        samples.push_back(cs);
        continue;
      }
      const Inputs in = MakeInputs(shape, ++seed);
      std::vector<uint8_t> o(static_cast<size_t>(shape.q_elements()) *
                             kernels::DTypeSize(shape.dtype));
      std::vector<double> us;
      Status run_status;
      for (int r = 0; r <= options.reps && run_status.ok(); ++r) {
        ExecuteTimes t;
        run_status = b->Execute(shape, Tensors(in, &o), &t);
        if (r > 0) us.push_back(static_cast<double>(t.kernel_us));  // run 0 warms up
      }
      if (!run_status.ok()) {
        if (run_status.code() == StatusCode::kInternal) return run_status;
        cs.note = "timing run failed: " + run_status.message();
        samples.push_back(cs);
        continue;
      }
      std::sort(us.begin(), us.end());
      cs.parity_ok = true;
      cs.median_us = us.empty() ? 0 : us[us.size() / 2];
      line += " " + b->name() + "=" + std::to_string(static_cast<int64_t>(cs.median_us)) + "us";
      samples.push_back(cs);
    }
    spdlog::info("calibration {}:{}", bucket, line.empty() ? " no backend" : line);
  }
  return SelectFastest(samples, options.grid.lengths, device_key);
}

}  // namespace attn
