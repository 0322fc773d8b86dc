// CPU reference of kernels/activation: templated so gradient checks run in double.
#pragma once
#include <cstdint>

namespace ditto::ref {

template <class T>
void relu_fwd(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

// The gradient at exactly 0 is taken as 0 (as in cuDNN and PyTorch).
template <class T>
void relu_bwd(const T* y, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

}  // namespace ditto::ref
