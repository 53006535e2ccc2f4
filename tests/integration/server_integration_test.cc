// Integration: the real attention-server binary on a loopback port, driven by a gRPC client.
// Every error path returns its documented status, and the server then still serves.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <future>
#include <thread>

#include "attn/kernels/cpu_attention.h"
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {
namespace {

using attention::v1::AttendRequest;
using attention::v1::AttendResponse;

grpc::Status Call(attention::v1::AttentionService::Stub* stub, const AttendRequest& req,
                  AttendResponse* resp, int timeout_s = 60) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  return stub->Attend(&ctx, req, resp);
}

// Relative L2 error of the response against the in-process reference on the same inputs.
double RelErrorVsReference(const AttendRequest& req, const AttendResponse& resp) {
  kernels::AttentionShape s;
  s.dtype = req.q().dtype() == attention::v1::FLOAT32   ? kernels::DType::kFloat32
            : req.q().dtype() == attention::v1::FLOAT16 ? kernels::DType::kFloat16
                                                        : kernels::DType::kBFloat16;
  s.batch = req.q().shape(0);
  s.max_q_len = req.q().shape(1);
  s.num_heads = req.q().shape(2);
  s.head_dim = req.q().shape(3);
  s.max_kv_len = req.k().shape(1);
  s.num_kv_heads = req.k().shape(2);
  s.scale = static_cast<float>(1.0 / std::sqrt(double(s.head_dim)));
  switch (req.mask().causal()) {
    case attention::v1::CAUSAL_TOP_LEFT: s.mask.causal = kernels::CausalAlignment::kTopLeft; break;
    case attention::v1::CAUSAL_BOTTOM_RIGHT:
      s.mask.causal = kernels::CausalAlignment::kBottomRight;
      break;
    default: break;
  }
  std::vector<double> ref(s.q_elements());
  kernels::AttentionTensors t;
  t.q = req.q().data().data();
  t.k = req.k().data().data();
  t.v = req.v().data().data();
  EXPECT_TRUE(kernels::CpuAttentionF64(s, t, ref.data(), nullptr).ok());
  double num = 0, den = 0;
  for (int64_t i = 0; i < s.q_elements(); ++i) {
    const double o = kernels::LoadAsFloat(resp.o().data().data(), s.dtype, i);
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(
        std::vector<std::string>{"--max-message-bytes", "4000000"});
    ASSERT_TRUE(server_->started()) << server_->ReadLog();
    stub_ = server_->Stub();
  }
  // A good request must still succeed (called after every error case).
  void ExpectStillServing() {
    AttendRequest good = PaddedRequest(1, 5, 7, 4, 2, 16, attention::v1::FLOAT32, 99);
    good.mutable_mask()->set_causal(attention::v1::CAUSAL_BOTTOM_RIGHT);
    good.set_backend("cpu");
    AttendResponse resp;
    grpc::Status st = Call(stub_.get(), good, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_LT(RelErrorVsReference(good, resp), 1e-5);
  }
  void ExpectStatus(const AttendRequest& req, grpc::StatusCode code, const std::string& needle) {
    AttendResponse resp;
    grpc::Status st = Call(stub_.get(), req, &resp);
    EXPECT_EQ(st.error_code(), code) << st.error_message();
    EXPECT_NE(st.error_message().find(needle), std::string::npos)
        << "message \"" << st.error_message() << "\" lacks \"" << needle << "\"";
    ExpectStillServing();
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<attention::v1::AttentionService::Stub> stub_;
};

TEST_F(ServerTest, AttendMatchesReferenceAndReportsPhases) {
  for (auto dtype : {attention::v1::FLOAT32, attention::v1::FLOAT16, attention::v1::BFLOAT16}) {
    AttendRequest req = PaddedRequest(2, 9, 13, 8, 2, 32, dtype, 7);
    req.mutable_mask()->set_causal(attention::v1::CAUSAL_TOP_LEFT);
    req.set_return_lse(true);
    req.set_backend("cpu");
    AttendResponse resp;
    grpc::Status st = Call(stub_.get(), req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    const double tol = dtype == attention::v1::FLOAT32 ? 1e-5 : 1e-2;
    EXPECT_LT(RelErrorVsReference(req, resp), tol);
    EXPECT_EQ(resp.o().dtype(), dtype);
    ASSERT_EQ(resp.o().shape_size(), 4);
    EXPECT_EQ(resp.lse().shape(0), 2);
    EXPECT_EQ(resp.lse().shape(1), 8);
    EXPECT_EQ(resp.lse().shape(2), 9);
    EXPECT_EQ(resp.report().backend(), "cpu");
    EXPECT_EQ(resp.report().batch_size(), 1);
    EXPECT_GT(resp.report().times().total_us(), 0);
    EXPECT_GE(resp.report().times().total_us(), resp.report().times().kernel_us());
  }
}

TEST_F(ServerTest, AutoChoosesAnAvailableBackendAndSaysWhy) {
  AttendRequest req = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  AttendResponse resp;
  ASSERT_TRUE(Call(stub_.get(), req, &resp).ok());
  EXPECT_FALSE(resp.report().backend().empty());
  EXPECT_NE(resp.report().backend_reason().find("auto"), std::string::npos);
}

TEST_F(ServerTest, ServerInfoListsBackends) {
  grpc::ClientContext ctx;
  attention::v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(&ctx, {}, &info).ok());
  bool cpu = false, naive = false;
  for (const auto& b : info.backends()) {
    if (b.name() == "cpu") cpu = b.available();
    if (b.name() == "naive") {
      naive = true;
      if (!b.available()) EXPECT_FALSE(b.unavailable_reason().empty());
    }
  }
  EXPECT_TRUE(cpu);
  EXPECT_TRUE(naive);
  EXPECT_EQ(info.max_message_bytes(), 4000000);
  EXPECT_EQ(info.default_backend(), "auto");
}

TEST_F(ServerTest, WrongByteSize) {
  AttendRequest r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.mutable_k()->mutable_data()->pop_back();
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "k.data: expected 256 bytes");
}

TEST_F(ServerTest, HeadsNotDivisible) {
  AttendRequest r = PaddedRequest(1, 4, 4, 8, 3, 8, attention::v1::FLOAT32);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "divisible by num_kv_heads");
}

TEST_F(ServerTest, HeadDimMismatch) {
  std::mt19937_64 rng(3);
  AttendRequest r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.clear_k();
  FillTensor(r.mutable_k(), attention::v1::FLOAT32, {1, 4, 2, 16}, &rng);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "head_dim");
}

