// attn_reference_cases: writes seeded random attention cases and the CPU reference's answers
// for the independent numpy check (tests/python/test_reference_numpy.py, DESIGN.md §4, §10).
//
// Usage: attn_reference_cases OUT_DIR [SEED]
//
// Grid: dtypes {float32, float16, bfloat16} × masks {none, top-left, bottom-right,
// bottom-right + window_left, none + window both sides} × KV grouping {K=N, K=N/4, K=1} ×
// layouts {padded with lengths, varlen} × extents {T<S, T=1, T>S}; plus hard input sets per dtype
// (q ×8, outlier channels ×20, huge magnitudes, tiny magnitudes ~1e-3, long S = 2048).
//
// Output, all little-endian raw arrays in C order:
//   <case>.q/.k/.v/.o.bin   elements of the case's dtype (float16/bfloat16 as uint16 bits)
//   <case>.lse.bin          float32, lse layout of attention_problem.h
//   manifest.json           shapes, dtype, mask, lengths, offsets, scale and file names.
// Exit status 0 on success; 1 on a usage error or when the CPU reference rejects a case.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/kernels/attention_problem.h"
#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"

namespace attn::kernels {
namespace {

/// Kinds of input values (hard sets of DESIGN.md §4).
enum class Kind { kNormal, kLogitsTimes8, kOutliers, kHuge, kTiny, kLongS };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNormal:
      return "normal";
    case Kind::kLogitsTimes8:
      return "logits_x8";
    case Kind::kOutliers:
      return "outlier_channels";
    case Kind::kHuge:
      return "huge";
    case Kind::kTiny:
      return "tiny";
    case Kind::kLongS:
      return "long_s";
  }
  return "unknown";
}

/// One case to generate.
struct Spec {
  std::string name;
  AttentionShape shape;  ///< batch, extents (upper bounds), heads, dims, dtype, mask, scale
  Kind kind = Kind::kNormal;
  bool zero_kv_entry = false;  ///< last batch entry gets kv_length 0
  uint32_t seed = 0;
};

/// A generated case: the shape resolved for its layout, lengths and encoded buffers.
struct Case {
  Spec spec;
  AttentionShape shape;
  std::vector<int32_t> q_lengths, kv_lengths;
  std::vector<int64_t> q_offsets, kv_offsets;
  std::vector<uint8_t> q, k, v, o;
  std::vector<float> lse;
};

/// Rounds `x` to `dtype` and appends its bytes.
void Append(std::vector<uint8_t>* buf, DType dtype, float x) {
  const size_t at = buf->size();
  buf->resize(at + static_cast<size_t>(DTypeSize(dtype)));
  StoreFromFloat(buf->data() + at, dtype, 0, x);
}

/// Fills `buf` with `rows` rows of `heads` × `dim` values of the case's kind. `which` is
/// 'q', 'k' or 'v' (the hard sets scale them differently).
void FillTensor(std::vector<uint8_t>* buf, int64_t rows, int64_t heads, int64_t dim, DType dtype,
                Kind kind, char which, std::mt19937* rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  buf->clear();
  buf->reserve(static_cast<size_t>(rows * heads * dim * DTypeSize(dtype)));
  for (int64_t r = 0; r < rows * heads; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      float x = nd(*rng);
      switch (kind) {
        case Kind::kLogitsTimes8:
          if (which == 'q') x *= 8.f;
          break;
        case Kind::kOutliers:
          if (which != 'v' && (d == 1 || d == dim / 2 || d == dim - 3)) x *= 20.f;
          break;
        case Kind::kHuge:
          // Logits stay finite (|logit| ~ 30·30·sqrt(H)·scale, a few thousand at most) and V is
          // large but well inside float16's range.
          x *= which == 'v' ? 1000.f : 30.f;
          break;
        case Kind::kTiny:
          x *= 1e-3f;
          break;
        default:
          break;
      }
      Append(buf, dtype, x);
    }
  }
}

