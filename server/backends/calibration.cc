#include "backends/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace attn {
namespace {

using kernels::AttentionShape;
using kernels::CausalAlignment;
using kernels::DType;

const char* DShort(DType d) {
  switch (d) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "e4m3";
  }
  return "?";
}

const char* MaskShort(const kernels::MaskSpec& m) {
  const bool win =
      m.window_left >= 0 || (m.causal == CausalAlignment::kNone && m.window_right >= 0);
  switch (m.causal) {
    case CausalAlignment::kTopLeft: return win ? "tl+win" : "tl";
    case CausalAlignment::kBottomRight: return win ? "br+win" : "br";
    default: return win ? "none+win" : "none";
  }
}

}  // namespace

std::string GroupClass(int64_t n, int64_t k) {
  if (k == n) return "mha";
  if (k == 1) return "mqa";
  return "gqa";
}

std::string BucketOf(const AttentionShape& s, const std::vector<int64_t>& lengths) {
  const int64_t len = std::max<int64_t>(1, std::max(s.max_q_len, s.max_kv_len));
  int64_t cls = len;
  double best = 1e300;
  for (int64_t l : lengths) {
    const double d =
        std::fabs(std::log2(static_cast<double>(l)) - std::log2(static_cast<double>(len)));
    if (d < best - 1e-9 || (std::fabs(d - best) <= 1e-9 && l > cls)) {
      best = d;
      cls = l;
    }
  }
  std::ostringstream o;
  o << DShort(s.dtype) << " h" << s.head_dim << ' ' << GroupClass(s.num_heads, s.num_kv_heads)
    << ' ' << MaskShort(s.mask) << ' '
    << (s.layout == kernels::Layout::kVarlen ? "varlen" : "padded") << " L" << cls;
  return o.str();
}

std::string CalibrationTable::ChoiceFor(const AttentionShape& shape, std::string* bucket) const {
  const std::string b = BucketOf(shape, lengths);
  if (bucket) *bucket = b;
  auto it = choice.find(b);
  return it == choice.end() ? std::string() : it->second;
}

CalibrationTable SelectFastest(const std::vector<CalibrationSample>& samples,
                               const std::vector<int64_t>& lengths, std::string device_key) {
  CalibrationTable t;
  t.device_key = std::move(device_key);
  t.lengths = lengths;
  std::map<std::string, double> best;
  for (const CalibrationSample& s : samples) {
    t.samples[s.bucket].push_back(s);
    if (!s.parity_ok) continue;
    auto it = best.find(s.bucket);
    if (it == best.end() || s.median_us < it->second) {
      best[s.bucket] = s.median_us;
      t.choice[s.bucket] = s.backend;
    }
  }
  return t;
}

std::string CalibrationDeviceKey(const std::string& device_name, const std::string& driver,
                                 const std::string& build) {
  return device_name + "|driver " + driver + "|" + build;
}

std::string CalibrationToJson(const CalibrationTable& t) {
  nlohmann::json j;
  j["device_key"] = t.device_key;
  j["lengths"] = t.lengths;
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& [bucket, samples] : t.samples) {
    nlohmann::json b;
    b["bucket"] = bucket;
    auto c = t.choice.find(bucket);
    b["choice"] = c == t.choice.end() ? "" : c->second;
    nlohmann::json arr = nlohmann::json::array();
    for (const CalibrationSample& s : samples) {
      arr.push_back({{"backend", s.backend},
                     {"parity_ok", s.parity_ok},
                     {"median_us", s.median_us},
                     {"note", s.note}});
    }
    b["samples"] = arr;
    buckets.push_back(b);
  }
  j["buckets"] = buckets;
  return j.dump(1);
}

StatusOr<CalibrationTable> CalibrationFromJson(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    std::vector<CalibrationSample> samples;
    for (const auto& b : j.at("buckets")) {
      for (const auto& s : b.at("samples")) {
        CalibrationSample cs;
        cs.bucket = b.at("bucket").get<std::string>();
        cs.backend = s.at("backend").get<std::string>();
        cs.parity_ok = s.at("parity_ok").get<bool>();
        cs.median_us = s.at("median_us").get<double>();
        cs.note = s.value("note", "");
        samples.push_back(cs);
      }
    }
    CalibrationTable t = SelectFastest(samples, j.at("lengths").get<std::vector<int64_t>>(),
                                       j.at("device_key").get<std::string>());
    // The stored choice must agree with the samples (a hand-edited file is caught here).
    for (const auto& b : j.at("buckets")) {
      const std::string stored = b.value("choice", "");
      auto it = t.choice.find(b.at("bucket").get<std::string>());
      const std::string derived = it == t.choice.end() ? "" : it->second;
      if (stored != derived) {
        return InvalidArgument("calibration file: bucket \"" + b.at("bucket").get<std::string>() +
                               "\" stores choice \"" + stored + "\" but its samples give \"" +
                               derived + "\"");
      }
    }
    return t;
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("calibration file: ") + e.what());
  }
}

Status SaveCalibration(const std::string& path, const CalibrationTable& table) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Unavailable("cannot write " + tmp);
    out << CalibrationToJson(table) << "\n";
    if (!out) return Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Unavailable("cannot rename to " + path);
  return Status::Ok();
}

StatusOr<CalibrationTable> LoadCalibration(const std::string& path,
                                           const std::string& device_key) {
  std::ifstream in(path);
  if (!in) return NotFound("no calibration file at " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto t = CalibrationFromJson(ss.str());
  if (!t.ok()) return t.status();
  if (t->device_key != device_key) {
    return FailedPrecondition("calibration file " + path + " is for \"" + t->device_key +
                              "\", this server is \"" + device_key + "\"");
  }
  return t;
}

int64_t RepresentativeLength(int64_t length_class) {
  return std::max<int64_t>(1, length_class * 3 / 4);
}

std::vector<AttentionShape> GridShapes(const CalibrationGrid& g) {
  std::vector<AttentionShape> out;
  for (DType d : g.dtypes) {
    for (int64_t h : g.head_dims) {
      for (const std::string& grp : g.groups) {
        for (CausalAlignment m : g.masks) {
          for (int64_t len : g.lengths) {
            AttentionShape s;
            s.dtype = d;
            s.batch = 1;
            s.max_q_len = s.max_kv_len = RepresentativeLength(len);
            s.num_heads = 16;
            s.num_kv_heads = grp == "mha" ? 16 : (grp == "mqa" ? 1 : 4);
            s.head_dim = h;
            s.mask.causal = m;
            s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)));
            out.push_back(s);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace attn
