// CPU reference of kernels/conv2d: direct loops, templated so gradient checks run in double.
// Every output element accumulates its own terms in double in a fixed order (channel, then
// kernel row, then kernel column; or batch, row, column for the filter gradient): deterministic,
// and for T = float the result is the double sum rounded once.
// Layouts: x N,C,H,W; w K,C/groups,R,S; y N,K,Ho,Wo (all contiguous, row-major).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/conv2d.h"

namespace ditto::ref {

struct Conv2dGeom {
  int64_t N = 0, C = 0, H = 0, W = 0, K = 0, R = 0, S = 0, Ho = 0, Wo = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  int64_t Cg() const { return C / groups; }  // input channels per group
  int64_t Kg() const { return K / groups; }  // output channels per group
};

// Geometry of a checked convolution (throws ShapeError as conv2d_output_shape does).
inline Conv2dGeom conv2d_geom(const Shape& x, const Shape& w, const Conv2dParams& p) {
  Shape y = conv2d_output_shape("ref", x, w, p);
  Conv2dGeom g;
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.K = w[0], g.R = w[2], g.S = w[3];
  g.Ho = y[2], g.Wo = y[3];
  g.stride_h = p.stride_h, g.stride_w = p.stride_w, g.pad_h = p.pad_h, g.pad_w = p.pad_w;
  g.dil_h = p.dilation_h, g.dil_w = p.dilation_w, g.groups = p.groups;
  return g;
}

// The output positions o in [0, out) whose tap o * stride - pad + offset lands in [0, size):
// [lo, hi), empty when lo >= hi.
inline void tap_range(int64_t out, int64_t stride, int64_t pad, int64_t offset, int64_t size, int64_t& lo,
                      int64_t& hi) {
  // o * stride >= pad - offset  and  o * stride <= size - 1 + pad - offset.
  const int64_t a = pad - offset, b = size - 1 + pad - offset;
  lo = a <= 0 ? 0 : (a + stride - 1) / stride;
  hi = b < 0 ? 0 : b / stride + 1;
  if (hi > out) hi = out;
  if (lo > hi) lo = hi;
}

// Kernel tap (r, s) over a plane: row(ho, at, wo0, wo1) for every output row ho whose tap lies
// inside the input, where input column wo * stride_w of the row starts at plane index `at` and
// [wo0, wo1) are the output columns whose tap lies inside it (at + wo * stride_w in [0, H * W)).
template <class Row>
void for_each_tap_row(const Conv2dGeom& g, int64_t r, int64_t s, Row row) {
  int64_t ho0, ho1, wo0, wo1;
  tap_range(g.Ho, g.stride_h, g.pad_h, r * g.dil_h, g.H, ho0, ho1);
  tap_range(g.Wo, g.stride_w, g.pad_w, s * g.dil_w, g.W, wo0, wo1);
  for (int64_t ho = ho0; ho < ho1; ++ho)
    row(ho, (ho * g.stride_h - g.pad_h + r * g.dil_h) * g.W - g.pad_w + s * g.dil_w, wo0, wo1);
}

// The loops below visit the terms of each output element in the order the comments state, one
// term per (channel, kernel row, kernel column) or (batch, row, column), and add each into that
// element's own double accumulator; around that order they run over whole rows of outputs, so the
// inner loops are contiguous. For T = float every product of two floats is exact in double, so an
// element's value is the same sequence of double additions whatever the loop nest around it.

// y[n,k,ho,wo] = sum_{c,r,s} x[n, g*Cg + c, ho*sh - ph + r*dh, wo*sw - pw + s*dw] * w[k,c,r,s],
// g = k / Kg; taps outside the input read zero (padding): terms in (c, r, s) order.
template <class T>
void conv2d_fwd(const Conv2dGeom& g, const T* x, const T* w, T* y) {
  const int64_t Cg = g.Cg(), Kg = g.Kg(), plane = g.Ho * g.Wo;
  std::vector<double> acc(static_cast<std::size_t>(plane));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t c0 = (k / Kg) * Cg;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t c = 0; c < Cg; ++c) {
        const T* xc = x + (n * g.C + c0 + c) * g.H * g.W;
        for (int64_t r = 0; r < g.R; ++r)
          for (int64_t s = 0; s < g.S; ++s) {
            const double wv = double(w[((k * Cg + c) * g.R + r) * g.S + s]);
            for_each_tap_row(g, r, s, [&](int64_t ho, int64_t at, int64_t wo0, int64_t wo1) {
              double* a = acc.data() + ho * g.Wo;
              for (int64_t wo = wo0; wo < wo1; ++wo) a[wo] += double(xc[at + wo * g.stride_w]) * wv;
            });
          }
      }
      T* yo = y + (n * g.K + k) * plane;
      for (int64_t i = 0; i < plane; ++i) yo[i] = T(acc[static_cast<std::size_t>(i)]);
    }
}