/// Draws lengths and builds the buffers for `spec`, then runs the CPU reference.
bool Generate(const Spec& spec, Case* c) {
  std::mt19937 rng(spec.seed);
  c->spec = spec;
  AttentionShape s = spec.shape;
  const int64_t B = s.batch, T = s.max_q_len, S = s.max_kv_len;
  // Entry 0 uses the full extents; the others draw lengths in [1, extent].
  for (int64_t b = 0; b < B; ++b) {
    std::uniform_int_distribution<int64_t> qd(1, T), kd(1, S);
    c->q_lengths.push_back(static_cast<int32_t>(b == 0 ? T : qd(rng)));
    c->kv_lengths.push_back(static_cast<int32_t>(b == 0 ? S : kd(rng)));
  }
  if (spec.zero_kv_entry && B > 1) c->kv_lengths[B - 1] = 0;
  s.has_lengths = true;
  if (s.layout == Layout::kVarlen) {
    c->q_offsets.assign(1, 0);
    c->kv_offsets.assign(1, 0);
    s.max_q_len = 0;
    s.max_kv_len = 0;
    for (int64_t b = 0; b < B; ++b) {
      c->q_offsets.push_back(c->q_offsets.back() + c->q_lengths[b]);
      c->kv_offsets.push_back(c->kv_offsets.back() + c->kv_lengths[b]);
      s.max_q_len = std::max<int64_t>(s.max_q_len, c->q_lengths[b]);
      s.max_kv_len = std::max<int64_t>(s.max_kv_len, c->kv_lengths[b]);
    }
    s.total_q = c->q_offsets.back();
    s.total_kv = c->kv_offsets.back();
  }
  s.return_lse = true;
  c->shape = s;
  FillTensor(&c->q, s.q_rows(), s.num_heads, s.head_dim, s.dtype, spec.kind, 'q', &rng);
  FillTensor(&c->k, s.kv_rows(), s.num_kv_heads, s.head_dim, s.dtype, spec.kind, 'k', &rng);
  FillTensor(&c->v, s.kv_rows(), s.num_kv_heads, s.head_dim, s.dtype, spec.kind, 'v', &rng);
  // Poison the outputs (0xff bytes are NaN in every dtype) so an unwritten element fails.
  c->o.assign(static_cast<size_t>(s.q_elements() * DTypeSize(s.dtype)), 0xff);
  c->lse.assign(static_cast<size_t>(s.lse_elements()), std::nanf(""));

  AttentionTensors t;
  t.q = c->q.data();
  t.k = c->k.data();
  t.v = c->v.data();
  t.o = c->o.data();
  t.lse = c->lse.data();
  t.q_lengths = c->q_lengths.data();
  t.kv_lengths = c->kv_lengths.data();
  if (s.layout == Layout::kVarlen) {
    t.q_offsets = c->q_offsets.data();
    t.kv_offsets = c->kv_offsets.data();
  }
  const Status st = CpuAttention(s, t);
  if (!st.ok()) {
    std::fprintf(stderr, "attn_reference_cases: case %s: %s\n", spec.name.c_str(),
                 st.ToString().c_str());
    return false;
  }
  return true;
}

bool WriteFile(const std::filesystem::path& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  return static_cast<bool>(f);
}

template <typename T>
std::string JsonList(const std::vector<T>& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ']';
  return os.str();
}

/// One manifest entry (file names are relative to the manifest's folder).
std::string JsonCase(const Case& c) {
  const AttentionShape& s = c.shape;
  const bool varlen = s.layout == Layout::kVarlen;
  char scale[64];
  std::snprintf(scale, sizeof(scale), "%.17g", static_cast<double>(s.scale));
  std::ostringstream os;
  const std::string& n = c.spec.name;
  os << "{\"name\":\"" << n << "\",\"kind\":\"" << KindName(c.spec.kind) << "\""
     << ",\"layout\":\"" << (varlen ? "varlen" : "padded") << "\""
     << ",\"dtype\":\"" << DTypeName(s.dtype) << "\""
     << ",\"batch\":" << s.batch << ",\"max_q_len\":" << s.max_q_len
     << ",\"max_kv_len\":" << s.max_kv_len << ",\"total_q\":" << s.total_q
     << ",\"total_kv\":" << s.total_kv << ",\"num_heads\":" << s.num_heads
     << ",\"num_kv_heads\":" << s.num_kv_heads << ",\"head_dim\":" << s.head_dim << ",\"causal\":\""
     << CausalAlignmentName(s.mask.causal) << "\""
     << ",\"window_left\":" << s.mask.window_left << ",\"window_right\":" << s.mask.window_right
     << ",\"scale\":" << scale << ",\"q_lengths\":" << JsonList(c.q_lengths)
     << ",\"kv_lengths\":" << JsonList(c.kv_lengths)
     << ",\"q_offsets\":" << (varlen ? JsonList(c.q_offsets) : "null")
     << ",\"kv_offsets\":" << (varlen ? JsonList(c.kv_offsets) : "null") << ",\"files\":{"
     << "\"q\":\"" << n << ".q.bin\",\"k\":\"" << n << ".k.bin\",\"v\":\"" << n << ".v.bin\","
     << "\"o\":\"" << n << ".o.bin\",\"lse\":\"" << n << ".lse.bin\"}}";
  return os.str();
}

bool WriteCase(const std::filesystem::path& dir, const Case& c) {
  const std::string& n = c.spec.name;
  return WriteFile(dir / (n + ".q.bin"), c.q.data(), c.q.size()) &&
         WriteFile(dir / (n + ".k.bin"), c.k.data(), c.k.size()) &&
         WriteFile(dir / (n + ".v.bin"), c.v.data(), c.v.size()) &&
         WriteFile(dir / (n + ".o.bin"), c.o.data(), c.o.size()) &&
         WriteFile(dir / (n + ".lse.bin"), c.lse.data(), c.lse.size() * sizeof(float));
}

