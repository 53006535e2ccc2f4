// Fast, seeded, reproducible standard-normal samples for request inputs.
#pragma once

#include <cstdint>

namespace attn::loadgen {

/// SplitMix64 step: a well-mixed 64-bit hash of `x` (used to derive per-request seeds).
uint64_t SplitMix64(uint64_t x);

/// Draws approximately standard-normal floats: a xoshiro256** stream indexes a table of the
/// 65,536 normal quantiles Φ⁻¹((i + ½) / 65536). Values lie in about [-4.5, 4.5]; none is
/// zero. The same seed always gives the same sequence on every platform. Not thread-safe
/// (one generator per thread); the shared table is built once, thread-safely.
class NormalGenerator {
 public:
  /// Starts a stream determined by `seed`.
  explicit NormalGenerator(uint64_t seed);

  /// Fills `out[0..count)` with samples.
  void Fill(float* out, int64_t count);

  /// Returns a uniform double in [0, 1).
  double Uniform();

 private:
  uint64_t Next();
  uint64_t s_[4];
};

/// Inverse of the standard normal CDF (Acklam's rational approximation with one Halley step;
/// relative error below 1e-9). `p` must lie in (0, 1).
double NormalQuantile(double p);

}  // namespace attn::loadgen