TEST_F(ServerTest, NegativeAndOversizeLengths) {
  AttendRequest r = PaddedRequest(2, 4, 6, 2, 2, 8, attention::v1::FLOAT32);
  r.add_kv_lengths(3);
  r.add_kv_lengths(-1);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "kv_lengths[1]");
  r.clear_kv_lengths();
  r.add_kv_lengths(7);
  r.add_kv_lengths(2);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "kv_lengths[0]: expected in [0, S=6]");
  r.clear_kv_lengths();
  r.add_q_lengths(1);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "q_lengths (entries, must equal the batch): expected 2, got 1");
}

TEST_F(ServerTest, VarlenLengthsBeyondTensor) {
  std::mt19937_64 rng(5);
  AttendRequest r;
  r.set_layout(attention::v1::LAYOUT_VARLEN);
  FillTensor(r.mutable_q(), attention::v1::FLOAT32, {6, 2, 8}, &rng);
  FillTensor(r.mutable_k(), attention::v1::FLOAT32, {9, 2, 8}, &rng);
  FillTensor(r.mutable_v(), attention::v1::FLOAT32, {9, 2, 8}, &rng);
  r.add_q_lengths(3);
  r.add_q_lengths(4);  // sums to 7 > 6 rows
  r.add_kv_lengths(4);
  r.add_kv_lengths(5);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "sum(q_lengths)");
  r.set_q_lengths(1, 3);
  r.set_backend("cpu");
  AttendResponse resp;
  ASSERT_TRUE(Call(stub_.get(), r, &resp).ok());  // now consistent: varlen on cpu works
}

TEST_F(ServerTest, UnknownDtypeAndBackend) {
  AttendRequest r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.mutable_q()->set_dtype(static_cast<attention::v1::DType>(42));
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "q.dtype");
  r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.mutable_v()->set_dtype(attention::v1::DTYPE_UNSPECIFIED);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "v.dtype");
  r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.set_backend("flashy");
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "unknown backend \"flashy\"");
}

TEST_F(ServerTest, EmptyTensorsAndBadMask) {
  AttendRequest r;
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "q: expected rank 4");
  std::mt19937_64 rng(1);
  r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.clear_q();
  r.mutable_q()->set_dtype(attention::v1::FLOAT32);
  for (int64_t d : {1, 0, 2, 8}) r.mutable_q()->add_shape(d);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "empty tensor");
  r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  r.mutable_mask()->set_causal(attention::v1::CAUSAL_TOP_LEFT);
  r.mutable_mask()->set_window_right(3);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "mask.window_right");
  r.mutable_mask()->clear_window_right();
  r.set_scale(-1.f);
  ExpectStatus(r, grpc::StatusCode::INVALID_ARGUMENT, "scale");
}

TEST_F(ServerTest, OversizeMessage) {
  // 4,000,000-byte limit; this request carries about 3 × 1.6 MB.
  AttendRequest r = PaddedRequest(1, 1600, 1600, 4, 4, 64, attention::v1::FLOAT32);
  ExpectStatus(r, grpc::StatusCode::RESOURCE_EXHAUSTED, "4000000");
}

