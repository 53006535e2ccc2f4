#include "service/shadow_checker.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "attn/kernels/cpu_attention.h"
#include "attn/kernels/host_dtype.h"

namespace attn::metrics {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

FractionSampler::FractionSampler(double fraction)
    : fraction_(std::isnan(fraction) ? 0 : std::min(1.0, std::max(0.0, fraction))) {}

bool FractionSampler::Sample() {
  if (fraction_ <= 0) return false;
  if (fraction_ >= 1) return true;
  const uint64_t i = calls_.fetch_add(1, std::memory_order_relaxed);
  return std::floor(static_cast<double>(i + 1) * fraction_) >
         std::floor(static_cast<double>(i) * fraction_);
}

double ShadowTolerance(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kFloat32:
      return 1e-5;
    case kernels::DType::kFloat16:
      return 2e-3;
    case kernels::DType::kBFloat16:
      return 1e-2;
    case kernels::DType::kFloat8E4M3:
      return 6e-2;
  }
  return 1e-2;
}

ShadowComparison CompareWithReference(const void* out, kernels::DType dtype, const double* ref,
                                      int64_t elements, int64_t row_len, double tolerance) {
  ShadowComparison c;
  if (row_len <= 0) row_len = elements > 0 ? elements : 1;
  double diff_sq = 0, ref_sq = 0;
  bool finite = true;
  for (int64_t r0 = 0; r0 < elements; r0 += row_len) {
    const int64_t r1 = std::min(elements, r0 + row_len);
    double row_diff = 0, row_ref = 0;
    bool row_finite = true;
    for (int64_t i = r0; i < r1; ++i) {
      const double o = kernels::LoadAsFloat(out, dtype, i);
      if (!std::isfinite(o)) row_finite = false;
      const double d = o - ref[i];
      row_diff += d * d;
      row_ref += ref[i] * ref[i];
    }
    diff_sq += row_diff;
    ref_sq += row_ref;
    double row_error;
    if (!row_finite) {
      row_error = kInf;
      finite = false;
    } else if (row_ref == 0) {
      row_error = row_diff == 0 ? 0 : kInf;  // a masked row must be exactly zero
    } else {
      row_error = std::sqrt(row_diff / row_ref);
    }
    c.worst_row_error = std::max(c.worst_row_error, row_error);
  }
  if (!finite) {
    c.relative_error = kInf;
  } else if (ref_sq == 0) {
    c.relative_error = diff_sq == 0 ? 0 : kInf;
  } else {
    c.relative_error = std::sqrt(diff_sq / ref_sq);
  }
  c.mismatch = !(c.relative_error <= tolerance) || !(c.worst_row_error <= 5 * tolerance);
  return c;
}

struct ShadowChecker::Job {
  int backend = 0;
  kernels::AttentionShape shape;
  std::vector<char> q, k, v, o;
  std::vector<int32_t> q_lengths, kv_lengths;
  std::vector<int64_t> q_offsets, kv_offsets;
  uint64_t bytes = 0;
};

ShadowChecker::ShadowChecker(Options options, Metrics* metrics)
    : options_(options),
      enabled_(options.fraction > 0),
      sampler_(options.fraction),
      metrics_(metrics) {
  if (enabled_) thread_ = std::thread([this] { Loop(); });
}

ShadowChecker::~ShadowChecker() { Stop(); }

void ShadowChecker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (const auto& job : queue_) {
      --reserved_;
      reserved_bytes_ -= job->bytes;
    }
    queue_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ShadowChecker::Drop(int backend) {
  dropped_.fetch_add(1);
  if (metrics_ != nullptr) metrics_->ShadowDropped(backend);
}

