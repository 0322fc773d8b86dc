// CPU reference of loss scaling (engine/loss_scale.h): the scale schedule, which the CUDA update
// kernel calls as well (one definition, so host and device follow the same rules bit for bit),
// and the check-and-unscale of one gradient.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define DITTO_LOSS_SCALE_HD __host__ __device__
#else
#define DITTO_LOSS_SCALE_HD
#endif

namespace ditto::ref {

// torch's _amp_update_scale_: an overflow multiplies the scale by backoff and clears the count
// of good steps; a good step counts, and the interval-th good step in a row multiplies the scale
// by growth (kept when that would be infinite) and clears the count. Powers of two only, so every
// product is exact.
DITTO_LOSS_SCALE_HD inline void update_loss_scale(float& scale, int32_t& good_steps, bool overflow, float growth,
                                                  float backoff, int32_t interval) {
  if (overflow) {
    scale = scale * backoff;
    good_steps = 0;
    return;
  }
  if (++good_steps < interval) return;
  const float grown = scale * growth;
  if (grown - grown == 0.0f) scale = grown;  // finite: inf - inf and nan - nan are nan
  good_steps = 0;
}

// Divides g by scale in place (exact for a power of two); true when any result is non-finite,
// which covers a non-finite gradient and one the division overflowed.
inline bool unscale_and_check(float* g, int64_t n, float scale) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    g[i] = g[i] / scale;
    bad |= !std::isfinite(g[i]);
  }
  return bad;
}

}  // namespace ditto::ref
