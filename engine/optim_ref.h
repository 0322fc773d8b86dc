// CPU reference of the optimizer updates (the CUDA kernels compute the same expressions in
// the same order, in float, per element).
#pragma once
#include <cmath>
#include <cstdint>

namespace ditto::ref {

// torch.optim.SGD: g += wd*p; buf = momentum*buf + g (buf starts at zero, so the first step
// gives buf = g as in PyTorch); g = nesterov ? g + momentum*buf : buf; p -= lr*g.
template <class T>
void sgd_update(T* p, const T* grad, T* buf, int64_t n, T lr, T momentum, bool nesterov, T wd) {
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] + wd * p[i];
    if (momentum != T(0)) {
      buf[i] = momentum * buf[i] + g;
      g = nesterov ? g + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * g;
  }
}

// torch.optim.Adam (no amsgrad): g += wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// p -= step_size * m / (sqrt(v) / bias2_sqrt + eps), step_size = lr / (1 - b1^t),
// bias2_sqrt = sqrt(1 - b2^t).
template <class T>
void adam_update(T* p, const T* grad, T* m, T* v, int64_t n, T step_size, T b1, T b2, T eps, T bias2_sqrt, T wd) {
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] + wd * p[i];
    m[i] = b1 * m[i] + (T(1) - b1) * g;
    v[i] = b2 * v[i] + (T(1) - b2) * g * g;
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
  }
}

}  // namespace ditto::ref
