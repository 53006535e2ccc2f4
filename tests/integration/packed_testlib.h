// Helpers of the packed ExtendBatch and ExtendBatchStream integration tests: a server with the
// cpu paged backend, sequences of one configuration, random steps in the per-step form and the
// same steps packed (one q, k, v for all steps).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/v1/sequence.grpc.pb.h"
#include "request_builder.h"
#include "server_process.h"

namespace attn::testing {

namespace pbs = attention::v1;

/// One step of a batch: its sequence, position and query tokens.
struct StepSpec {
  std::string id;
  int64_t position = 0;
  int64_t tokens = 1;
};

class PackedFixture : public ::testing::Test {
 protected:
  static constexpr int kLayers = 2, kK = 2, kN = 4, kH = 16, kPage = 4;

  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--kv-page-tokens", std::to_string(kPage),
                                     "--kv-debug-poison"};
    args.insert(args.end(), extra.begin(), extra.end());
    server_ = std::make_unique<ServerProcess>(args);
    ASSERT_TRUE(server_->started()) << server_->ReadLog();
    seq_ = pbs::SequenceService::NewStub(server_->Channel());
  }
  static void Ctx(grpc::ClientContext *c) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }
  std::string Create(pbs::DType dtype, int head_dim = kH) {
    pbs::CreateSequenceRequest r;
    r.set_num_layers(kLayers);
    r.set_num_kv_heads(kK);
    r.set_head_dim(head_dim);
    r.set_num_heads(kN);
    r.set_dtype(dtype);
    pbs::CreateSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    grpc::Status st = seq_->CreateSequence(&c, r, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.sequence().sequence_id();
  }
  /// Random steps in the per-step form (seeded per step).
  static pbs::ExtendBatchRequest PerStep(const std::vector<StepSpec> &specs, int layer,
                                         pbs::DType dtype, uint64_t seed, int head_dim = kH) {
    pbs::ExtendBatchRequest b;
    for (size_t i = 0; i < specs.size(); ++i) {
      std::mt19937_64 rng(seed + i);
      pbs::ExtendRequest *r = b.add_steps();
      r->set_sequence_id(specs[i].id);
      r->set_layer(layer);
      r->set_position(specs[i].position);
      const int64_t T = specs[i].tokens;
      FillTensor(r->mutable_q(), dtype, {T, kN, head_dim}, &rng);
      FillTensor(r->mutable_k(), dtype, {T, kK, head_dim}, &rng);
      FillTensor(r->mutable_v(), dtype, {T, kK, head_dim}, &rng);
    }
    return b;
  }
  /// The same steps packed: q, k, v are the per-step tensors concatenated along T.
  static pbs::ExtendBatchRequest Pack(const pbs::ExtendBatchRequest &per_step) {
    pbs::ExtendBatchRequest b;
    pbs::PackedExtendBatch *p = b.mutable_packed();
    p->set_layer(per_step.steps(0).layer());
    int64_t total = 0;
    for (const pbs::ExtendRequest &r : per_step.steps()) {
      pbs::PackedStep *s = p->add_steps();
      s->set_sequence_id(r.sequence_id());
      s->set_position(r.position());
      s->set_query_tokens(r.q().shape(0));
      total += r.q().shape(0);
      p->mutable_q()->mutable_data()->append(r.q().data());
      p->mutable_k()->mutable_data()->append(r.k().data());
      p->mutable_v()->mutable_data()->append(r.v().data());
    }
    const pbs::ExtendRequest &r0 = per_step.steps(0);
    for (auto [t, src] : {std::make_pair(p->mutable_q(), &r0.q()),
                          std::make_pair(p->mutable_k(), &r0.k()),
                          std::make_pair(p->mutable_v(), &r0.v())}) {
      t->set_dtype(src->dtype());
      t->add_shape(total);
      t->add_shape(src->shape(1));
      t->add_shape(src->shape(2));
    }
    return b;
  }
  grpc::Status Batch(const pbs::ExtendBatchRequest &r, pbs::ExtendBatchResponse *resp) {
    grpc::ClientContext c;
    Ctx(&c);
    return seq_->ExtendBatch(&c, r, resp);
  }
  int64_t Length(const std::string &id, int layer) {
    pbs::GetSequenceRequest r;
    r.set_sequence_id(id);
    pbs::GetSequenceResponse resp;
    grpc::ClientContext c;
    Ctx(&c);
    grpc::Status st = seq_->GetSequence(&c, r, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return st.ok() ? resp.sequence().layer_lengths(layer) : -1;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<pbs::SequenceService::Stub> seq_;
};

}  // namespace attn::testing
