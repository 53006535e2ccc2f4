// PackedAttend (server/batching/attend_coalescer.h): a batch of Attend problems packed into one
// varlen launch on the cpu backend gives each request bitwise the output (and lse) it gets
// alone, for random compositions and orders of padded (with and without lengths) and varlen
// requests, every mask kind, GQA, fp32 and bf16. Plan + PackInto + ScatterFrom (into and out of
// buffers the caller names, as a GPU lane's staging) and Pack + Scatter write bitwise what the
// Pack and Scatter of before issue 17 wrote (attend_coalescer_reference.h), for fp32, fp16 and
// bf16; the default Backend::ExecuteStaged (the host-vector path) gives bitwise Pack + Execute +
// Scatter and never unpacks a failed launch.
#include "batching/attend_coalescer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attend_coalescer_reference.h"
#include "attn/kernels/host_dtype.h"
#include "backends/cpu_backend.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;

struct Shape {
  int64_t N = 4, K = 2, H = 16;
  pb::DType dtype = pb::FLOAT32;
  pb::CausalAlignment causal = pb::CAUSAL_NONE;
  int64_t window_left = -1;
  bool lse = false;
};

void Fill(pb::Tensor* t, pb::DType dtype, std::vector<int64_t> shape, std::mt19937_64* rng) {
  t->set_dtype(dtype);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  const kernels::DType kd = dtype == pb::FLOAT32   ? kernels::DType::kFloat32
                            : dtype == pb::FLOAT16 ? kernels::DType::kFloat16
                                                   : kernels::DType::kBFloat16;
  t->mutable_data()->resize(static_cast<size_t>(n * kernels::DTypeSize(kd)));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) {
    kernels::StoreFromFloat(t->mutable_data()->data(), kd, i, normal(*rng));
  }
}

pb::AttendRequest RandomRequest(const Shape& s, std::mt19937_64* rng) {
  pb::AttendRequest r;
  std::uniform_int_distribution<int> kind(0, 2), len(1, 9), batch(1, 3);
  auto* m = r.mutable_mask();
  m->set_causal(s.causal);
  if (s.window_left >= 0) m->set_window_left(s.window_left);
  r.set_return_lse(s.lse);
  const int k = kind(*rng);
  const int64_t B = batch(*rng);
  if (k == 2) {  // varlen
    r.set_layout(pb::LAYOUT_VARLEN);
    int64_t tq = 0, tk = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int q = len(*rng) - 1, kv = len(*rng) - 1;  // zero lengths included
      r.add_q_lengths(q);
      r.add_kv_lengths(kv);
      tq += q;
      tk += kv;
    }
    if (tq == 0) {  // tensors need an extent >= 1
      r.set_q_lengths(0, 1);
      tq = 1;
    }
    if (tk == 0) {
      r.set_kv_lengths(0, 1);
      tk = 1;
    }
    Fill(r.mutable_q(), s.dtype, {tq, s.N, s.H}, rng);
    Fill(r.mutable_k(), s.dtype, {tk, s.K, s.H}, rng);
    Fill(r.mutable_v(), s.dtype, {tk, s.K, s.H}, rng);
  } else {  // padded, with (k == 1) or without lengths
    r.set_layout(pb::LAYOUT_PADDED);
    const int64_t T = len(*rng), S = len(*rng);
    Fill(r.mutable_q(), s.dtype, {B, T, s.N, s.H}, rng);
    Fill(r.mutable_k(), s.dtype, {B, S, s.K, s.H}, rng);
    Fill(r.mutable_v(), s.dtype, {B, S, s.K, s.H}, rng);
    if (k == 1) {
      std::uniform_int_distribution<int64_t> tl(0, T), sl(0, S);
      for (int64_t b = 0; b < B; ++b) {
        r.add_q_lengths(static_cast<int32_t>(tl(*rng)));
        r.add_kv_lengths(static_cast<int32_t>(sl(*rng)));
      }
    }
  }
  return r;
}

struct Output {
  std::string o;
  std::vector<float> lse;
};

