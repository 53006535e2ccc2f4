#include "loadgen/progress.h"

#include <unistd.h>

#include <cmath>
#include <utility>

namespace attn::loadgen {

Progress::Progress(bool enabled, std::FILE* out, std::string unit)
    : enabled_(enabled),
      out_(out),
      unit_(unit.empty() ? "" : " " + std::move(unit)),
      tty_(out != nullptr && isatty(fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_time_(start_) {}

Progress::~Progress() { Stop(); }

void Progress::Start() {
  if (!enabled_ || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void Progress::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    if (tty_) {
      std::fprintf(out_, "\n");
      std::fflush(out_);
    }
  }
}

void Progress::Record(double latency_ms, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++done_;
  if (ok) {
    latency_us_.Record(static_cast<int64_t>(std::llround(latency_ms * 1000.0)));
  } else {
    ++errors_;
  }
}

void Progress::RecordOverload() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++overload_;
}

std::string Progress::Line() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double since = std::chrono::duration<double>(now - last_time_).count();
  const double rate = since > 0 ? static_cast<double>(done_ - last_done_) / since : 0;
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "[%.0fs] done %lld%s (%.1f/s)  p50 %.3f ms  p99 %.3f ms  errors %lld", elapsed,
                static_cast<long long>(done_), unit_.c_str(), rate,
                latency_us_.Percentile(50) / 1000.0,
                latency_us_.Percentile(99) / 1000.0, static_cast<long long>(errors_));
  std::string line = buf;
  if (overload_ > 0) line += "  client overload " + std::to_string(overload_);
  return line;
}

void Progress::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto next = start_ + std::chrono::seconds(1);
  while (!cv_.wait_until(lock, next, [this] { return stopping_; })) {
    lock.unlock();
    const std::string line = Line();
    if (tty_) {
      std::fprintf(out_, "\r\033[K%s", line.c_str());
    } else {
      std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
    lock.lock();
    last_done_ = done_;
    last_time_ = std::chrono::steady_clock::now();
    next += std::chrono::seconds(1);
  }
}

}  // namespace attn::loadgen
