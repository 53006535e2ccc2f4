// Sequence steps whose tensors are in a CUDA IPC region (ExtendArgs::device, issue 18 item 3)
// through ExtendStep (backends/paged/extend_step.h), without a GPU: the paged-cpu backend refuses
// them with FAILED_PRECONDITION and nothing is applied; a backend that serves device I/O (here a
// test double over paged-cpu whose "device addresses" are host buffers) gets the flags on its
// append and attend items, the step is applied, never answered as a replay nor stored for one
// (its retry gets FAILED_PRECONDITION with the length), and an FP8 sequence without scales
// refuses device k/v. The device copies themselves run in tests/python/test_cuda_ipc.py (gpu).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/paged/cpu_paged_attention.h"
#include "backends/paged/extend_step.h"
#include "kv_cache/sequence_store.h"
#include "kv_test_fixtures.h"

namespace attn {
namespace {

using kernels::DType;

// paged-cpu that claims device I/O and records the flags its items carried.
class DeviceIoCpu final : public PagedAttentionBackend {
 public:
  const std::string &name() const override { return name_; }
  const std::string &device() const override { return device_; }
  bool ServesDeviceIo() const override { return true; }
  Status Append(const PagedLayerView &l, int64_t start, int64_t tokens, const void *k,
                const void *v, DType src, int64_t *sat) override {
    return cpu_.Append(l, start, tokens, k, v, src, sat);
  }
  Status CopyPage(const kernels::PagedKvPool &p, int32_t s, int32_t d, int64_t t) override {
    return cpu_.CopyPage(p, s, d, t);
  }
  Status Attend(const PagedLayerView &l, const PagedQuery &q, void *o) override {
    return cpu_.Attend(l, q, o);
  }
  Status AppendAttendBatch(PagedAppendItem *a, const PagedAttendItem *t, size_t n,
                           LaunchTimes *times) override {
    for (size_t i = 0; i < n; ++i) {
      seen_append.push_back(a[i].device);
      seen_query.push_back(t[i].query.device);
    }
    return PagedAttentionBackend::AppendAttendBatch(a, t, n, times);
  }
  std::vector<const DeviceStepIo *> seen_append, seen_query;

 private:
  CpuPagedAttention cpu_{1};
  const std::string name_ = "device-io-cpu", device_ = "gpu";
};

class DeviceStepTest : public ::testing::Test {
 protected:
  DeviceStepTest() : store_(&pool_.pool, SequenceStoreOptions{}) {}
  std::string Create(DType kv = DType::kFloat32) {
    SequenceConfig c;
    c.num_layers = 1;
    c.num_kv_heads = 1;
    c.head_dim = 8;
    c.num_heads = 2;
    c.dtype = DType::kFloat32;
    c.kv_dtype = kv;
    c.scale = 0.35f;
    auto s = store_.Create("", c);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->seq->id : "";
  }
  // One T-token step at `position` with seeded inputs, its tensors flagged as `device` says.
  Status Step(PagedAttentionBackend *backend, const std::string &id, int64_t position, int64_t T,
              DeviceStepIo device, std::string *o) {
    std::mt19937 rng(static_cast<uint32_t>(position + 1));
    std::normal_distribution<float> n;
    q_.resize(T * 16);
    k_.resize(T * 8);
    v_.resize(T * 8);
    for (auto *x : {&q_, &k_, &v_}) {
      for (float &e : *x) e = n(rng);
    }
    ExtendArgs a;
    a.sequence_id = id;
    a.position = position;
    a.q_shape = {T, 2, 8};
    a.k_shape = a.v_shape = {T, 1, 8};
    a.q = q_.data();
    a.k = k_.data();
    a.v = v_.data();
    a.q_bytes = q_.size() * 4;
    a.k_bytes = a.v_bytes = k_.size() * 4;
    a.device = device;
    ExtendOutcome out;
    last_replayed_ = false;
    Status s = ExtendStep(&store_, backend, "", a, o, &out);
    last_replayed_ = out.replayed;
    return s;
  }
  int64_t Length(const std::string &id) {
    auto s = store_.Acquire(id, "");
    return s.ok() ? s->seq->layers[0].table.length() : -1;
  }
  static DeviceStepIo Inputs() {
    DeviceStepIo d;
    d.q = d.k = d.v = true;
    d.ready_event = &d;  // any non-null token: the test double never waits on it
    return d;
  }

