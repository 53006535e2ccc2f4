#include "startup/drain.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/unix_socket.h"
#include "health/health_fanout.h"

namespace attn::startup {

void DrainOrExit(const ServerConfig& config, const DrainTargets& t, int sig,
                 const std::string& socket_path) {
  spdlog::info("signal {}: draining ({} calls and {} sequence calls or streams in flight)", sig,
               t.service->in_flight(), t.sequence_service->in_flight());
  t.health->SetServingStatus(false);
  t.health->SetServingStatus(health::kAttentionServiceName, false);
  t.health->SetServingStatus(health::kSequenceServiceName, false);
  if (!t.faulted) t.health->SetServingStatus(health::kLivenessServiceName, true);
  t.service->StartDraining();
  t.sequence_service->StartDraining();
  t.load->SetDraining();
  // One deadline for the whole drain (--drain-timeout-s), shared by both services.
  const auto drain_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(config.drain_timeout_s * 1e3));
  auto remaining = [&drain_deadline] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(drain_deadline - std::chrono::steady_clock::now(),
                 std::chrono::steady_clock::duration::zero()));
  };
  // --drain-wait-sequences: serve the sequences held here until released or expired (new ones
  // are refused), so scale-down strands no live generation; then the calls in flight.
  if (config.drain_wait_sequences && !t.sequence_service->WaitSequencesGone(remaining())) {
    spdlog::warn("drain timeout after {} s: dropping {} live sequences", config.drain_timeout_s,
                 t.sequences->live_sequences());
  }
  // Open ExtendStreams end now (idle ones at once, busy ones after their current step) with
  // UNAVAILABLE; a client keeping a stream open would otherwise hold the drain to its timeout.
  t.sequence_service->EndStreams();
  const bool drained =
      t.service->WaitIdle(remaining()) && t.sequence_service->WaitIdle(remaining());
  if (drained) return;
  // Calls still queued (never started) get UNAVAILABLE now rather than a closed socket;
  // a moment lets gRPC write those statuses before the process exits.
  const Status refused = Unavailable(
      "server is draining: the drain timeout passed before this call started; retry on "
      "another replica");
  const int64_t dropped = t.service->RefuseQueued(refused) +
                          t.sequence_service->step_batcher()->scheduler()->RefuseQueued(refused);
  if (dropped > 0) {
    spdlog::warn("drain timeout: refused {} queued calls/steps with UNAVAILABLE", dropped);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  // Computations that have started cannot be interrupted; exit now rather than outlive the
  // orchestrator's grace period. Exit code 3 says the drain timed out. No Shutdown(): it
  // waits for every running call's reactor, i.e. for those very computations (a 30 s CPU
  // Attend held the process 30 s past a 1 s drain timeout); their clients see the connection
  // close (UNAVAILABLE).
  spdlog::error(
      "drain timeout after {} s: {} calls and {} sequence calls still in flight; "
      "exiting with code 3",
      config.drain_timeout_s, t.service->in_flight(), t.sequence_service->in_flight());
  if (!socket_path.empty()) RemoveUnixSocket(socket_path);
  spdlog::default_logger()->flush();
  std::_Exit(3);
}

}  // namespace attn::startup
