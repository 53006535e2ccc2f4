// A backend this build or machine cannot offer (e.g. `naive` in a build without CUDA). It is
// listed by GetServerInfo with the reason, and a request naming it gets FAILED_PRECONDITION
// with that reason instead of "unknown backend".
#pragma once

#include <string>

#include "backends/backend.h"

namespace attn {

class UnavailableBackend final : public Backend {
 public:
  UnavailableBackend(std::string name, std::string reason, std::string description)
      : name_(std::move(name)), reason_(std::move(reason)), description_(std::move(description)) {}
  const std::string& name() const override { return name_; }
  BackendCapabilities Capabilities() const override {
    BackendCapabilities c;
    c.device = "none";
    c.description = description_;
    return c;
  }
  bool available() const override { return false; }
  std::string unavailable_reason() const override { return reason_; }
  Status Supports(const AttentionShape&) const override { return FailedPrecondition(reason_); }
  Status Execute(const AttentionShape&, const AttentionTensors&, ExecuteTimes*) override {
    return FailedPrecondition(reason_);
  }

 private:
  std::string name_;
  std::string reason_;
  std::string description_;
};

}  // namespace attn
