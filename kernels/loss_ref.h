// CPU reference of kernels/loss (softmax cross-entropy), accumulating in double, templated on the
// logits type so gradient checks run in double. Labels must already be in [0, c).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ditto::ref {

// log(sum_j exp(row[j])), max-subtracted.
template <class T>
double logsumexp_row(const T* row, int64_t c) {
  double m = double(row[0]);
  for (int64_t j = 1; j < c; ++j) m = std::max(m, double(row[j]));
  double s = 0;
  for (int64_t j = 0; j < c; ++j) s += std::exp(double(row[j]) - m);
  return m + std::log(s);
}

// Mean over the n rows of logsumexp(row) - row[label].
template <class T>
double softmax_xent_fwd(const T* logits, const int32_t* labels, int64_t n, int64_t c) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += logsumexp_row(logits + i * c, c) - double(logits[i * c + labels[i]]);
  return total / double(n);
}

// dlogits = (softmax - onehot) * dl / n.
template <class T>
void softmax_xent_bwd(const T* logits, const int32_t* labels, int64_t n, int64_t c, double dl, T* dlogits) {
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits + i * c;
    double lse = logsumexp_row(row, c);
    for (int64_t j = 0; j < c; ++j) {
      double g = std::exp(double(row[j]) - lse) - (j == labels[i] ? 1.0 : 0.0);
      dlogits[i * c + j] = static_cast<T>(g * dl / double(n));
    }
  }
}

}  // namespace ditto::ref
