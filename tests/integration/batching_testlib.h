// Helpers shared by the batching integration tests (batching_integration_test.cc,
// batching_chaos_integration_test.cc): deadlines, the server's queue depth from GetLoad, and
// one deterministic sequence step.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

#include "attention/v1/attention.grpc.pb.h"
#include "attention/v1/sequence.grpc.pb.h"
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {

namespace batching_pb = attention::v1;

/// Heads of every tensor in these tests: N query heads, K KV heads, head dim H.
constexpr int64_t kN = 4, kK = 2, kH = 16;

/// Sets `c`'s deadline `seconds` from now.
inline void Deadline(grpc::ClientContext* c, int seconds = 60) {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

/// GetLoad's requests_queued (-1 when GetLoad failed).
inline int64_t Queued(ServerProcess* server) {
  auto stub = server->Stub();
  grpc::ClientContext c;
  Deadline(&c, 10);
  batching_pb::GetLoadResponse load;
  grpc::Status st = stub->GetLoad(&c, batching_pb::GetLoadRequest(), &load);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return st.ok() ? load.requests_queued() : -1;
}

/// Polls GetLoad until `want` calls are queued (or 20 s pass).
inline bool WaitQueued(ServerProcess* server, int64_t want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    if (Queued(server) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// Sequence `id`'s step at (`layer`, `pos`) with T query tokens of float32 from `seed`.
inline batching_pb::ExtendRequest BatchingStep(const std::string& id, int layer, int64_t pos,
                                               int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  batching_pb::ExtendRequest r;
  r.set_sequence_id(id);
  r.set_layer(layer);
  r.set_position(pos);
  FillTensor(r.mutable_q(), batching_pb::FLOAT32, {T, kN, kH}, &rng);
  FillTensor(r.mutable_k(), batching_pb::FLOAT32, {T, kK, kH}, &rng);
  FillTensor(r.mutable_v(), batching_pb::FLOAT32, {T, kK, kH}, &rng);
  return r;
}

}  // namespace attn::testing
