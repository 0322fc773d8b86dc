// CPU reference of kernels/activation: templated so gradient checks run in double.
#pragma once
#include <cmath>
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

// 1 / (1 + e^-x), written so exp never overflows: for x < 0 it is e^x / (1 + e^x). The CUDA
// kernel uses the same two branches.
template <class T>
T sigmoid_of(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

template <class T>
void sigmoid_fwd(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_of(x[i]);
}

// From the output: dx = dy * y * (1 - y).
template <class T>
void sigmoid_bwd(const T* y, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (y[i] * (T(1) - y[i]));
}

template <class T>
void silu_fwd(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_of(x[i]);
}

// From the input: d/dx x*s(x) = s + x*s*(1 - s).
template <class T>
void silu_bwd(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = sigmoid_of(x[i]);
    dx[i] = dy[i] * (s + x[i] * s * (T(1) - s));
  }
}

// NaN propagates (neither comparison holds, so x itself is returned).
template <class T>
void relu6_fwd(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : (x[i] > T(6) ? T(6) : x[i]);
}

// From the input: dy where 0 < x < 6, else 0 (0 at both kinks, as PyTorch's hardtanh backward).
template <class T>
void relu6_bwd(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = (x[i] > T(0) && x[i] < T(6)) ? dy[i] : T(0);
}

}  // namespace ditto::ref
