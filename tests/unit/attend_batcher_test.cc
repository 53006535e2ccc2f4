// AttendBatcher (server/batching/attend_batcher.h) on the real cpu backend: batch formation
// (compatible calls share one packed launch and get bitwise the output they get alone;
// incompatible ones never share), the fallback policy (a refused packed problem runs one by
// one; INTERNAL is a device fault for every call of the launch), deadlines and cancellation
// before launch, the bounded queue, and the completion callback called exactly once per
// accepted call. A packed batch runs through Backend::ExecuteStaged: a test double with staging
// of its own (as a GPU lane's) gets one pack and one unpack per batch, and its refusals and
// faults take the same fallbacks. The scheduler's clock is injected and frozen, and
// --max-queue-delay-us is 60 s, so a batch runs exactly when it is full (or at Stop): no test
// depends on timing.
#include "batching/attend_batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "../integration/request_builder.h"
#include "backends/cpu_backend.h"
#include "backends/fault_injecting_backend.h"
#include "validation/attend_validator.h"

namespace attn {
namespace {

namespace pb = attention::v1;
using attn::testing::PaddedRequest;

constexpr int64_t kDelayUs = 60'000'000;

// One call: its request, validated problem, and what its completion callback saw.
struct Call {
  explicit Call(pb::AttendRequest r) : request(std::move(r)) {
    auto v = ValidateAttend(request);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    validated = std::move(*v);
  }
  pb::AttendRequest request;
  ValidatedAttend validated;
  std::atomic<int> done_calls{0};
  AttendResult result;
  std::promise<void> finished;
};

// A padded (B, T, S) request with N = 4, K = 2, H = 16; `lse` changes its signature.
std::unique_ptr<Call> NewCall(int64_t B, int64_t T, int64_t S, uint64_t seed, bool lse = false) {
  pb::AttendRequest r = PaddedRequest(B, T, S, 4, 2, 16, pb::FLOAT32, seed);
  r.set_return_lse(lse);
  return std::make_unique<Call>(std::move(r));
}

// The output (and, when `lse_bytes` is not null, the lse as bytes) `call` gets from the backend
// alone (the reference).
std::string Alone(Backend* backend, const Call& call, std::string* lse_bytes = nullptr) {
  std::string o(call.validated.o_bytes, '\0');
  std::vector<float> lse(call.validated.shape.return_lse
                             ? static_cast<size_t>(call.validated.shape.lse_elements())
                             : 0);
  ExecuteTimes t;
  Status s =
      backend->Execute(call.validated.shape,
                       call.validated.Tensors(o.data(), lse.empty() ? nullptr : lse.data()), &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (lse_bytes != nullptr) {
    lse_bytes->assign(reinterpret_cast<const char*>(lse.data()), lse.size() * sizeof(float));
  }
  return o;
}

// A backend without varlen, as a GPU backend without a varlen kernel: refuses every varlen
// problem (so every packed batch) and runs the rest on the real cpu backend.
class NoVarlenCpu final : public Backend {
 public:
  const std::string& name() const override { return cpu_.name(); }
  BackendCapabilities Capabilities() const override { return cpu_.Capabilities(); }
  Status Supports(const AttentionShape& shape) const override {
    if (shape.layout == kernels::Layout::kVarlen) {
      return FailedPrecondition("no varlen kernel on this backend");
    }
    return cpu_.Supports(shape);
  }
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override {
    return cpu_.Execute(shape, host, times);
  }
  Status ExecuteUntil(const AttentionShape& shape, const AttentionTensors& host,
                      const std::function<bool()>& should_stop, ExecuteTimes* times) override {
    return cpu_.ExecuteUntil(shape, host, should_stop, times);
  }

 private:
  CpuBackend cpu_{1};
};

// The real cpu backend, raising `computing` as a launch starts: a call whose `cancelled` reads
// it is live when taken into its batch and cancelled while it computes.
class FlagsComputingCpu final : public Backend {
 public:
  const std::string& name() const override { return cpu_.name(); }
  BackendCapabilities Capabilities() const override { return cpu_.Capabilities(); }
  Status Supports(const AttentionShape& shape) const override { return cpu_.Supports(shape); }
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override {
    return ExecuteUntil(shape, host, {}, times);
  }
  Status ExecuteUntil(const AttentionShape& shape, const AttentionTensors& host,
                      const std::function<bool()>& should_stop, ExecuteTimes* times) override {
    computing.store(true);
    return cpu_.ExecuteUntil(shape, host, should_stop, times);
  }
  std::atomic<bool> computing{false};

 private:
  CpuBackend cpu_{1};
};

// A test double of a GPU backend's staged path (GpuContext::ExecuteStaged), on the real cpu
// backend: ExecuteStaged hands out slices of its own poisoned "staging" (q | k | v, then o |
// lse), runs the cpu reference over them, lets unpack read o and lse there and poisons the
// staging again before it returns (so nothing may read it later). `fail_with` (not OK) is
// returned after packing instead of launching, as a pool that cannot hold the buffers.
class StagedCpu final : public Backend {
 public:
  const std::string& name() const override { return cpu_.name(); }
  BackendCapabilities Capabilities() const override { return cpu_.Capabilities(); }
  Status Supports(const AttentionShape& shape) const override { return cpu_.Supports(shape); }
  Status Execute(const AttentionShape& shape, const AttentionTensors& host,
                 ExecuteTimes* times) override {
    plain_calls.fetch_add(1);
    return cpu_.Execute(shape, host, times);
  }
  Status ExecuteStaged(const AttentionShape& shape, const StagedProblem& problem,
                       ExecuteTimes* times) override {
    staged_calls.fetch_add(1);
    const size_t es = static_cast<size_t>(kernels::DTypeSize(shape.dtype));
    const size_t q = Up(shape.q_elements() * es), kv = Up(shape.kv_elements() * es);
    const size_t lse = Up(shape.return_lse ? shape.lse_elements() * sizeof(float) : 0);
    staging_.assign(2 * q + 2 * kv + lse + 256, '\xA5');
    char* st = staging_.data();
    problem.pack(st, st + q, st + q + kv);
    if (!fail_with.ok()) return fail_with;
    AttentionTensors host = problem.index;
    host.q = st;
    host.k = st + q;
    host.v = st + q + kv;
    host.o = st + q + 2 * kv;
    host.lse = shape.return_lse ? reinterpret_cast<float*>(st + 2 * q + 2 * kv) : nullptr;
    Status s = cpu_.ExecuteUntil(shape, host, problem.should_stop, times);
    if (s.ok()) {
      unpacks.fetch_add(1);
      problem.unpack(host.o, host.lse);
    }
    staging_.assign(staging_.size(), '\x5A');
    return s;
  }
  std::atomic<int> staged_calls{0}, plain_calls{0}, unpacks{0};
  Status fail_with = Status::Ok();

 private:
  static size_t Up(size_t x) { return (x + 255) / 256 * 256; }
  CpuBackend cpu_{1};
  std::vector<char> staging_;
};

class AttendBatcherTest : public ::testing::Test {
 protected:
  void Make(int64_t max_requests, int64_t max_queued = 64) {
    BatchSchedulerOptions o;
    o.policy = {1 << 20, max_requests, kDelayUs};
    o.threads = 1;
    o.max_queued = max_queued;
    o.name = "Attend";
    batcher_ = std::make_unique<AttendBatcher>(
        o, [this] { faults_.fetch_add(1); }, [] { return int64_t{0}; });
    batcher_->SetLaunchObserver([this](const AttendLaunch& l) {
      std::lock_guard<std::mutex> lock(mu_);
      launches_.push_back(l.calls);
      launch_tokens_.push_back(l.query_tokens);
    });
  }
  Status Enqueue(Call* call, Backend* backend, std::function<bool()> cancelled = nullptr,
                 std::chrono::system_clock::time_point deadline =
                     std::chrono::system_clock::time_point::max()) {
    AttendWork w;
    w.validated = &call->validated;
    w.backend = backend;
    w.cancelled = std::move(cancelled);
    w.deadline = deadline;
    w.done = [call](AttendResult&& r) {
      call->result = std::move(r);
      if (call->done_calls.fetch_add(1) == 0) call->finished.set_value();
    };
    return batcher_->Enqueue(std::move(w));
  }
  static void Wait(Call* call) {
    ASSERT_EQ(call->finished.get_future().wait_for(std::chrono::seconds(30)),
              std::future_status::ready);
  }
  std::vector<int64_t> Launches() {
    std::lock_guard<std::mutex> lock(mu_);
    return launches_;
  }

  CpuBackend cpu_{1};
  std::atomic<int> faults_{0};
  std::mutex mu_;
  std::vector<int64_t> launches_, launch_tokens_;
  std::unique_ptr<AttendBatcher> batcher_;
};

TEST_F(AttendBatcherTest, CompatibleCallsShareOneLaunchWithTheOutputsTheyGetAlone) {
  Make(3);
  std::vector<std::unique_ptr<Call>> calls;
  calls.push_back(NewCall(1, 3, 5, 1));
  calls.push_back(NewCall(2, 1, 4, 2));
  calls.push_back(NewCall(1, 6, 2, 3));
  int64_t tokens = 0;
  for (auto& c : calls) {
    ASSERT_TRUE(Enqueue(c.get(), &cpu_).ok());
    tokens += c->validated.query_tokens;
  }
  for (auto& c : calls) Wait(c.get());
  for (auto& c : calls) {
    ASSERT_TRUE(c->result.status.ok()) << c->result.status.ToString();
    EXPECT_EQ(c->result.batch_size, 3);
    EXPECT_EQ(c->result.batch_tokens, tokens);
    EXPECT_GE(c->result.queue_us, 0);
    EXPECT_EQ(c->result.o, Alone(&cpu_, *c));
    EXPECT_TRUE(c->result.lse.empty());
  }
  batcher_->Stop();
  EXPECT_EQ(Launches(), (std::vector<int64_t>{3}));
  EXPECT_EQ(launch_tokens_, (std::vector<int64_t>{tokens}));
  for (auto& c : calls) EXPECT_EQ(c->done_calls.load(), 1);
  EXPECT_EQ(faults_.load(), 0);
}

TEST_F(AttendBatcherTest, IncompatibleCallsNeverShareALaunchAndStopRunsWhatWaits) {
  Make(2);
  auto a1 = NewCall(1, 2, 3, 1), b = NewCall(1, 2, 3, 2, /*lse=*/true), a2 = NewCall(1, 4, 3, 3);
  ASSERT_TRUE(Enqueue(a1.get(), &cpu_).ok());
  ASSERT_TRUE(Enqueue(b.get(), &cpu_).ok());
  ASSERT_TRUE(Enqueue(a2.get(), &cpu_).ok());  // fills a1's batch; b waits for a partner
  Wait(a1.get());
  Wait(a2.get());
  EXPECT_EQ(a1->result.batch_size, 2);
  EXPECT_EQ(a2->result.batch_size, 2);
  EXPECT_EQ(b->done_calls.load(), 0);
  batcher_->Stop();  // runs the waiting call despite the 60 s delay
  ASSERT_EQ(b->done_calls.load(), 1);
  ASSERT_TRUE(b->result.status.ok()) << b->result.status.ToString();
  EXPECT_EQ(b->result.batch_size, 1);
  EXPECT_EQ(b->result.o, Alone(&cpu_, *b));
  EXPECT_EQ(b->result.lse.size(),
            static_cast<size_t>(b->validated.shape.lse_elements()) * sizeof(float));
  EXPECT_EQ(Launches(), (std::vector<int64_t>{2, 1}));
}

TEST_F(AttendBatcherTest, PackedProblemRefusedRunsEveryCallOnItsOwn) {
  Make(3);
  NoVarlenCpu backend;
  std::vector<std::unique_ptr<Call>> calls;
  for (uint64_t i = 0; i < 3; ++i) calls.push_back(NewCall(1, 2 + i, 3, 10 + i));
  for (auto& c : calls) ASSERT_TRUE(Enqueue(c.get(), &backend).ok());
  for (auto& c : calls) Wait(c.get());
  for (auto& c : calls) {
    ASSERT_TRUE(c->result.status.ok()) << c->result.status.ToString();
    EXPECT_EQ(c->result.batch_size, 1);
    EXPECT_EQ(c->result.batch_tokens, c->validated.query_tokens);
    EXPECT_EQ(c->result.o, Alone(&cpu_, *c));
  }
  batcher_->Stop();
  EXPECT_EQ(Launches(), (std::vector<int64_t>{1, 1, 1}));
  for (auto& c : calls) EXPECT_EQ(c->done_calls.load(), 1);
}

TEST_F(AttendBatcherTest, InternalFromThePackedLaunchIsADeviceFaultForEveryCall) {
  Make(2);
  FaultInjectingBackend faulty(std::make_unique<CpuBackend>(1), std::make_shared<FaultCounter>(1));
  auto a = NewCall(1, 2, 3, 1), b = NewCall(1, 3, 3, 2);
  ASSERT_TRUE(Enqueue(a.get(), &faulty).ok());
  ASSERT_TRUE(Enqueue(b.get(), &faulty).ok());
  Wait(a.get());
  Wait(b.get());
  for (Call* c : {a.get(), b.get()}) {
    EXPECT_EQ(c->result.status.code(), StatusCode::kInternal) << c->result.status.ToString();
    EXPECT_TRUE(c->result.o.empty());
  }
  batcher_->Stop();
  EXPECT_EQ(faults_.load(), 1);  // one launch, one fault
  EXPECT_TRUE(Launches().empty());
  EXPECT_EQ(a->done_calls.load(), 1);
  EXPECT_EQ(b->done_calls.load(), 1);
}

TEST_F(AttendBatcherTest, InternalFromALaunchOfOneIsADeviceFault) {
  Make(1);
  FaultInjectingBackend faulty(std::make_unique<CpuBackend>(1), std::make_shared<FaultCounter>(1));
  auto a = NewCall(1, 2, 3, 1);
  ASSERT_TRUE(Enqueue(a.get(), &faulty).ok());
  Wait(a.get());
  EXPECT_EQ(a->result.status.code(), StatusCode::kInternal);
  batcher_->Stop();
  EXPECT_EQ(faults_.load(), 1);
  EXPECT_EQ(a->done_calls.load(), 1);
}

TEST_F(AttendBatcherTest, ExpiredDeadlineAndCancellationAreDroppedBeforeLaunch) {
  Make(1);
  auto late = NewCall(1, 2, 3, 1), gone = NewCall(1, 2, 3, 2), live = NewCall(1, 2, 3, 3);
  ASSERT_TRUE(Enqueue(late.get(), &cpu_, nullptr,
                      std::chrono::system_clock::now() - std::chrono::seconds(1))
                  .ok());
  ASSERT_TRUE(Enqueue(gone.get(), &cpu_, [] { return true; }).ok());
  ASSERT_TRUE(Enqueue(live.get(), &cpu_, [] { return false; }).ok());
  for (Call* c : {late.get(), gone.get(), live.get()}) Wait(c);
  EXPECT_EQ(late->result.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(gone->result.status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(live->result.status.ok()) << live->result.status.ToString();
  batcher_->Stop();
  EXPECT_EQ(Launches(), (std::vector<int64_t>{1}));  // only the live call was computed
  for (Call* c : {late.get(), gone.get(), live.get()}) EXPECT_EQ(c->done_calls.load(), 1);
}

// The cpu reference polls between chunks of about 2^20 multiply-adds: a (1, 256, 256) problem
// with N = 4, H = 16 polls several times, so a call cancelled once its launch started stops.
TEST_F(AttendBatcherTest, CallsCancelledWhileComputingStopTheLaunchAndSaySo) {
  for (int64_t batch : {1, 2}) {
    SCOPED_TRACE(batch);
    Make(batch);
    FlagsComputingCpu backend;
    std::vector<std::unique_ptr<Call>> calls;
    for (int64_t i = 0; i < batch; ++i) {
      calls.push_back(NewCall(1, 256, 256, 7 + i));
      ASSERT_TRUE(Enqueue(calls.back().get(), &backend, [&backend] {
                    return backend.computing.load();
                  }).ok());
    }
    for (auto& c : calls) Wait(c.get());
    for (auto& c : calls) {
      EXPECT_EQ(c->result.status.code(), StatusCode::kCancelled) << c->result.status.ToString();
      EXPECT_NE(c->result.status.message().find("while computing"), std::string::npos)
          << c->result.status.message();
    }
    batcher_->Stop();
    for (auto& c : calls) EXPECT_EQ(c->done_calls.load(), 1);
    EXPECT_TRUE(Launches().empty());
  }
}

TEST_F(AttendBatcherTest, RefusedWorkNeverCallsItsCallback) {
  Make(8, /*max_queued=*/1);
  auto first = NewCall(1, 2, 3, 1), second = NewCall(1, 2, 3, 2), third = NewCall(1, 2, 3, 3);
  ASSERT_TRUE(Enqueue(first.get(), &cpu_).ok());  // waits: the batch is not full
  Status full = Enqueue(second.get(), &cpu_);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_EQ(batcher_->queued_requests(), 1);
  batcher_->Stop();
  Status stopping = Enqueue(third.get(), &cpu_);
  EXPECT_EQ(stopping.code(), StatusCode::kUnavailable) << stopping.ToString();
  EXPECT_EQ(first->done_calls.load(), 1);
  EXPECT_TRUE(first->result.status.ok());
  EXPECT_EQ(second->done_calls.load(), 0);
  EXPECT_EQ(third->done_calls.load(), 0);
}

TEST_F(AttendBatcherTest, RefuseQueuedAnswersEveryWaitingCallOnce) {
  Make(8);
  auto a = NewCall(1, 2, 3, 1), b = NewCall(1, 2, 3, 2);
  ASSERT_TRUE(Enqueue(a.get(), &cpu_).ok());
  ASSERT_TRUE(Enqueue(b.get(), &cpu_).ok());
  EXPECT_EQ(batcher_->RefuseQueued(Unavailable("drain timeout")), 2);
  for (Call* c : {a.get(), b.get()}) {
    Wait(c);
    EXPECT_EQ(c->result.status.code(), StatusCode::kUnavailable);
  }
  batcher_->Stop();
  EXPECT_TRUE(Launches().empty());
  EXPECT_EQ(a->done_calls.load(), 1);
  EXPECT_EQ(b->done_calls.load(), 1);
}

// Three calls with lse, one with two batch entries: one staged launch, one pack, one unpack.
std::vector<std::unique_ptr<Call>> MixedLseCalls() {
  std::vector<std::unique_ptr<Call>> calls;
  calls.push_back(NewCall(2, 3, 5, 21, /*lse=*/true));
  calls.push_back(NewCall(1, 7, 2, 22, /*lse=*/true));
  calls.push_back(NewCall(1, 1, 6, 23, /*lse=*/true));
  return calls;
}

TEST_F(AttendBatcherTest, StagedBackendPacksOnceUnpacksOnceAndGivesTheOutputsOfAlone) {
  Make(3);
  StagedCpu backend;
  auto calls = MixedLseCalls();
  for (auto& c : calls) ASSERT_TRUE(Enqueue(c.get(), &backend).ok());
  for (auto& c : calls) Wait(c.get());
  for (auto& c : calls) {
    ASSERT_TRUE(c->result.status.ok()) << c->result.status.ToString();
    EXPECT_EQ(c->result.batch_size, 3);
    std::string lse;
    EXPECT_EQ(c->result.o, Alone(&cpu_, *c, &lse));
    EXPECT_EQ(c->result.lse, lse);
  }
  batcher_->Stop();
  EXPECT_EQ(backend.staged_calls.load(), 1);
  EXPECT_EQ(backend.unpacks.load(), 1);
  EXPECT_EQ(backend.plain_calls.load(), 0);
  EXPECT_EQ(Launches(), (std::vector<int64_t>{3}));
}

TEST_F(AttendBatcherTest, FaultInjectionKeepsTheWrappedBackendsStagedPath) {
  Make(3);
  auto inner = std::make_unique<StagedCpu>();
  StagedCpu* staged = inner.get();
  FaultInjectingBackend wrapped(std::move(inner), std::make_shared<FaultCounter>(100));
  auto calls = MixedLseCalls();
  for (auto& c : calls) ASSERT_TRUE(Enqueue(c.get(), &wrapped).ok());
  for (auto& c : calls) Wait(c.get());
  for (auto& c : calls) {
    ASSERT_TRUE(c->result.status.ok()) << c->result.status.ToString();
    EXPECT_EQ(c->result.o, Alone(&cpu_, *c));
  }
  batcher_->Stop();
  EXPECT_EQ(staged->staged_calls.load(), 1);
  EXPECT_EQ(staged->plain_calls.load(), 0);
}

TEST_F(AttendBatcherTest, StagedLaunchRefusedAfterPackingRunsEveryCallOnItsOwn) {
  Make(3);
  StagedCpu backend;
  backend.fail_with = ResourceExhausted("pool cannot hold the packed buffers");
  auto calls = MixedLseCalls();
  for (auto& c : calls) ASSERT_TRUE(Enqueue(c.get(), &backend).ok());
  for (auto& c : calls) Wait(c.get());
  for (auto& c : calls) {
    ASSERT_TRUE(c->result.status.ok()) << c->result.status.ToString();
    EXPECT_EQ(c->result.batch_size, 1);
    std::string lse;
    EXPECT_EQ(c->result.o, Alone(&cpu_, *c, &lse));
    EXPECT_EQ(c->result.lse, lse);
  }
  batcher_->Stop();
  EXPECT_EQ(backend.staged_calls.load(), 1);
  EXPECT_EQ(backend.unpacks.load(), 0);
  EXPECT_EQ(backend.plain_calls.load(), 3);
  EXPECT_EQ(Launches(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(faults_.load(), 0);
}

TEST_F(AttendBatcherTest, InternalFromAStagedLaunchIsADeviceFaultForEveryCall) {
  Make(3);
  StagedCpu backend;
  backend.fail_with = Internal("CUDA error in cudaMemcpyAsync H2D: an illegal memory access");
  auto calls = MixedLseCalls();
  for (auto& c : calls) ASSERT_TRUE(Enqueue(c.get(), &backend).ok());
  for (auto& c : calls) Wait(c.get());
  for (auto& c : calls) {
    EXPECT_EQ(c->result.status.code(), StatusCode::kInternal) << c->result.status.ToString();
    EXPECT_TRUE(c->result.o.empty());
    EXPECT_EQ(c->done_calls.load(), 1);
  }
  batcher_->Stop();
  EXPECT_EQ(faults_.load(), 1);
  EXPECT_EQ(backend.unpacks.load(), 0);
  EXPECT_EQ(backend.plain_calls.load(), 0);
  EXPECT_TRUE(Launches().empty());
}

}  // namespace
}  // namespace attn
