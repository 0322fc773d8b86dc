// CPU reference of kernels/batchnorm (spatial batch norm over N, H, W per channel): templated
// so gradient checks run in double; every reduction accumulates in double.
//
// Training: mean and the BIASED variance over the M = N*H*W values of a channel normalize x;
// the running statistics move by `momentum` towards the batch mean and the UNBIASED variance
// (var * M / (M-1)), as PyTorch and cuDNN do:
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var * M / (M - 1)
// Inference: the running statistics normalize x.
// Either way y = (x - mean) * invstd * gamma + beta with invstd = 1 / sqrt(var + eps), and the
// forward keeps (mean, invstd) per channel for backward.
#pragma once
#include <cmath>
#include <cstdint>

namespace ditto::ref {

// Batch statistics of x (N, C, HW): saved_mean, saved_invstd, and the running-stat update.
template <class T>
void bn_batch_stats(const T* x, int64_t n, int64_t c, int64_t hw, double momentum, double eps, T* saved_mean,
                    T* saved_invstd, T* running_mean, T* running_var) {
  const double m = double(n) * double(hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) s += double(x[(i * c + ch) * hw + k]);
    const double mean = s / m;
    double q = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) {
        const double dv = double(x[(i * c + ch) * hw + k]) - mean;
        q += dv * dv;
      }
    const double var = q / m;
    saved_mean[ch] = static_cast<T>(mean);
    saved_invstd[ch] = static_cast<T>(1.0 / std::sqrt(var + eps));
    if (running_mean) running_mean[ch] = static_cast<T>((1 - momentum) * double(running_mean[ch]) + momentum * mean);
    if (running_var)
      running_var[ch] = static_cast<T>((1 - momentum) * double(running_var[ch]) + momentum * (q / (m - 1)));
  }
}

// Inference statistics: mean = running_mean, invstd = 1 / sqrt(running_var + eps).
template <class T>
void bn_running_stats(const T* running_mean, const T* running_var, int64_t c, double eps, T* mean, T* invstd) {
  for (int64_t ch = 0; ch < c; ++ch) {
    mean[ch] = running_mean[ch];
    invstd[ch] = static_cast<T>(1.0 / std::sqrt(double(running_var[ch]) + eps));
  }
}

// y = (x - mean) * invstd * gamma + beta.
template <class T>
void bn_apply(const T* x, const T* mean, const T* invstd, const T* gamma, const T* beta, T* y, int64_t n, int64_t c,
              int64_t hw) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const double a = double(invstd[ch]) * double(gamma[ch]);
      for (int64_t k = 0; k < hw; ++k) {
        const int64_t j = (i * c + ch) * hw + k;
        y[j] = static_cast<T>((double(x[j]) - double(mean[ch])) * a + double(beta[ch]));
      }
    }
}

// Backward. dbeta = sum dy, dgamma = sum dy * xhat (xhat = (x - mean) * invstd), per channel.
// Training (mean and invstd depend on x):
//   dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M)
// Inference (statistics are constants): dx = gamma * invstd * dy. dx may be null.
template <class T>
void bn_bwd(const T* x, const T* dy, const T* mean, const T* invstd, const T* gamma, bool training, T* dx, T* dgamma,
            T* dbeta, int64_t n, int64_t c, int64_t hw) {
  const double m = double(n) * double(hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double mu = double(mean[ch]), is = double(invstd[ch]);
    double sdy = 0, sdyx = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) {
        const int64_t j = (i * c + ch) * hw + k;
        sdy += double(dy[j]);
        sdyx += double(dy[j]) * (double(x[j]) - mu) * is;
      }
    dbeta[ch] = static_cast<T>(sdy);
    dgamma[ch] = static_cast<T>(sdyx);
    if (!dx) continue;
    const double g = double(gamma[ch]) * is;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) {
        const int64_t j = (i * c + ch) * hw + k;
        if (training) {
          const double xhat = (double(x[j]) - mu) * is;
          dx[j] = static_cast<T>(g * (double(dy[j]) - sdy / m - xhat * sdyx / m));
        } else {
          dx[j] = static_cast<T>(g * double(dy[j]));
        }
      }
  }
}

}  // namespace ditto::ref
