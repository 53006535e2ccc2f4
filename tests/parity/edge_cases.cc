// Edge cases for the parity harness (edge_cases.h).
#include "edge_cases.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/kernels/host_dtype.h"

namespace attn::parity {
namespace {

using kernels::AttentionShape;
using kernels::CausalAlignment;
using kernels::DType;
using kernels::Layout;

AttentionShape Shape(DType dtype, int64_t H, int64_t B, int64_t T, int64_t S, int64_t N, int64_t K,
                     CausalAlignment causal, int64_t wl = -1, int64_t wr = -1) {
  AttentionShape s;
  s.layout = Layout::kPadded;
  s.dtype = dtype;
  s.batch = B;
  s.max_q_len = T;
  s.max_kv_len = S;
  s.num_heads = N;
  s.num_kv_heads = K;
  s.head_dim = H;
  s.mask.causal = causal;
  s.mask.window_left = wl;
  s.mask.window_right = wr;
  s.return_lse = true;
  return s;
}

void Fill(std::vector<uint8_t>* buf, DType dtype, float value) {
  const int64_t n = static_cast<int64_t>(buf->size()) / kernels::DTypeSize(dtype);
  for (int64_t i = 0; i < n; ++i) kernels::StoreFromFloat(buf->data(), dtype, i, value);
}

/// Sets element d of key j (every kv head) of batch entry b in a padded (B, S, K, H) tensor.
void SetKey(std::vector<uint8_t>* buf, const AttentionShape& s, int64_t b, int64_t j, int64_t d,
            float value) {
  for (int64_t kh = 0; kh < s.num_kv_heads; ++kh) {
    const int64_t i = ((b * s.max_kv_len + j) * s.num_kv_heads + kh) * s.head_dim + d;
    kernels::StoreFromFloat(buf->data(), s.dtype, i, value);
  }
}

float LargeConstant(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 133120.f;  // the public report's value: logits ~1e12 at H = 64
    case DType::kFloat16:
      return 200.f;  // logits ~2.6e6 at H = 64
    default:
      return 1e6f;
  }
}

}  // namespace