/// The grid plus the hard sets.
std::vector<Spec> AllSpecs(uint32_t seed) {
  struct NamedMask {
    const char* name;
    MaskSpec mask;
  };
  const NamedMask masks[] = {
      {"none", {CausalAlignment::kNone, -1, -1}},
      {"top_left", {CausalAlignment::kTopLeft, -1, -1}},
      {"bottom_right", {CausalAlignment::kBottomRight, -1, -1}},
      {"bottom_right_wl4", {CausalAlignment::kBottomRight, 4, -1}},
      {"none_wl3_wr2", {CausalAlignment::kNone, 3, 2}},
  };
  struct Extent {
    const char* name;
    int64_t T, S, H;
  };
  const Extent extents[] = {{"t9s23", 9, 23, 32}, {"t1s37", 1, 37, 64}, {"t13s6", 13, 6, 32}};
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const int64_t N = 8;
  std::vector<Spec> specs;
  uint32_t n = 0;
  for (DType dt : dtypes) {
    for (const NamedMask& m : masks) {
      for (int64_t K : {N, N / 4, int64_t{1}}) {
        for (Layout layout : {Layout::kPadded, Layout::kVarlen}) {
          for (const Extent& e : extents) {
            Spec sp;
            sp.shape.layout = layout;
            sp.shape.dtype = dt;
            sp.shape.batch = 3;
            sp.shape.max_q_len = e.T;
            sp.shape.max_kv_len = e.S;
            sp.shape.num_heads = N;
            sp.shape.num_kv_heads = K;
            sp.shape.head_dim = e.H;
            sp.shape.mask = m.mask;
            // Mostly the default scale; every fourth case an explicit one.
            sp.shape.scale = (n % 4 == 3) ? 0.3f : 1.f / std::sqrt(static_cast<float>(e.H));
            sp.zero_kv_entry = (n % 3 == 1);
            sp.seed = seed * 100003u + n;
            sp.name = std::string("c") + std::to_string(n) + "_" + DTypeName(dt) + "_" + m.name +
                      "_k" + std::to_string(K) + "_" +
                      (layout == Layout::kPadded ? "padded" : "varlen") + "_" + e.name;
            specs.push_back(sp);
            ++n;
          }
        }
      }
    }
  }
  // Hard sets: every kind × dtype, bottom-right (long S) or a varied mask, K = N/4.
  for (DType dt : dtypes) {
    for (Kind kind :
         {Kind::kLogitsTimes8, Kind::kOutliers, Kind::kHuge, Kind::kTiny, Kind::kLongS}) {
      Spec sp;
      sp.kind = kind;
      sp.shape.layout = (n % 2) ? Layout::kVarlen : Layout::kPadded;
      sp.shape.dtype = dt;
      sp.shape.num_heads = N;
      sp.shape.num_kv_heads = N / 4;
      sp.shape.head_dim = 64;
      sp.shape.mask = masks[n % 5].mask;
      if (kind == Kind::kLongS) {
        sp.shape.batch = 2;
        sp.shape.max_q_len = 4;
        sp.shape.max_kv_len = 2048;
        sp.shape.mask = {CausalAlignment::kBottomRight, -1, -1};
      } else {
        sp.shape.batch = 3;
        sp.shape.max_q_len = 11;
        sp.shape.max_kv_len = 29;
      }
      sp.shape.scale = 1.f / std::sqrt(static_cast<float>(sp.shape.head_dim));
      sp.seed = seed * 100003u + n;
      sp.name =
          std::string("c") + std::to_string(n) + "_" + DTypeName(dt) + "_hard_" + KindName(kind);
      specs.push_back(sp);
      ++n;
    }
  }
  return specs;
}

int Main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR [SEED]\n", argv[0]);
    return 1;
  }
  const uint32_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1) {
    std::fprintf(stderr, "attn_reference_cases: needs a little-endian host\n");
    return 1;
  }
  const std::filesystem::path dir(argv[1]);
  const uint32_t seed = argc == 3 ? static_cast<uint32_t>(std::strtoul(argv[2], nullptr, 10)) : 1;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "attn_reference_cases: cannot create %s: %s\n", argv[1],
                 ec.message().c_str());
    return 1;
  }
  std::ofstream manifest(dir / "manifest.json");
  manifest << "{\"seed\":" << seed << ",\"cases\":[\n";
  const std::vector<Spec> specs = AllSpecs(seed);
  for (size_t i = 0; i < specs.size(); ++i) {
    Case c;
    if (!Generate(specs[i], &c)) return 1;
    if (!WriteCase(dir, c)) {
      std::fprintf(stderr, "attn_reference_cases: cannot write case %s\n", c.spec.name.c_str());
      return 1;
    }
    manifest << JsonCase(c) << (i + 1 < specs.size() ? ",\n" : "\n");
  }
  manifest << "]}\n";
  manifest.close();
  if (!manifest) {
    std::fprintf(stderr, "attn_reference_cases: cannot write manifest.json\n");
    return 1;
  }
  std::printf("attn_reference_cases: wrote %zu cases to %s\n", specs.size(), argv[1]);
  return 0;
}

}  // namespace
}  // namespace attn::kernels

int main(int argc, char** argv) { return attn::kernels::Main(argc, argv); }
