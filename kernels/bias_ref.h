// CPU reference of kernels/bias, templated so gradient checks run in double. Layout: x and y are
// {N, C, S} flattened (S = H*W, or 1 for {N, C}).
#pragma once
#include <cstdint>

namespace ditto::ref {

// y = x + b[c]. Computed in double and rounded once: for float this equals the float sum exactly
// (double rounding is innocuous for + when the wide format has >= 2p+2 bits: 53 >= 50).
template <class T>
void bias_fwd(const T* x, const T* b, T* y, int64_t n, int64_t c, int64_t s) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < s; ++k) {
        int64_t idx = (i * c + ch) * s + k;
        y[idx] = static_cast<T>(double(x[idx]) + double(b[ch]));
      }
}

// db[c] = sum over n and s of dy, in double.
template <class T>
void bias_bwd_db(const T* dy, T* db, int64_t n, int64_t c, int64_t s) {
  for (int64_t ch = 0; ch < c; ++ch) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) acc += double(dy[(i * c + ch) * s + k]);
    db[ch] = static_cast<T>(acc);
  }
}

}  // namespace ditto::ref
