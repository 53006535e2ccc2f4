#include "loadgen/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

namespace attn::loadgen {
namespace {

// Never destroyed: the sigwait and grace threads are detached and may still wait on it while
// the process exits.
struct State {
  std::atomic<int> signal{0};
  std::mutex mutex;
  std::condition_variable cv;
  double grace_s = 2.0;
  Interrupt::Clock::time_point grace_end{};
  bool grace_over = false;
  std::set<grpc::ClientContext*> calls;
};

State& S() {
  static State* state = new State;
  return *state;
}

// The grace thread: after the first interrupt, waits grace_s, then cancels every registered
// call (new registrations are cancelled at once from then on).
void GraceLoop() {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.cv.wait(lock, [&] { return s.signal.load() != 0; });
  s.cv.wait_until(lock, s.grace_end, [] { return false; });
  s.grace_over = true;
  for (grpc::ClientContext* c : s.calls) c->TryCancel();
}

// The sigwait thread: the first signal triggers the interrupt, a second one exits at once.
void SignalLoop(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (S().signal.load() != 0) {
      const char msg[] = "attention-loadgen: second signal, exiting without a report\n";
      (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
      _exit(128 + sig);
    }
    const char msg[] =
        "attention-loadgen: interrupted: no new requests; waiting for the calls in flight, "
        "then writing the partial report (signal again to exit at once)\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    Interrupt::Trigger(sig);
  }
}

}  // namespace

void Interrupt::Install(double grace_s) {
  S().grace_s = grace_s;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(SignalLoop, set).detach();
  std::thread(GraceLoop).detach();
}

bool Interrupt::Requested() { return S().signal.load() != 0; }

int Interrupt::Signal() { return S().signal.load(); }

std::string Interrupt::SignalName() {
  switch (Signal()) {
    case 0:
      return "";
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(Signal());
  }
}

int Interrupt::ExitCode() { return 128 + Signal(); }

void Interrupt::Trigger(int sig) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.signal.load() != 0) return;
  s.grace_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(s.grace_s));
  s.signal.store(sig);
  s.cv.notify_all();
}

bool Interrupt::SleepUntil(Clock::time_point t) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.mutex);
  return !s.cv.wait_until(lock, t, [&] { return s.signal.load() != 0; });
}

std::chrono::system_clock::time_point Interrupt::CapDeadline(
    std::chrono::system_clock::time_point deadline) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.signal.load() == 0) return deadline;
  const auto left = s.grace_end - Clock::now();
  const auto end = std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(left);
  return std::min(deadline, end);
}

void Interrupt::Register(grpc::ClientContext* context) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.grace_over) {
    context->TryCancel();
    return;
  }
  s.calls.insert(context);
}

void Interrupt::Unregister(grpc::ClientContext* context) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.calls.erase(context);
}

Interrupt::ScopedCall::ScopedCall(grpc::ClientContext* context) : context_(context) {
  Register(context_);
}

Interrupt::ScopedCall::~ScopedCall() { Unregister(context_); }

}  // namespace attn::loadgen