// dx[n,ci,h,w] = sum over the (k, r, s) whose tap lands on (h, w): dy[n,k,ho,wo] * w[k,ci-g*Cg,r,s],
// where h = ho*sh - ph + r*dh (so ho = (h + ph - r*dh) / sh when that divides exactly): terms in
// (k, r, s) order; for one (k, r, s) at most one (ho, wo) reaches a given (h, w).
template <class T>
void conv2d_bwd_data(const Conv2dGeom& g, const T* dy, const T* w, T* dx) {
  const int64_t Cg = g.Cg(), Kg = g.Kg(), plane = g.H * g.W;
  std::vector<double> acc(static_cast<std::size_t>(plane));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t ci = 0; ci < g.C; ++ci) {
      const int64_t grp = ci / Cg, c = ci - grp * Cg;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = grp * Kg; k < (grp + 1) * Kg; ++k) {
        const T* dyk = dy + (n * g.K + k) * g.Ho * g.Wo;
        for (int64_t r = 0; r < g.R; ++r)
          for (int64_t s = 0; s < g.S; ++s) {
            const double wv = double(w[((k * Cg + c) * g.R + r) * g.S + s]);
            for_each_tap_row(g, r, s, [&](int64_t ho, int64_t at, int64_t wo0, int64_t wo1) {
              const T* d = dyk + ho * g.Wo;
              for (int64_t wo = wo0; wo < wo1; ++wo)
                acc[static_cast<std::size_t>(at + wo * g.stride_w)] += double(d[wo]) * wv;
            });
          }
      }
      T* dxo = dx + (n * g.C + ci) * plane;
      for (int64_t i = 0; i < plane; ++i) dxo[i] = T(acc[static_cast<std::size_t>(i)]);
    }
}

// dw[k,c,r,s] = sum_{n,ho,wo} dy[n,k,ho,wo] * x[n, g*Cg + c, ho*sh - ph + r*dh, wo*sw - pw + s*dw]:
// terms in (n, ho, wo) order. dy is first copied with the output channel innermost, so the Kg
// elements dw[., c, r, s] of a group take their terms side by side.
template <class T>
void conv2d_bwd_filter(const Conv2dGeom& g, const T* x, const T* dy, T* dw) {
  const int64_t Cg = g.Cg(), Kg = g.Kg(), plane = g.Ho * g.Wo;
  std::vector<T> dyt(static_cast<std::size_t>(g.N * plane * g.K));  // [n][ho][wo][k]
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t i = 0; i < plane; ++i) dyt[static_cast<std::size_t>((n * plane + i) * g.K + k)] =
          dy[(n * g.K + k) * plane + i];
  std::vector<double> acc(static_cast<std::size_t>(Kg));
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t r = 0; r < g.R; ++r)
        for (int64_t s = 0; s < g.S; ++s) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t n = 0; n < g.N; ++n) {
            const T* xc = x + (n * g.C + grp * Cg + c) * g.H * g.W;
            for_each_tap_row(g, r, s, [&](int64_t ho, int64_t at, int64_t wo0, int64_t wo1) {
              for (int64_t wo = wo0; wo < wo1; ++wo) {
                const double xv = double(xc[at + wo * g.stride_w]);
                const T* d = dyt.data() + ((n * g.Ho + ho) * g.Wo + wo) * g.K + grp * Kg;
                for (int64_t kk = 0; kk < Kg; ++kk) acc[static_cast<std::size_t>(kk)] += double(d[kk]) * xv;
              }
            });
          }
          for (int64_t kk = 0; kk < Kg; ++kk)
            dw[(((grp * Kg + kk) * Cg + c) * g.R + r) * g.S + s] = T(acc[static_cast<std::size_t>(kk)]);
        }
}

}  // namespace ditto::ref
