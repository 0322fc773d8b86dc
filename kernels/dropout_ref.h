// CPU reference of kernels/dropout, templated so gradient checks run in double. The mask is the
// same for every T: it depends only on (key, index, p).
#pragma once
#include <cstdint>

#include "engine/philox.h"

namespace ditto::ref {

// True when element i is dropped.
inline bool dropout_dropped(uint64_t key, int64_t i, float p) {
  Philox4x32 r = philox4x32(static_cast<uint64_t>(i) / 4, 0, key);
  return philox_uniform(r.v[i % 4]) < p;
}

// y = x * scale where kept, 0 where dropped; scale = 1 / (1 - p) computed in T (for float exactly
// the scale the GPU path uses).
template <class T>
void dropout_apply(const T* x, T* y, int64_t n, float p, uint64_t key) {
  const T scale = T(1) / (T(1) - T(p));
  for (int64_t q = 0; q * 4 < n; ++q) {
    Philox4x32 r = philox4x32(static_cast<uint64_t>(q), 0, key);
    for (int k = 0; k < 4 && q * 4 + k < n; ++k) {
      const int64_t i = q * 4 + k;
      y[i] = philox_uniform(r.v[k]) < p ? T(0) : x[i] * scale;
    }
  }
}

// Forward and backward are the same masked scaling: dx = dy * scale where kept.
template <class T>
void dropout_fwd(const T* x, T* y, int64_t n, float p, uint64_t key) { dropout_apply(x, y, n, p, key); }
template <class T>
void dropout_bwd(const T* dy, T* dx, int64_t n, float p, uint64_t key) { dropout_apply(dy, dx, n, p, key); }

}  // namespace ditto::ref