void ShadowChecker::Submit(int backend, const ValidatedAttend& v, const void* o) {
  if (!enabled_) return;
  const kernels::AttentionShape& s = v.shape;
  const int es = kernels::DTypeSize(s.dtype);
  const uint64_t q_bytes = static_cast<uint64_t>(s.q_elements()) * es;
  const uint64_t kv_bytes = static_cast<uint64_t>(s.kv_elements()) * es;
  const uint64_t bytes = 2 * q_bytes + 2 * kv_bytes + v.o_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || reserved_ >= options_.max_queued ||
        reserved_bytes_ + bytes > options_.max_queued_bytes) {
      Drop(backend);
      return;
    }
    ++reserved_;
    reserved_bytes_ += bytes;
  }
  auto job = std::make_unique<Job>();
  job->backend = backend;
  job->shape = s;
  job->bytes = bytes;
  auto copy = [](std::vector<char>* dst, const void* src, uint64_t n) {
    dst->resize(n);
    if (n > 0) std::memcpy(dst->data(), src, n);
  };
  copy(&job->q, v.q, q_bytes);
  copy(&job->k, v.k, kv_bytes);
  copy(&job->v, v.v, kv_bytes);
  copy(&job->o, o, v.o_bytes);
  job->q_lengths = v.q_lengths;
  job->kv_lengths = v.kv_lengths;
  job->q_offsets = v.q_offsets;
  job->kv_offsets = v.kv_offsets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      --reserved_;
      reserved_bytes_ -= bytes;
      return;
    }
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

bool ShadowChecker::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return reserved_ == 0 && !running_job_; });
}

void ShadowChecker::Loop() {
  // Lowest priority for this thread only (Linux: nice applies per thread id).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) break;
    std::unique_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    running_job_ = true;
    lock.unlock();
    Check(*job);
    lock.lock();
    running_job_ = false;
    --reserved_;
    reserved_bytes_ -= job->bytes;
    job.reset();
    idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

void ShadowChecker::Check(const Job& job) {
  const kernels::AttentionShape& s = job.shape;
  kernels::AttentionTensors t;
  t.q = job.q.data();
  t.k = job.k.data();
  t.v = job.v.data();
  t.q_lengths = job.q_lengths.empty() ? nullptr : job.q_lengths.data();
  t.kv_lengths = job.kv_lengths.empty() ? nullptr : job.kv_lengths.data();
  t.q_offsets = job.q_offsets.empty() ? nullptr : job.q_offsets.data();
  t.kv_offsets = job.kv_offsets.empty() ? nullptr : job.kv_offsets.data();
  std::vector<double> ref(static_cast<size_t>(s.q_elements()));
  Status st = kernels::CpuAttentionF64(s, t, ref.data(), nullptr, /*num_threads=*/1);
  if (!st.ok()) {
    spdlog::warn("shadow check skipped: the cpu reference cannot run it: {}", st.ToString());
    return;
  }
  const double tol = ShadowTolerance(s.dtype);
  const ShadowComparison c =
      CompareWithReference(job.o.data(), s.dtype, ref.data(), s.q_elements(), s.head_dim, tol);
  checked_.fetch_add(1);
  if (c.mismatch) {
    mismatches_.fetch_add(1);
    const auto& names =
        metrics_ != nullptr ? metrics_->backend_names() : std::vector<std::string>{};
    const std::string backend = job.backend >= 0 && job.backend < static_cast<int>(names.size())
                                    ? names[static_cast<size_t>(job.backend)]
                                    : std::to_string(job.backend);
    spdlog::warn(
        "shadow check mismatch: backend={} dtype={} B={} T={} S={} N={} K={} H={} "
        "rel_error={:.3g} worst_row={:.3g} tol={:.0e}",
        backend, kernels::DTypeName(s.dtype), s.batch, s.max_q_len, s.max_kv_len, s.num_heads,
        s.num_kv_heads, s.head_dim, c.relative_error, c.worst_row_error, tol);
  }
  if (metrics_ != nullptr) metrics_->ObserveShadow(job.backend, c.relative_error, c.mismatch);
}

}  // namespace attn::metrics
