#include "backends/cudnn_warmup.h"

#include <cmath>
#include <sstream>

namespace attn {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

bool ParseInt(const std::string& s, int64_t* v) {
  if (s.empty() || s.size() > 12) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  *v = std::stoll(s);
  return true;
}

}  // namespace

StatusOr<std::vector<kernels::AttentionShape>> ParseCudnnWarmup(const std::string& spec) {
  std::vector<kernels::AttentionShape> shapes;
  for (const std::string& entry : Split(spec, ';')) {
    if (entry.empty()) continue;
    const std::string where = "--cudnn-warmup entry \"" + entry + "\": ";
    const std::vector<std::string> f = Split(entry, ':');
    if (f.size() != 6) {
      return InvalidArgument(where + "expected dtype:N:K:H:mask:Tmin-Tmax (6 fields), got " +
                             std::to_string(f.size()));
    }
    kernels::AttentionShape s;
    if (f[0] == "bf16") {
      s.dtype = kernels::DType::kBFloat16;
    } else if (f[0] == "fp16") {
      s.dtype = kernels::DType::kFloat16;
    } else {
      return InvalidArgument(where + "dtype: expected bf16 or fp16, got \"" + f[0] + "\"");
    }
    int64_t n, k, h, lo, hi;
    if (!ParseInt(f[1], &n) || !ParseInt(f[2], &k) || !ParseInt(f[3], &h) || n <= 0 ||
        k <= 0 || h <= 0 || n % k != 0) {
      return InvalidArgument(where + "N:K:H: expected positive integers with N % K == 0");
    }
    if (f[4] == "none") {
      s.mask.causal = kernels::CausalAlignment::kNone;
    } else if (f[4] == "top_left") {
      s.mask.causal = kernels::CausalAlignment::kTopLeft;
    } else if (f[4] == "bottom_right") {
      s.mask.causal = kernels::CausalAlignment::kBottomRight;
    } else {
      return InvalidArgument(where + "mask: expected none, top_left or bottom_right, got \"" +
                             f[4] + "\"");
    }
    const std::vector<std::string> r = Split(f[5], '-');
    if (r.size() != 2 || !ParseInt(r[0], &lo) || !ParseInt(r[1], &hi) || lo < 1 || hi < lo ||
        hi > (int64_t{1} << 24)) {
      return InvalidArgument(where + "lengths: expected Tmin-Tmax with 1 <= Tmin <= Tmax <= 2^24");
    }
    s.batch = 1;
    s.num_heads = n;
    s.num_kv_heads = k;
    s.head_dim = h;
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)));
    int64_t t = 1;
    while (t < lo) t <<= 1;
    for (; t <= hi; t <<= 1) {
      s.max_q_len = s.max_kv_len = t;
      s.has_lengths = true;
      shapes.push_back(s);
      s.has_lengths = false;
      shapes.push_back(s);
    }
  }
  return shapes;
}

}  // namespace attn
