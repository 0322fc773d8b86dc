// CPU reference of kernels/linear: row-major GEMMs accumulating in double, templated on the
// element type so gradient checks run in double.
#pragma once
#include <cstdint>

namespace ditto::ref {

// y[n][o] = sum_i x[n][i] * w[o][i]          x {N, in}, w {out, in}, y {N, out}
template <class T>
void linear_fwd(const T* x, const T* w, T* y, int64_t n, int64_t in, int64_t out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * double(w[o * in + i]);
      y[r * out + o] = static_cast<T>(s);
    }
}

// dx[n][i] = sum_o dy[n][o] * w[o][i]
template <class T>
void linear_bwd_x(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t o = 0; o < out; ++o) s += double(dy[r * out + o]) * double(w[o * in + i]);
      dx[r * in + i] = static_cast<T>(s);
    }
}

// dw[o][i] = sum_n dy[n][o] * x[n][i]
template <class T>
void linear_bwd_w(const T* dy, const T* x, T* dw, int64_t n, int64_t in, int64_t out) {
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t r = 0; r < n; ++r) s += double(dy[r * out + o]) * double(x[r * in + i]);
      dw[o * in + i] = static_cast<T>(s);
    }
}

}  // namespace ditto::ref
