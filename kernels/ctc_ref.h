// CPU reference of kernels/ctc: the connectionist temporal classification loss (Graves et al.
// 2006) of unnormalized logits, forward-backward in log space, in double.
//
// Layout as cuDNN and PyTorch: logits {T, N, A} (time-major), alphabet A including the blank,
// which is class 0 (cuDNN's fixed choice). labels {N, S} (padded; row n holds label_lengths[n]
// labels in [1, A)), input_lengths[n] in [1, T]. Per sample:
//   lp[t, a] = logits[t, n, a] - logsumexp_a logits[t, n, a]           (log-softmax)
//   l' = blank, l1, blank, l2, ..., lL, blank                             (2L + 1 states)
//   alpha[0, 0] = lp[0, blank], alpha[0, 1] = lp[0, l1]; alpha[t, s] = lp[t, l'_s] + logsumexp of
//   alpha[t-1, s], alpha[t-1, s-1] and, where l'_s is a label differing from l'_{s-2},
//   alpha[t-1, s-2]; beta mirrors it from t = T_n - 1 (beta includes the emission at t).
//   log p = logsumexp(alpha[T_n - 1, L' - 1], alpha[T_n - 1, L' - 2]);  cost[n] = -log p.
//   d cost / d logits[t, n, a] = softmax[t, a] - sum over s with l'_s = a of
//   exp(alpha[t, s] + beta[t, s] - lp[t, a] - log p), for t < T_n; 0 for t >= T_n.
// A sample no alignment fits (T_n < L + the number of repeated neighbours) has cost +inf and a zero
// gradient (cuDNN's CUDNN_CTC_ZERO_OOB_GRADIENTS, PyTorch's zero_infinity for the gradient).
// A sample with invalid lengths or labels has cost NaN and a NaN gradient (the op raises DataError
// on the CPU before it gets here; the GPU marks the sample so).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ditto::ref {

struct CtcDims {
  int64_t t = 0, n = 0, a = 0, s = 0;  // max time, batch, alphabet (with blank 0), max label length
};

// Label length in [0, S], input length in [1, T], labels in [1, A).
inline bool ctc_sample_valid(const int32_t* labels, const int32_t* label_len, const int32_t* input_len,
                             const CtcDims& d, int64_t n) {
  const int64_t l = label_len[n], tn = input_len[n];
  if (l < 0 || l > d.s || tn < 1 || tn > d.t) return false;
  for (int64_t i = 0; i < l; ++i)
    if (labels[n * d.s + i] < 1 || labels[n * d.s + i] >= d.a) return false;
  return true;
}

inline double log_add(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const double m = a > b ? a : b;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

// cost[n] for every sample; grad {T, N, A} (may be null) = d cost[n] / d logits.
template <class T>
void ctc_loss(const T* logits, const int32_t* labels, const int32_t* label_len, const int32_t* input_len,
              const CtcDims& d, T* cost, T* grad) {
  const double ninf = -INFINITY;
  if (grad)
    for (int64_t i = 0; i < d.t * d.n * d.a; ++i) grad[i] = T(0);
  for (int64_t n = 0; n < d.n; ++n) {
    if (!ctc_sample_valid(labels, label_len, input_len, d, n)) {
      cost[n] = static_cast<T>(NAN);
      if (grad)
        for (int64_t t = 0; t < d.t; ++t)
          for (int64_t a = 0; a < d.a; ++a) grad[(t * d.n + n) * d.a + a] = static_cast<T>(NAN);
      continue;
    }
    const int64_t tn = input_len[n], l = label_len[n], states = 2 * l + 1;
    std::vector<int64_t> ext(static_cast<std::size_t>(states), 0);
    for (int64_t i = 0; i < l; ++i) ext[2 * i + 1] = labels[n * d.s + i];
    std::vector<double> lp(static_cast<std::size_t>(tn * d.a));
    for (int64_t t = 0; t < tn; ++t) {
      const T* row = logits + (t * d.n + n) * d.a;
      double m = double(row[0]);
      for (int64_t a = 1; a < d.a; ++a) m = std::max(m, double(row[a]));
      double s = 0;
      for (int64_t a = 0; a < d.a; ++a) s += std::exp(double(row[a]) - m);
      const double lse = m + std::log(s);
      for (int64_t a = 0; a < d.a; ++a) lp[t * d.a + a] = double(row[a]) - lse;
    }
    auto skip_ok = [&](int64_t s) { return s >= 2 && ext[s] != 0 && ext[s] != ext[s - 2]; };
    std::vector<double> alpha(static_cast<std::size_t>(tn * states), ninf), beta(alpha.size(), ninf);
    alpha[0] = lp[ext[0]];
    if (states > 1) alpha[1] = lp[ext[1]];
    for (int64_t t = 1; t < tn; ++t)
      for (int64_t s = 0; s < states; ++s) {
        double v = alpha[(t - 1) * states + s];
        if (s >= 1) v = log_add(v, alpha[(t - 1) * states + s - 1]);
        if (skip_ok(s)) v = log_add(v, alpha[(t - 1) * states + s - 2]);
        alpha[t * states + s] = v == ninf ? ninf : v + lp[t * d.a + ext[s]];
      }
    const int64_t last = (tn - 1) * states;
    const double logp = log_add(alpha[last + states - 1], states > 1 ? alpha[last + states - 2] : ninf);
    if (logp == ninf) {  // no alignment fits: +inf, zero gradient
      cost[n] = static_cast<T>(INFINITY);
      continue;
    }
    cost[n] = static_cast<T>(-logp);
    if (!grad) continue;
    beta[last + states - 1] = lp[(tn - 1) * d.a + ext[states - 1]];
    if (states > 1) beta[last + states - 2] = lp[(tn - 1) * d.a + ext[states - 2]];
    for (int64_t t = tn - 2; t >= 0; --t)
      for (int64_t s = 0; s < states; ++s) {
        double v = beta[(t + 1) * states + s];
        if (s + 1 < states) v = log_add(v, beta[(t + 1) * states + s + 1]);
        if (s + 2 < states && ext[s] != 0 && ext[s] != ext[s + 2]) v = log_add(v, beta[(t + 1) * states + s + 2]);
        beta[t * states + s] = v == ninf ? ninf : v + lp[t * d.a + ext[s]];
      }
    for (int64_t t = 0; t < tn; ++t) {
      std::vector<double> occ(static_cast<std::size_t>(d.a), 0.0);
      for (int64_t s = 0; s < states; ++s) {
        const double g = alpha[t * states + s] + beta[t * states + s];
        if (g != ninf) occ[ext[s]] += std::exp(g - lp[t * d.a + ext[s]] - logp);
      }
      for (int64_t a = 0; a < d.a; ++a)
        grad[(t * d.n + n) * d.a + a] = static_cast<T>(std::exp(lp[t * d.a + a]) - occ[a]);
    }
  }
}

}  // namespace ditto::ref