TEST_F(ServerTest, ForcedBackendThatCannotRun) {
  AttendRequest r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  grpc::ClientContext ctx;
  attention::v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub_->GetServerInfo(&ctx, {}, &info).ok());
  bool naive_available = false;
  for (const auto& b : info.backends()) {
    if (b.name() == "naive") naive_available = b.available();
  }
  if (!naive_available) {
    r.set_backend("naive");
    ExpectStatus(r, grpc::StatusCode::FAILED_PRECONDITION, "naive");
  }
  // FP8 input: no backend here supports it; a forced cpu says why.
  r = PaddedRequest(1, 4, 4, 2, 2, 8, attention::v1::FLOAT32);
  for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v()}) {
    t->set_dtype(attention::v1::FLOAT8_E4M3);
    t->set_scale(1.f);
    t->mutable_data()->resize(t->data().size() / 4);
  }
  r.set_backend("cpu");
  ExpectStatus(r, grpc::StatusCode::FAILED_PRECONDITION, "cpu");
}

TEST(ServerLifecycle, HealthAndGracefulDrainOnSigterm) {
  ServerProcess server({"--cpu-threads", "1"});
  ASSERT_TRUE(server.started()) << server.ReadLog();
  auto channel = server.Channel();
  EXPECT_EQ(HealthCheck(channel, ""), "SERVING");
  EXPECT_EQ(HealthCheck(channel, "attention.v1.AttentionService"), "SERVING");
  auto stub = attention::v1::AttentionService::NewStub(channel);
  // A slow in-flight call (fp32 cpu, ~8.6 GFLOP in float64 on one thread: seconds).
  AttendRequest slow = PaddedRequest(1, 2048, 2048, 8, 8, 64, attention::v1::FLOAT32);
  slow.set_backend("cpu");
  auto inflight = std::async(std::launch::async, [&] {
    AttendResponse resp;
    return Call(stub.get(), slow, &resp, 120);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server.Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (inflight.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    // Still draining: health is NOT_SERVING and new calls are refused with UNAVAILABLE.
    EXPECT_EQ(HealthCheck(channel, ""), "NOT_SERVING");
    AttendResponse resp;
    grpc::Status st = Call(stub.get(), PaddedRequest(1, 2, 2, 1, 1, 4, attention::v1::FLOAT32),
                           &resp, 10);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  } else {
    ADD_FAILURE() << "the slow call finished before the drain could be observed";
  }
  grpc::Status done = inflight.get();
  EXPECT_TRUE(done.ok()) << "in-flight call must finish during drain: " << done.error_message();
  EXPECT_EQ(server.WaitExit(30), 0) << server.ReadLog();
  EXPECT_NE(server.ReadLog().find("stopped cleanly"), std::string::npos);
}

TEST(ServerLifecycle, JsonLogsAreOneObjectPerLine) {
  ServerProcess server({"--log-format", "json"});
  ASSERT_TRUE(server.started()) << server.ReadLog();
  server.Signal(SIGINT);
  EXPECT_EQ(server.WaitExit(30), 0);
  std::istringstream lines(server.ReadLog());
  std::string line;
  int n = 0;
  int info = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    ++n;
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
    // Cloud Logging's field names (GKE), not spdlog's level/msg.
    EXPECT_NE(line.find("\"message\":\""), std::string::npos) << line;
    EXPECT_NE(line.find("\"severity\":\""), std::string::npos) << line;
    EXPECT_EQ(line.find("\"level\":"), std::string::npos) << line;
    if (line.find("\"severity\":\"INFO\"") != std::string::npos) ++info;
  }
  EXPECT_GE(n, 2);
  EXPECT_GE(info, 1);
}

TEST(ServerLifecycle, BusyPortIsRefusedNotShared) {
  ServerProcess first;
  ASSERT_TRUE(first.started()) << first.ReadLog();
  // A second server on the same port must fail to start (no SO_REUSEPORT sharing).
  ServerProcess second({"--listen", first.address()});
  EXPECT_FALSE(second.started());
  EXPECT_NE(second.WaitExit(10), 0);
  EXPECT_NE(second.ReadLog().find("could not listen"), std::string::npos) << second.ReadLog();
}

TEST(ServerLifecycle, InvalidPortAndUnwritablePortFileExitNonZero) {
  ServerProcess bad_port({"--listen", "127.0.0.1:99999"});
  EXPECT_FALSE(bad_port.started());
  EXPECT_EQ(bad_port.WaitExit(10), 2);
  EXPECT_NE(bad_port.ReadLog().find("port in [0, 65535]"), std::string::npos)
      << bad_port.ReadLog();
  ServerProcess bad_file({"--port-file", "/nonexistent-dir/port"});
  EXPECT_FALSE(bad_file.started());
  EXPECT_EQ(bad_file.WaitExit(10), 1);
  EXPECT_NE(bad_file.ReadLog().find("--port-file"), std::string::npos) << bad_file.ReadLog();
}

TEST(ServerLifecycle, BadFlagsExitNonZero) {
  ServerProcess server({"--default-backend", "nonesuch"});
  EXPECT_FALSE(server.started());
  EXPECT_NE(server.ReadLog().find("unknown backend"), std::string::npos) << server.ReadLog();
}

}  // namespace
}  // namespace attn::testing
