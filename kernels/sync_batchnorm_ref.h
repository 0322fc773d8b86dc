// CPU reference of kernels/sync_batchnorm (batch norm with statistics over every rank's
// examples): templated so gradient checks run in double; sums accumulate in double.
//
// Forward, per rank: the channel sums s1 = sum x and s2 = sum x^2 and the count M_r = N_r*H*W,
// in double (sbn_local_sums). The ranks' records are merged by the binary-counter tree over the
// rank index (engine/collective_ref.h), identically on every rank (sbn_merge), and give
//   mean = S1 / M,  var = max(0, S2 / M - mean^2)  (biased),  invstd = 1 / sqrt(var + eps),
// and the running statistics move towards mean and var * M / (M - 1) (sbn_stats), as
// kernels/batchnorm does for one rank. y = (x - mean) * invstd * gamma + beta (ref::bn_apply).
// Backward: each rank's dbeta_r = sum dy and dgamma_r = sum dy * xhat (ref::bn_bwd without dx),
// merged over the ranks in the same tree; dx uses the merged sums and the global M:
//   dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M)     (sbn_bwd_dx)
// The parameter gradients a rank keeps are its own dgamma_r, dbeta_r: the data-parallel
// gradient all-reduce sums them with every other gradient.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/collective_ref.h"

namespace ditto::ref {

// sums (2c + 1 doubles): s1 per channel, s2 per channel, then the count n*hw.
template <class T>
void sbn_local_sums(const T* x, int64_t n, int64_t c, int64_t hw, double* sums) {
  for (int64_t ch = 0; ch < c; ++ch) {
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) {
        const double v = double(x[(i * c + ch) * hw + k]);
        s1 += v;
        s2 += v * v;
      }
    sums[ch] = s1;
    sums[c + ch] = s2;
  }
  sums[2 * c] = double(n) * double(hw);
}

// out[i] = tree sum over the ranks of records[r * per + i] (ranks records of `per` values).
template <class T>
void sbn_merge(const T* records, int64_t ranks, int64_t per, T* out) {
  for (int64_t i = 0; i < per; ++i) {
    auto add = [](T a, T b) { return a + b; };
    CounterTree<T, decltype(add)> tree(add);
    for (int64_t r = 0; r < ranks; ++r) tree.push(records[r * per + i]);
    out[i] = tree.result();
  }
}

// mean, invstd and the running-statistics update from merged sums (2c + 1 doubles).
template <class T>
void sbn_stats(const double* sums, int64_t c, double momentum, double eps, T* mean, T* invstd, T* running_mean,
               T* running_var) {
  const double m = sums[2 * c];
  for (int64_t ch = 0; ch < c; ++ch) {
    const double mu = sums[ch] / m;
    const double var = std::max(0.0, sums[c + ch] / m - mu * mu);
    mean[ch] = static_cast<T>(mu);
    invstd[ch] = static_cast<T>(1.0 / std::sqrt(var + eps));
    if (running_mean) running_mean[ch] = static_cast<T>((1 - momentum) * double(running_mean[ch]) + momentum * mu);
    if (running_var)
      running_var[ch] = static_cast<T>((1 - momentum) * double(running_var[ch]) + momentum * var * m / (m - 1));
  }
}

// dx from the merged sums dbeta, dgamma (per channel) and the global count m.
template <class T>
void sbn_bwd_dx(const T* x, const T* dy, const T* mean, const T* invstd, const T* gamma, const T* dbeta,
                const T* dgamma, double m, T* dx, int64_t n, int64_t c, int64_t hw) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const double mu = double(mean[ch]), is = double(invstd[ch]), g = double(gamma[ch]) * is;
      for (int64_t k = 0; k < hw; ++k) {
        const int64_t j = (i * c + ch) * hw + k;
        const double xhat = (double(x[j]) - mu) * is;
        dx[j] = static_cast<T>(g * (double(dy[j]) - double(dbeta[ch]) / m - xhat * double(dgamma[ch]) / m));
      }
    }
}

}  // namespace ditto::ref
