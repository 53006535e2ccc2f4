// Fixtures shared by the KV-cache unit tests (one test file per component, issue 17): a page
// pool over host memory, and a test base that builds sequence stores with a replica tag and
// address over one pool (replica ids in sequence_store_test.cc, the GetLoad report in
// load_report_test.cc). No network, no device.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "kv_cache/host_pool.h"
#include "kv_cache/page_pool.h"
#include "kv_cache/sequence_store.h"

namespace attn::testing {

/// A page pool over `bytes` of host memory (default: 1 MiB, 4-token pages, 8 pages per chunk).
struct PoolFixture {
  explicit PoolFixture(int64_t bytes = 1 << 20, PagePoolOptions o = {4, 8, true})
      : memory(std::move(*HostPool::Create(bytes))), pool(memory.get(), o) {}
  std::unique_ptr<HostPool> memory;
  PagePool pool;
};

/// Stores over one 1 MiB host pool, each with its own replica tag and address; Config() is a
/// one-layer float32 sequence (N = 4, K = 2, H = 8, 32 reserved tokens).
class ReplicaStoreTestBase : public ::testing::Test {
 protected:
  ReplicaStoreTestBase()
      : memory_(std::move(*HostPool::Create(1 << 20))), pages_(memory_.get(), PagePoolOptions{}) {}
  std::unique_ptr<SequenceStore> MakeStore(uint32_t tag, const std::string& address) {
    SequenceStoreOptions o;
    o.replica_tag = tag;
    o.replica_address = address;
    return std::make_unique<SequenceStore>(&pages_, o);
  }
  static SequenceConfig Config() {
    SequenceConfig c;
    c.num_layers = 1;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.num_heads = 4;
    c.dtype = c.kv_dtype = kernels::DType::kFloat32;
    c.scale = 0.25f;
    c.reserve_tokens = 32;
    return c;
  }
  std::unique_ptr<HostPool> memory_;
  PagePool pages_;
};

}  // namespace attn::testing
