// CPU reference of kernels/conv2d: direct loops, templated so gradient checks run in double.
// Every output element is one gather (no scatter), accumulated in double in a fixed order
// (channel, then kernel row, then kernel column; or batch, row, column for the filter
// gradient): deterministic, and for T = float the result is the double sum rounded once.
// Layouts: x N,C,H,W; w K,C/groups,R,S; y N,K,Ho,Wo (all contiguous, row-major).
#pragma once
#include <cstdint>

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

// y[n,k,ho,wo] = sum_{c,r,s} x[n, g*Cg + c, ho*sh - ph + r*dh, wo*sw - pw + s*dw] * w[k,c,r,s],
// g = k / Kg; taps outside the input read zero (padding).
template <class T>
void conv2d_fwd(const Conv2dGeom& g, const T* x, const T* w, T* y) {
  const int64_t Cg = g.Cg(), Kg = g.Kg();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t c0 = (k / Kg) * Cg;
      for (int64_t ho = 0; ho < g.Ho; ++ho)
        for (int64_t wo = 0; wo < g.Wo; ++wo) {
          double acc = 0;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < g.R; ++r) {
              const int64_t h = ho * g.stride_h - g.pad_h + r * g.dil_h;
              if (h < 0 || h >= g.H) continue;
              for (int64_t s = 0; s < g.S; ++s) {
                const int64_t ww = wo * g.stride_w - g.pad_w + s * g.dil_w;
                if (ww < 0 || ww >= g.W) continue;
                acc += double(x[((n * g.C + c0 + c) * g.H + h) * g.W + ww]) *
                       double(w[((k * Cg + c) * g.R + r) * g.S + s]);
              }
            }
          y[((n * g.K + k) * g.Ho + ho) * g.Wo + wo] = T(acc);
        }
    }
}

// dx[n,ci,h,w] = sum over the (k, r, s) whose tap lands on (h, w): dy[n,k,ho,wo] * w[k,ci-g*Cg,r,s],
// where h = ho*sh - ph + r*dh (so ho = (h + ph - r*dh) / sh when that divides exactly).
template <class T>
void conv2d_bwd_data(const Conv2dGeom& g, const T* dy, const T* w, T* dx) {
  const int64_t Cg = g.Cg(), Kg = g.Kg();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t ci = 0; ci < g.C; ++ci) {
      const int64_t grp = ci / Cg, c = ci - grp * Cg;
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t wi = 0; wi < g.W; ++wi) {
          double acc = 0;
          for (int64_t k = grp * Kg; k < (grp + 1) * Kg; ++k)
            for (int64_t r = 0; r < g.R; ++r) {
              const int64_t th = h + g.pad_h - r * g.dil_h;
              if (th < 0 || th % g.stride_h) continue;
              const int64_t ho = th / g.stride_h;
              if (ho >= g.Ho) continue;
              for (int64_t s = 0; s < g.S; ++s) {
                const int64_t tw = wi + g.pad_w - s * g.dil_w;
                if (tw < 0 || tw % g.stride_w) continue;
                const int64_t wo = tw / g.stride_w;
                if (wo >= g.Wo) continue;
                acc += double(dy[((n * g.K + k) * g.Ho + ho) * g.Wo + wo]) *
                       double(w[((k * Cg + c) * g.R + r) * g.S + s]);
              }
            }
          dx[((n * g.C + ci) * g.H + h) * g.W + wi] = T(acc);
        }
    }
}

// dw[k,c,r,s] = sum_{n,ho,wo} dy[n,k,ho,wo] * x[n, g*Cg + c, ho*sh - ph + r*dh, wo*sw - pw + s*dw].
template <class T>
void conv2d_bwd_filter(const Conv2dGeom& g, const T* x, const T* dy, T* dw) {
  const int64_t Cg = g.Cg(), Kg = g.Kg();
  for (int64_t k = 0; k < g.K; ++k) {
    const int64_t c0 = (k / Kg) * Cg;
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t r = 0; r < g.R; ++r)
        for (int64_t s = 0; s < g.S; ++s) {
          double acc = 0;
          for (int64_t n = 0; n < g.N; ++n)
            for (int64_t ho = 0; ho < g.Ho; ++ho) {
              const int64_t h = ho * g.stride_h - g.pad_h + r * g.dil_h;
              if (h < 0 || h >= g.H) continue;
              for (int64_t wo = 0; wo < g.Wo; ++wo) {
                const int64_t ww = wo * g.stride_w - g.pad_w + s * g.dil_w;
                if (ww < 0 || ww >= g.W) continue;
                acc += double(dy[((n * g.K + k) * g.Ho + ho) * g.Wo + wo]) *
                       double(x[((n * g.C + c0 + c) * g.H + h) * g.W + ww]);
              }
            }
          dw[((k * Cg + c) * g.R + r) * g.S + s] = T(acc);
        }
  }
}

}  // namespace ditto::ref
