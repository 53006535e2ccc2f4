#include "backends/backend_registry.h"

#include <gtest/gtest.h>

namespace attn {
namespace {

// A backend with scripted answers, for testing resolution only.
class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend(std::string name, bool available, int64_t max_head_dim)
      : name_(std::move(name)), available_(available), max_head_dim_(max_head_dim) {}
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override { return {}; }
  bool available() const override { return available_; }
  std::string unavailable_reason() const override { return "scripted: no device"; }
  Status Supports(const AttentionShape& s) const override {
    if (s.head_dim > max_head_dim_) return FailedPrecondition("head_dim too large");
    return Status::Ok();
  }
  Status Execute(const AttentionShape&, const AttentionTensors&, ExecuteTimes*) override {
    return Status::Ok();
  }

 private:
  std::string name_;
  bool available_;
  int64_t max_head_dim_;
};

BackendRegistry MakeRegistry(bool fast_available) {
  BackendRegistry r;
  r.Add(std::make_unique<ScriptedBackend>("slow", true, 1024), 100);
  r.Add(std::make_unique<ScriptedBackend>("fast", fast_available, 128), 10);
  r.Add(std::make_unique<ScriptedBackend>("manual", true, 1024), -1);
  return r;
}

AttentionShape Shape(int64_t h) {
  AttentionShape s;
  s.head_dim = h;
  return s;
}

TEST(BackendRegistry, AutoPrefersRankedBackendThatSupports) {
  BackendRegistry r = MakeRegistry(true);
  auto c = r.Resolve("auto", "auto", Shape(64));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend->name(), "fast");
  c = r.Resolve("", "auto", Shape(256));  // fast refuses: falls to slow, never to manual
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend->name(), "slow");
  EXPECT_NE(c->reason.find("server default"), std::string::npos);
}

TEST(BackendRegistry, AutoSkipsUnavailable) {
  BackendRegistry r = MakeRegistry(false);
  auto c = r.Resolve("auto", "auto", Shape(64));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend->name(), "slow");
}

TEST(BackendRegistry, NamedBackendNeverFallsBack) {
  BackendRegistry r = MakeRegistry(true);
  auto c = r.Resolve("fast", "auto", Shape(256));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("head_dim too large"), std::string::npos);
  BackendRegistry r2 = MakeRegistry(false);
  c = r2.Resolve("fast", "auto", Shape(64));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("unavailable"), std::string::npos);
}

TEST(BackendRegistry, UnknownNameIsInvalidArgument) {
  BackendRegistry r = MakeRegistry(true);
  auto c = r.Resolve("nope", "auto", Shape(64));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("known: auto, slow, fast, manual"), std::string::npos);
}

}  // namespace
}  // namespace attn
