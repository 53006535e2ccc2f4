#include "backends/backend_registry.h"

#include <algorithm>

#include "backends/fault_injecting_backend.h"
#include "common/client_text.h"

namespace attn {

void BackendRegistry::Add(std::unique_ptr<Backend> backend, int auto_rank) {
  entries_.push_back(Entry{std::move(backend), auto_rank});
}

Backend* BackendRegistry::Find(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.backend->name() == name) return e.backend.get();
  }
  return nullptr;
}

std::vector<Backend*> BackendRegistry::All() const {
  std::vector<Backend*> out;
  for (const auto& e : entries_) out.push_back(e.backend.get());
  return out;
}

std::string BackendRegistry::KnownNames() const {
  std::string s = "auto";
  for (const auto& e : entries_) s += ", " + e.backend->name();
  return s;
}

void BackendRegistry::InjectFaultAfter(int64_t n) {
  auto counter = std::make_shared<FaultCounter>(n);
  for (auto& e : entries_) {
    e.backend = std::make_unique<FaultInjectingBackend>(std::move(e.backend), counter);
  }
}

StatusOr<BackendChoice> BackendRegistry::Resolve(const std::string& requested,
                                                 const std::string& default_name,
                                                 const AttentionShape& shape) const {
  const std::string& name = requested.empty() ? default_name : requested;
  const char* how = requested.empty() ? "server default" : "requested";
  if (name != "auto") {
    Backend* b = Find(name);
    if (b == nullptr) {
      return InvalidArgument("backend: unknown backend \"" + EchoClientText(name) +
                             "\"; known: " + KnownNames());
    }
    if (!b->available()) {
      return FailedPrecondition("backend \"" + name + "\" is unavailable on this server: " +
                                b->unavailable_reason());
    }
    Status s = b->Supports(shape);
    if (!s.ok()) {
      return Status(s.code() == StatusCode::kResourceExhausted ? s.code()
                                                               : StatusCode::kFailedPrecondition,
                    "backend \"" + name + "\" cannot run this request: " + s.message());
    }
    return BackendChoice{b, how, {}};
  }
  std::string bucket;
  if (calibration_) {
    const std::string chosen = calibration_->ChoiceFor(shape, &bucket);
    Backend* b = chosen.empty() ? nullptr : Find(chosen);
    if (b != nullptr && b->available() && b->Supports(shape).ok()) {
      return BackendChoice{b, std::string("auto (") + how + "): calibrated, fastest in bucket \"" +
                                  bucket + "\"",
                           bucket};
    }
  }
  std::vector<const Entry*> ranked;
  for (const auto& e : entries_) {
    if (e.auto_rank >= 0) ranked.push_back(&e);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const Entry* a, const Entry* b) { return a->auto_rank < b->auto_rank; });
  std::string reasons;
  for (const Entry* e : ranked) {
    Backend* b = e->backend.get();
    if (!b->available()) {
      reasons += "; " + b->name() + ": unavailable (" + b->unavailable_reason() + ")";
      continue;
    }
    Status s = b->Supports(shape);
    if (s.ok()) {
      return BackendChoice{b,
                           std::string("auto (") + how + "): first in preference order "
                               "that supports the request" +
                               (bucket.empty() ? "" : " (bucket \"" + bucket + "\" uncalibrated)"),
                           bucket};
    }
    reasons += "; " + b->name() + ": " + s.message();
  }
  return FailedPrecondition("auto: no backend supports this request" + reasons);
}

}  // namespace attn