Output RunAlone(CpuBackend* cpu, const ValidatedAttend& v) {
  Output out;
  out.o.assign(v.o_bytes, '\x55');  // garbage: every byte must be written
  if (v.shape.return_lse) out.lse.assign(static_cast<size_t>(v.shape.lse_elements()), 7.f);
  ExecuteTimes t;
  Status s = cpu->Execute(v.shape, v.Tensors(out.o.data(), v.shape.return_lse ? out.lse.data()
                                                                              : nullptr),
                          &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(AttendCoalescer, BatchedEqualsAloneBitwiseForRandomCompositions) {
  CpuBackend cpu(1);
  std::mt19937_64 rng(20240601);
  std::vector<Shape> shapes;
  for (pb::DType dt : {pb::FLOAT32, pb::BFLOAT16}) {
    for (pb::CausalAlignment c : {pb::CAUSAL_NONE, pb::CAUSAL_TOP_LEFT, pb::CAUSAL_BOTTOM_RIGHT}) {
      for (bool lse : {false, true}) {
        Shape s;
        s.dtype = dt;
        s.causal = c;
        s.lse = lse;
        s.window_left = c == pb::CAUSAL_BOTTOM_RIGHT ? 3 : -1;
        shapes.push_back(s);
      }
    }
  }
  Shape mqa;
  mqa.K = 1;
  mqa.lse = true;
  shapes.push_back(mqa);
  int checked = 0;
  for (const Shape& shape : shapes) {
    for (int trial = 0; trial < 6; ++trial) {
      const int parts = std::uniform_int_distribution<int>(1, 6)(rng);
      std::vector<pb::AttendRequest> requests;
      for (int i = 0; i < parts; ++i) requests.push_back(RandomRequest(shape, &rng));
      std::shuffle(requests.begin(), requests.end(), rng);
      std::vector<ValidatedAttend> validated;
      for (const auto& r : requests) {
        auto v = ValidateAttend(r);
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        validated.push_back(std::move(*v));
      }
      std::vector<const ValidatedAttend*> ptrs;
      for (const auto& v : validated) {
        ptrs.push_back(&v);
        EXPECT_EQ(AttendSignature(v, "cpu"), AttendSignature(validated[0], "cpu"));
      }
      auto packed = PackedAttend::Pack(ptrs);
      ASSERT_TRUE(packed.ok()) << packed.status().ToString();
      int64_t tokens = 0;
      for (const auto& v : validated) tokens += v.query_tokens;
      EXPECT_EQ(packed->query_tokens(), tokens);
      ASSERT_TRUE(cpu.Supports(packed->shape()).ok());
      ExecuteTimes t;
      ASSERT_TRUE(cpu.Execute(packed->shape(), packed->Tensors(), &t).ok());
      for (size_t i = 0; i < validated.size(); ++i) {
        const ValidatedAttend& v = validated[i];
        const Output alone = RunAlone(&cpu, v);
        Output batched;
        batched.o.assign(v.o_bytes, '\x55');
        if (v.shape.return_lse) {
          batched.lse.assign(static_cast<size_t>(v.shape.lse_elements()), 7.f);
        }
        packed->Scatter(i, v, batched.o.data(), v.shape.return_lse ? batched.lse.data() : nullptr);
        ASSERT_EQ(batched.o, alone.o) << "part " << i << " of " << validated.size();
        ASSERT_EQ(batched.lse.size(), alone.lse.size());
        if (!batched.lse.empty()) {  // memcmp of two null pointers is undefined
          EXPECT_EQ(0, std::memcmp(batched.lse.data(), alone.lse.data(),
                                   batched.lse.size() * sizeof(float)))
              << "lse of part " << i;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(AttendCoalescer, SignatureSeparatesWhatCannotShareALaunch) {
  std::mt19937_64 rng(3);
  Shape base;
  auto sig = [&](Shape s, const std::string& backend = "cpu", float scale = 0.f) {
    pb::AttendRequest r = RandomRequest(s, &rng);
    if (scale > 0.f) r.set_scale(scale);
    auto v = ValidateAttend(r);
    EXPECT_TRUE(v.ok());
    return AttendSignature(*v, backend);
  };
  const std::string a = sig(base);
  EXPECT_EQ(a, sig(base));  // layout and lengths do not matter
  Shape other = base;
  other.K = 1;
  EXPECT_NE(a, sig(other));
  other = base;
  other.causal = pb::CAUSAL_TOP_LEFT;
  EXPECT_NE(a, sig(other));
  other = base;
  other.window_left = 2;
  EXPECT_NE(a, sig(other));
  other = base;
  other.lse = true;
  EXPECT_NE(a, sig(other));
  other = base;
  other.dtype = pb::BFLOAT16;
  EXPECT_NE(a, sig(other));
  EXPECT_NE(a, sig(base, "naive"));
  EXPECT_NE(a, sig(base, "cpu", 0.5f));
}

/// A backend that only answers what MayCoalesce asks.
class CoalescableProbe final : public Backend {
 public:
  explicit CoalescableProbe(bool coalescable) : coalescable_(coalescable) {}
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override { return {}; }
  Status Supports(const AttentionShape&) const override { return Status::Ok(); }
  Status Execute(const AttentionShape&, const AttentionTensors&, ExecuteTimes*) override {
    return Internal("not for execution");
  }
  bool coalescable() const override { return coalescable_; }

 private:
  const std::string name_ = "probe";
  const bool coalescable_;
};

TEST(AttendCoalescer, LaunchDependentBackendsAndFp8InputsRunAlone) {
  std::mt19937_64 rng(5);
  Shape base;
  base.dtype = pb::BFLOAT16;
  auto v = ValidateAttend(RandomRequest(base, &rng));
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(MayCoalesce(*v, CoalescableProbe(true)));
  EXPECT_FALSE(MayCoalesce(*v, CoalescableProbe(false)));  // e.g. fp8: amax of the whole launch
  ValidatedAttend e4m3 = *v;
  e4m3.shape.dtype = kernels::DType::kFloat8E4M3;
  EXPECT_FALSE(MayCoalesce(e4m3, CoalescableProbe(true)));
}

TEST(AttendCoalescer, PackRefusesIncompatibleParts) {
  std::mt19937_64 rng(4);
  Shape a, b;
  b.causal = pb::CAUSAL_TOP_LEFT;
  auto va = ValidateAttend(RandomRequest(a, &rng));
  auto vb = ValidateAttend(RandomRequest(b, &rng));
  ASSERT_TRUE(va.ok() && vb.ok());
  auto packed = PackedAttend::Pack({&*va, &*vb});
  EXPECT_EQ(packed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PackedAttend::Pack({}).status().code(), StatusCode::kInvalidArgument);
}

// Random compositions of 1..6 requests of one signature, over dtypes, lse and masks.
std::vector<std::vector<pb::AttendRequest>> RandomBatches(std::mt19937_64* rng) {
  std::vector<std::vector<pb::AttendRequest>> batches;
  for (pb::DType dt : {pb::FLOAT32, pb::FLOAT16, pb::BFLOAT16}) {
    for (bool lse : {false, true}) {
      for (pb::CausalAlignment c : {pb::CAUSAL_NONE, pb::CAUSAL_BOTTOM_RIGHT}) {
        Shape s;
        s.dtype = dt;
        s.lse = lse;
        s.causal = c;
        for (int trial = 0; trial < 4; ++trial) {
          const int parts = std::uniform_int_distribution<int>(1, 6)(*rng);
          std::vector<pb::AttendRequest> batch;
          for (int i = 0; i < parts; ++i) batch.push_back(RandomRequest(s, rng));
          batches.push_back(std::move(batch));
        }
      }
    }
  }
  return batches;
}

std::vector<ValidatedAttend> ValidateAll(const std::vector<pb::AttendRequest>& requests) {
  std::vector<ValidatedAttend> out;
  for (const auto& r : requests) {
    auto v = ValidateAttend(r);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    if (v.ok()) out.push_back(std::move(*v));
  }
  return out;
}

std::vector<const ValidatedAttend*> Pointers(const std::vector<ValidatedAttend>& validated) {
  std::vector<const ValidatedAttend*> ptrs;
  for (const auto& v : validated) ptrs.push_back(&v);
  return ptrs;
}

bool SameBytes(const void* a, const void* b, size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

TEST(AttendCoalescer, PackIntoAndScatterFromAreBitwiseTheOldPackAndScatter) {
  std::mt19937_64 rng(20250117);
  constexpr unsigned char kPoison = 0xA5;
  constexpr size_t kSlack = 64;  // poisoned bytes past each buffer's end: never written
  int checked = 0;
  for (const auto& requests : RandomBatches(&rng)) {
    const std::vector<ValidatedAttend> validated = ValidateAll(requests);
    ASSERT_EQ(validated.size(), requests.size());
    const auto ptrs = Pointers(validated);
    const reference::OldPacked old = reference::OldPack(ptrs);
    auto plan = PackedAttend::Plan(ptrs);
    auto packed = PackedAttend::Pack(ptrs);
    ASSERT_TRUE(plan.ok() && packed.ok());
    const kernels::AttentionShape& s = plan->shape();
    ASSERT_EQ(s.total_q, old.total_q);
    ASSERT_EQ(s.total_kv, old.total_kv);
    ASSERT_EQ(s.batch, static_cast<int64_t>(old.q_lengths.size()));
    const kernels::AttentionTensors index = plan->IndexTensors();
    EXPECT_EQ(index.q, nullptr);
    EXPECT_EQ(index.o, nullptr);
    const size_t B = static_cast<size_t>(s.batch);
    EXPECT_TRUE(SameBytes(index.q_lengths, old.q_lengths.data(), B * sizeof(int32_t)));
    EXPECT_TRUE(SameBytes(index.kv_lengths, old.kv_lengths.data(), B * sizeof(int32_t)));
    EXPECT_TRUE(SameBytes(index.q_offsets, old.q_offsets.data(), (B + 1) * sizeof(int64_t)));
    EXPECT_TRUE(SameBytes(index.kv_offsets, old.kv_offsets.data(), (B + 1) * sizeof(int64_t)));

    // PackInto poisoned buffers (as a lane's staging): the old Pack's bytes, nothing past them;
    // Pack (Plan + its own buffers) holds the same bytes.
    const size_t q_bytes = static_cast<size_t>(s.total_q) * old.q_row;
    const size_t kv_bytes = static_cast<size_t>(s.total_kv) * old.kv_row;
    std::vector<unsigned char> q(q_bytes + kSlack, kPoison), k(kv_bytes + kSlack, kPoison),
        v(kv_bytes + kSlack, kPoison);
    plan->PackInto(ptrs, q.data(), k.data(), v.data());
    const kernels::AttentionTensors own = packed->Tensors();
    for (const auto& [got, want, bytes] :
         {std::tuple{q.data(), old.q.data(), q_bytes}, std::tuple{k.data(), old.k.data(), kv_bytes},
          std::tuple{v.data(), old.v.data(), kv_bytes}}) {
      ASSERT_TRUE(SameBytes(got, want, bytes));
      for (size_t b = bytes; b < bytes + kSlack; ++b) ASSERT_EQ(got[b], kPoison) << b;
    }
    ASSERT_TRUE(SameBytes(own.q, old.q.data(), q_bytes));
    ASSERT_TRUE(SameBytes(own.k, old.k.data(), kv_bytes));
    ASSERT_TRUE(SameBytes(own.v, old.v.data(), kv_bytes));

    // A random packed "backend output": ScatterFrom, and Scatter from Pack's buffers holding
    // the same bytes, write what the old Scatter writes, into destinations of garbage.
    std::vector<char> o_src(std::max<size_t>(1, q_bytes));
    for (auto& b : o_src) b = static_cast<char>(rng());
    std::vector<float> lse_src(s.return_lse ? static_cast<size_t>(s.lse_elements()) : 0);
    for (auto& x : lse_src) x = std::normal_distribution<float>()(rng);
    std::memcpy(own.o, o_src.data(), q_bytes);
    if (s.return_lse) std::memcpy(own.lse, lse_src.data(), lse_src.size() * sizeof(float));
    const float* lse_in = lse_src.empty() ? nullptr : lse_src.data();
    for (size_t i = 0; i < validated.size(); ++i) {
      const ValidatedAttend& part = validated[i];
      const size_t lse_n = part.shape.return_lse ? part.shape.lse_elements() : 0;
      std::string o_old(part.o_bytes, '\x55'), o_new(part.o_bytes, '\x66'),
          o_own(part.o_bytes, '\x77');
      std::vector<float> lse_old(lse_n, 7.f), lse_new(lse_n, 9.f), lse_own(lse_n, 11.f);
      auto at = [lse_n](std::vector<float>& x) { return lse_n ? x.data() : nullptr; };
      reference::OldScatter(old, i, part, o_src.data(), lse_in, s.return_lse, o_old.data(),
                            at(lse_old));
      plan->ScatterFrom(i, part, o_src.data(), lse_in, o_new.data(), at(lse_new));
      packed->Scatter(i, part, o_own.data(), at(lse_own));
      ASSERT_EQ(o_new, o_old) << "part " << i << " of " << validated.size();
      ASSERT_EQ(o_own, o_old) << "part " << i;
      ASSERT_TRUE(SameBytes(lse_new.data(), lse_old.data(), lse_n * sizeof(float))) << i;
      ASSERT_TRUE(SameBytes(lse_own.data(), lse_old.data(), lse_n * sizeof(float))) << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

// Counts the callbacks of a StagedProblem over a PackedAttend's Plan.
struct StagedRun {
  int packs = 0, unpacks = 0;
  std::vector<std::string> o;
  std::vector<std::vector<float>> lse;
};

StagedProblem Staged(const PackedAttend& plan, const std::vector<const ValidatedAttend*>& ptrs,
                     StagedRun* run) {
  run->o.clear();
  run->lse.clear();
  for (const ValidatedAttend* v : ptrs) {
    run->o.emplace_back(v->o_bytes, '\x55');
    run->lse.emplace_back(v->shape.return_lse ? v->shape.lse_elements() : 0, 7.f);
  }
  StagedProblem p;
  p.index = plan.IndexTensors();
  p.pack = [&plan, ptrs, run](void* q, void* k, void* v) {
    ++run->packs;
    plan.PackInto(ptrs, q, k, v);
  };
  p.unpack = [&plan, ptrs, run](const void* o, const float* lse) {
    ++run->unpacks;
    for (size_t i = 0; i < ptrs.size(); ++i) {
      plan.ScatterFrom(i, *ptrs[i], o, lse, run->o[i].data(),
                       run->lse[i].empty() ? nullptr : run->lse[i].data());
    }
  };
  return p;
}

TEST(AttendCoalescer, DefaultExecuteStagedIsBitwiseThePackedVectorPath) {
  CpuBackend cpu(1);
  std::mt19937_64 rng(17);
  int checked = 0;
  for (const auto& requests : RandomBatches(&rng)) {
    const std::vector<ValidatedAttend> validated = ValidateAll(requests);
    const auto ptrs = Pointers(validated);
    auto packed = PackedAttend::Pack(ptrs);
    auto plan = PackedAttend::Plan(ptrs);
    ASSERT_TRUE(packed.ok() && plan.ok());
    ExecuteTimes t;
    ASSERT_TRUE(cpu.Execute(packed->shape(), packed->Tensors(), &t).ok());
    StagedRun run;
    Status s = cpu.ExecuteStaged(plan->shape(), Staged(*plan, ptrs, &run), &t);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(run.packs, 1);
    EXPECT_EQ(run.unpacks, 1);
    for (size_t i = 0; i < validated.size(); ++i) {
      const ValidatedAttend& part = validated[i];
      std::string o(part.o_bytes, '\x11');
      std::vector<float> lse(run.lse[i].size(), 3.f);
      packed->Scatter(i, part, o.data(), lse.empty() ? nullptr : lse.data());
      ASSERT_EQ(run.o[i], o) << "part " << i;
      ASSERT_TRUE(SameBytes(run.lse[i].data(), lse.data(), lse.size() * sizeof(float))) << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(AttendCoalescer, DefaultExecuteStagedNeverUnpacksAFailedLaunch) {
  std::mt19937_64 rng(6);
  Shape shape;
  shape.lse = true;
  std::vector<pb::AttendRequest> requests = {RandomRequest(shape, &rng),
                                             RandomRequest(shape, &rng)};
  const std::vector<ValidatedAttend> validated = ValidateAll(requests);
  const auto ptrs = Pointers(validated);
  auto plan = PackedAttend::Plan(ptrs);
  ASSERT_TRUE(plan.ok());
  CoalescableProbe failing(true);  // its Execute answers INTERNAL
  StagedRun run;
  ExecuteTimes t;
  Status s = failing.ExecuteStaged(plan->shape(), Staged(*plan, ptrs, &run), &t);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_EQ(run.packs, 1);
  EXPECT_EQ(run.unpacks, 0);
  for (const std::string& o : run.o) EXPECT_EQ(o, std::string(o.size(), '\x55'));
}

}  // namespace
}  // namespace attn