  testing::PoolFixture pool_;
  SequenceStore store_;
  std::vector<float> q_, k_, v_;
  bool last_replayed_ = false;
};

TEST_F(DeviceStepTest, TheCpuBackendRefusesDeviceTensorsAndAppliesNothing) {
  CpuPagedAttention cpu(1);
  const std::string id = Create();
  std::string o;
  const Status s = Step(&cpu, id, 0, 3, Inputs(), &o);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("paged-cpu backend reads host memory only"), std::string::npos)
      << s.message();
  EXPECT_EQ(Length(id), 0);
  DeviceStepIo only_o;
  only_o.o = &only_o;  // o alone in the region is refused too
  EXPECT_EQ(Step(&cpu, id, 0, 1, only_o, &o).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Length(id), 0);
}

TEST_F(DeviceStepTest, FlagsReachTheBackendAndDeviceStepsAreNeverReplayed) {
  DeviceIoCpu backend;
  const std::string id = Create();
  std::string host_o, dev_o;
  // A host step replays as usual.
  ASSERT_TRUE(Step(&backend, id, 0, 2, {}, &host_o).ok());
  ASSERT_TRUE(Step(&backend, id, 0, 2, {}, &host_o).ok());
  EXPECT_TRUE(last_replayed_);
  EXPECT_EQ(backend.seen_append.size(), 1u);  // the replay launched nothing
  EXPECT_EQ(backend.seen_append[0], nullptr);
  // A device step: flagged items, applied, o on the host as well.
  ASSERT_TRUE(Step(&backend, id, 2, 1, Inputs(), &dev_o).ok());
  EXPECT_FALSE(last_replayed_);
  EXPECT_EQ(Length(id), 3);
  ASSERT_EQ(backend.seen_append.size(), 2u);
  ASSERT_NE(backend.seen_append[1], nullptr);
  EXPECT_TRUE(backend.seen_append[1]->k && backend.seen_append[1]->v);
  ASSERT_NE(backend.seen_query[1], nullptr);
  EXPECT_TRUE(backend.seen_query[1]->q);
  EXPECT_EQ(dev_o.size(), 2u * 8 * 4);
  // Its exact retry is not a replay: FAILED_PRECONDITION with the length, nothing appended.
  const Status retry = Step(&backend, id, 2, 1, Inputs(), &dev_o);
  EXPECT_EQ(retry.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(retry.message().find("length 3"), std::string::npos) << retry.message();
  // Nor is the same step sent as host bytes afterwards: the device step was not stored.
  EXPECT_EQ(Step(&backend, id, 2, 1, {}, &host_o).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Length(id), 3);
  EXPECT_EQ(store_.replay_budget()->used(), 0);
}

TEST_F(DeviceStepTest, Fp8ScalesAreNotDerivedFromDeviceKv) {
  DeviceIoCpu backend;
  const std::string id = Create(DType::kFloat8E4M3);
  std::string o;
  const Status s = Step(&backend, id, 0, 4, Inputs(), &o);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("derives its scales"), std::string::npos) << s.message();
  EXPECT_EQ(Length(id), 0);
  // The first step as host bytes fixes the scales; device steps follow.
  ASSERT_TRUE(Step(&backend, id, 0, 4, {}, &o).ok());
  EXPECT_TRUE(Step(&backend, id, 4, 1, Inputs(), &o).ok());
  EXPECT_EQ(Length(id), 5);
}

}  // namespace
}  // namespace attn