std::vector<HostCase> EdgeCases(const EdgeOptions& options) {
  std::vector<HostCase> cases;
  uint64_t seed = options.seed;
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  auto named = [&](HostCase c, const std::string& what) {
    c.name = "edge: " + what + " | " + c.name;
    cases.push_back(std::move(c));
  };
  for (DType dt : options.dtypes) {
    for (int64_t H : options.head_dims) {
      const float big = LargeConstant(dt);
      // Large magnitudes: q = k = v = C with one key (exactly v), and q = k = C with 2 and 128
      // keys and random v (the softmax is uniform: the mean of v).
      for (int64_t S : {1, 2, 128}) {
        HostCase c = MakeCase(Shape(dt, H, 1, 1, S, 1, 1, CausalAlignment::kNone),
                              InputKind::kNormal, seed++, false);
        Fill(&c.q, dt, big);
        Fill(&c.k, dt, big);
        if (S == 1) Fill(&c.v, dt, big);
        named(std::move(c), "constant " + std::to_string(big) + " S=" + std::to_string(S));
      }
      {  // Several query rows and heads (GQA), causal: row 0 sees one key.
        HostCase c = MakeCase(Shape(dt, H, 1, 130, 130, 4, 2, CausalAlignment::kTopLeft),
                              InputKind::kNormal, seed++, false);
        Fill(&c.q, dt, big);
        Fill(&c.k, dt, big);
        named(std::move(c), "constant q,k causal");
      }
      if (dt != DType::kFloat32) {
        // Very negative finite logits: q = +C, k = −C + N(0, 1). Not float32: at logits of
        // ~1e5 the fp32 accumulation error alone exceeds its 1e-5 tolerance (ill-conditioned).
        HostCase c = MakeCase(Shape(dt, H, 2, 17, 130, 4, 4, CausalAlignment::kBottomRight),
                              InputKind::kNormal, seed++, false);
        const float c0 = dt == DType::kFloat16 ? 100.f : 300.f;
        Fill(&c.q, dt, c0);
        const int64_t nk = static_cast<int64_t>(c.k.size()) / kernels::DTypeSize(dt);
        for (int64_t i = 0; i < nk; ++i) {
          const float x = kernels::LoadAsFloat(c.k.data(), dt, i);
          kernels::StoreFromFloat(c.k.data(), dt, i, -c0 + x);
        }
        named(std::move(c), "very negative logits");
      }
      if (options.include_nonfinite) {
        // Non-finite K/V at keys some rows cannot see. `keys`: positions poisoned in V (and in
        // K too when `also_k`), with NaN, +Inf or -Inf in a few dims.
        struct Poison {
          const char* what;
          int64_t B, T, S, N, K;
          CausalAlignment causal;
          int64_t wl;
          std::vector<int64_t> keys;
        };
        const std::vector<Poison> poisons = {
            {"top-left T=S=8 key 7", 1, 8, 8, 1, 1, CausalAlignment::kTopLeft, -1, {7}},
            {"top-left T=8 S=20", 1, 8, 20, 2, 1, CausalAlignment::kTopLeft, -1, {5, 12, 19}},
            {"top-left T=S=200", 1, 200, 200, 4, 2, CausalAlignment::kTopLeft, -1, {70, 150, 199}},
            {"bottom-right T=5 S=130",
             2,
             5,
             130,
             8,
             2,
             CausalAlignment::kBottomRight,
             -1,
             {126, 129}},
            {"bottom-right T=S=100 window 2",
             1,
             100,
             100,
             2,
             2,
             CausalAlignment::kBottomRight,
             2,
             {0, 10, 64}},
        };
        const float values[] = {kNaN, kInf, -kInf};
        int vi = 0;
        for (const Poison& p : poisons) {
          for (bool also_k : {false, true}) {
            HostCase c = MakeCase(Shape(dt, H, p.B, p.T, p.S, p.N, p.K, p.causal, p.wl),
                                  InputKind::kNormal, seed++, false);
            const float val = values[vi++ % 3];
            for (int64_t b = 0; b < p.B; ++b)
              for (int64_t j : p.keys) {
                SetKey(&c.v, c.shape, b, j, 0, val);
                SetKey(&c.v, c.shape, b, j, H - 1, kNaN);
                if (also_k) SetKey(&c.k, c.shape, b, j, 1, val);
              }
            named(std::move(c), std::string("non-finite at masked keys: ") + p.what +
                                    (also_k ? " (k and v)" : " (v)"));
          }
        }
        // Past kv_lengths (padding): every K/V element of the padding keys NaN or +Inf.
        for (CausalAlignment ca : {CausalAlignment::kNone, CausalAlignment::kBottomRight}) {
          AttentionShape s = Shape(dt, H, 3, 9, 150, 4, 1, ca);
          s.has_lengths = true;
          HostCase c = MakeCase(s, InputKind::kNormal, seed++, false);
          c.kv_lengths = {150, 77, 130};
          c.q_lengths = {9, 9, 4};
          for (int64_t b = 0; b < 3; ++b)
            for (int64_t j = c.kv_lengths[b]; j < 150; ++j)
              for (int64_t d = 0; d < H; ++d) {
                SetKey(&c.v, c.shape, b, j, d, (j & 1) ? kNaN : kInf);
                SetKey(&c.k, c.shape, b, j, d, (j & 1) ? kInf : kNaN);
              }
          named(std::move(c), "non-finite past kv_lengths");
        }
      }
      // Very wide windows ("unbounded"), T != S both ways, every alignment.
      const int64_t kWide[] = {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40,
                               std::numeric_limits<int64_t>::max()};
      for (int64_t w : kWide) {
        for (auto ts : {std::pair<int64_t, int64_t>{6, 3}, {3, 6}}) {
          named(MakeCase(Shape(dt, H, 1, ts.first, ts.second, 2, 2, CausalAlignment::kNone, w, w),
                         InputKind::kNormal, seed++, false),
                "wide window both sides " + std::to_string(w));
          named(
              MakeCase(Shape(dt, H, 1, ts.first, ts.second, 2, 2, CausalAlignment::kBottomRight, w),
                       InputKind::kNormal, seed++, false),
              "wide window left, bottom-right " + std::to_string(w));
          named(MakeCase(Shape(dt, H, 1, ts.first, ts.second, 2, 2, CausalAlignment::kTopLeft, w),
                         InputKind::kNormal, seed++, false),
                "wide window left, top-left " + std::to_string(w));
        }
      }
    }
  }
  return cases;
}

}  // namespace attn::parity
