// CPU reference of kernels/pixel_xent, accumulating in double, templated on the logits type so
// gradient checks run in double. Layout: logits {n, c, hw} (hw = H*W), labels {n, hw}; labels must
// be in [0, c) or equal to `ignore`.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace ditto::ref {

// log(sum_c exp(x[c * hw])) for one pixel's channels (stride hw), max-subtracted.
template <class T>
double pixel_logsumexp(const T* x, int64_t c, int64_t hw) {
  double m = double(x[0]);
  for (int64_t k = 1; k < c; ++k) m = std::max(m, double(x[k * hw]));
  double s = 0;
  for (int64_t k = 0; k < c; ++k) s += std::exp(double(x[k * hw]) - m);
  return m + std::log(s);
}

// Mean over the counted pixels of logsumexp - x[label]; *count gets how many were counted.
// NaN when none was.
// The mean over the counted pixels of loss(x, label), x the pixel's first channel (stride hw);
// *count gets how many were counted. NaN when none was.
template <class T, class PixelLoss>
double pixel_mean(const T* input, const int32_t* labels, int64_t n, int64_t c, int64_t hw, int ignore, int64_t* count,
                  PixelLoss&& loss) {
  double total = 0;
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < hw; ++s) {
      const int32_t label = labels[i * hw + s];
      if (label == ignore) continue;
      total += loss(input + i * c * hw + s, label);
      ++k;
    }
  if (count) *count = k;
  return k ? total / double(k) : std::numeric_limits<double>::quiet_NaN();
}

template <class T>
double pixel_xent_fwd(const T* logits, const int32_t* labels, int64_t n, int64_t c, int64_t hw, int ignore,
                      int64_t* count) {
  return pixel_mean(logits, labels, n, c, hw, ignore, count,
                    [&](const T* x, int32_t label) { return pixel_logsumexp(x, c, hw) - double(x[label * hw]); });
}

// dlogits = (softmax - onehot) * dl / count at counted pixels, 0 at ignored ones.
template <class T>
void pixel_xent_bwd(const T* logits, const int32_t* labels, int64_t n, int64_t c, int64_t hw, int ignore,
                    int64_t count, double dl, T* dlogits) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < hw; ++s) {
      const int32_t label = labels[i * hw + s];
      const T* x = logits + i * c * hw + s;
      T* g = dlogits + i * c * hw + s;
      if (label == ignore) {
        for (int64_t k = 0; k < c; ++k) g[k * hw] = T(0);
        continue;
      }
      const double lse = pixel_logsumexp(x, c, hw);
      for (int64_t k = 0; k < c; ++k)
        g[k * hw] = static_cast<T>((std::exp(double(x[k * hw]) - lse) - (k == label ? 1.0 : 0.0)) * dl / double(count));
    }
}

// Pixel NLL: the mean over the counted pixels of -log_probs[label].
template <class T>
double pixel_nll_fwd(const T* log_probs, const int32_t* labels, int64_t n, int64_t c, int64_t hw, int ignore,
                     int64_t* count) {
  return pixel_mean(log_probs, labels, n, c, hw, ignore, count,
                    [&](const T* x, int32_t label) { return -double(x[label * hw]); });
}

// dlog_probs = -dl / count at (image, label, pixel) of each counted pixel, 0 everywhere else.
template <class T>
void pixel_nll_bwd(const int32_t* labels, int64_t n, int64_t c, int64_t hw, int ignore, int64_t count, double dl,
                   T* dlog_probs) {
  std::fill(dlog_probs, dlog_probs + n * c * hw, T(0));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < hw; ++s) {
      const int32_t label = labels[i * hw + s];
      if (label != ignore) dlog_probs[(i * c + label) * hw + s] = static_cast<T>(-dl / double(count));
    }
}

}  // namespace ditto::ref
