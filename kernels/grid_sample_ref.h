// CPU reference of kernels/grid_sample: the affine grid generator and bilinear grid sampling with
// zero padding, as PyTorch's F.affine_grid and F.grid_sample(mode="bilinear", padding_mode="zeros")
// define them, for both values of align_corners. Templated so the gradient checks run in double;
// sums accumulate in double. The contract ditto's CUDA kernels follow:
//
// Grid coordinates are normalized: x = -1 is the left edge, +1 the right edge (likewise y). With
// align_corners the extremes are the CENTRES of the corner pixels, ix = (x + 1) / 2 * (W - 1);
// without, they are the outer EDGES of the corner pixels, ix = ((x + 1) * W - 1) / 2.
// A sample at (ix, iy) mixes the four pixels around it with the bilinear weights; a corner outside
// the image contributes zero (zero padding). Positions are clamped to [-2, size + 1] before the
// corners are taken (a position further out has no corner inside either way, and the clamp keeps
// the integer conversion defined). A NaN or infinite grid coordinate makes that output NaN in every
// channel and its grid gradient NaN, and it scatters nothing into dx: the fault stays visible.
//
// The affine grid's base coordinates are linspace(-1, 1, W) with align_corners, and that times
// (W - 1) / W without: x_w = (2w + 1 - W) / (W - 1), resp. (2w + 1 - W) / W (x = -1 resp. 0 for
// W = 1, as torch.linspace gives). grid[n, h, w] = theta[n] (2x3) . (x_w, y_h, 1).
//
// Backward to the input scatters dy * weight into the four corners: for each (n, c) the outputs in
// row-major order, for each output the corners nw, ne, sw, se. Backward to the grid (PyTorch's
// formula, the derivative of the bilinear form with the corner indices held fixed):
// dgrid.x = (W-1)/2 * sum_c dy * d(sample)/d(ix) with align_corners, W/2 * ... without.
//
// The coordinate helpers are host and device functions: ditto's CUDA kernels call them with
// T = float, so the kernels and this reference pick the same corners by the same expressions.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace ditto::ref {

// Input N,C,H,W; output and grid N,OH,OW (grid has a trailing 2: x, y).
struct GridSampleDims {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  bool align_corners = false;
};

// Normalized coordinate -> pixel coordinate (PyTorch's grid_sampler_unnormalize).
template <class T>
DITTO_HD inline T grid_unnormalize(T coord, int64_t size, bool align_corners) {
  return align_corners ? (coord + T(1)) / T(2) * T(size - 1) : ((coord + T(1)) * T(size) - T(1)) / T(2);
}

// d(pixel coordinate) / d(normalized coordinate).
DITTO_HD inline double grid_unnormalize_scale(int64_t size, bool align_corners) {
  return align_corners ? double(size - 1) / 2.0 : double(size) / 2.0;
}

// Base coordinate of pixel i of `size` (torch.linspace(-1, 1, size), times (size-1)/size without
// align_corners).
template <class T>
DITTO_HD inline T affine_base(int64_t i, int64_t size, bool align_corners) {
  if (align_corners) return size <= 1 ? T(-1) : T(2 * i + 1 - size) / T(size - 1);
  return T(2 * i + 1 - size) / T(size);
}

// The four corners of a sample and their bilinear weights (PyTorch's expressions: nw = (x1 - ix) *
// (y1 - iy), ...); valid[k] false where corner k lies outside the image or the position is not
// finite. Order: nw, ne, sw, se.
template <class T>
struct Bilinear {
  int64_t ix[4], iy[4];
  T weight[4];
  bool valid[4];
  T ixf, iyf;  // the unnormalized sample position, clamped to [-2, size + 1]
  T fx, fy;    // its offsets from the nw corner
  bool finite;
};

template <class T>
DITTO_HD inline Bilinear<T> bilinear_at(T x, T y, int64_t h, int64_t w, bool align_corners) {
  Bilinear<T> b;
  b.ixf = grid_unnormalize(x, w, align_corners);
  b.iyf = grid_unnormalize(y, h, align_corners);
  b.finite = std::isfinite(b.ixf) && std::isfinite(b.iyf);
  if (!b.finite) b.ixf = b.iyf = T(-2);
  b.ixf = std::fmin(std::fmax(b.ixf, T(-2)), T(w + 1));
  b.iyf = std::fmin(std::fmax(b.iyf, T(-2)), T(h + 1));
  const T x0 = std::floor(b.ixf), y0 = std::floor(b.iyf), x1 = x0 + T(1), y1 = y0 + T(1);
  b.fx = b.ixf - x0;
  b.fy = b.iyf - y0;
  b.weight[0] = (x1 - b.ixf) * (y1 - b.iyf);
  b.weight[1] = (b.ixf - x0) * (y1 - b.iyf);
  b.weight[2] = (x1 - b.ixf) * (b.iyf - y0);
  b.weight[3] = (b.ixf - x0) * (b.iyf - y0);
  const int64_t xi = static_cast<int64_t>(x0), yi = static_cast<int64_t>(y0);
  for (int k = 0; k < 4; ++k) {
    b.ix[k] = xi + (k & 1);
    b.iy[k] = yi + (k >> 1);
    b.valid[k] = b.finite && b.ix[k] >= 0 && b.ix[k] < w && b.iy[k] >= 0 && b.iy[k] < h;
  }
  return b;
}

// y[n, c, oh, ow] = bilinear sample of x[n, c] at grid[n, oh, ow].
template <class T>
void grid_sample_fwd(const T* x, const T* grid, T* y, const GridSampleDims& d) {
  const int64_t in_plane = d.h * d.w, out_plane = d.oh * d.ow;
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t p = 0; p < out_plane; ++p) {
      const T* g = grid + (n * out_plane + p) * 2;
      const Bilinear<T> b = bilinear_at(g[0], g[1], d.h, d.w, d.align_corners);
      for (int64_t c = 0; c < d.c; ++c) {
        const T* xp = x + (n * d.c + c) * in_plane;
        double s = b.finite ? 0.0 : NAN;
        for (int k = 0; k < 4; ++k)
          if (b.valid[k]) s += double(b.weight[k]) * double(xp[b.iy[k] * d.w + b.ix[k]]);
        y[(n * d.c + c) * out_plane + p] = static_cast<T>(s);
      }
    }
}

// dx (may be null) = scatter of dy * weight in the fixed order above; dgrid (may be null) by the
// chain rule through the unnormalization.
template <class T>
void grid_sample_bwd(const T* x, const T* grid, const T* dy, T* dx, T* dgrid, const GridSampleDims& d) {
  const int64_t in_plane = d.h * d.w, out_plane = d.oh * d.ow;
  if (dx) {
    double* acc = new double[static_cast<std::size_t>(d.n * d.c * in_plane)]();
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t c = 0; c < d.c; ++c)
        for (int64_t p = 0; p < out_plane; ++p) {
          const T* g = grid + (n * out_plane + p) * 2;
          const Bilinear<T> b = bilinear_at(g[0], g[1], d.h, d.w, d.align_corners);
          const double gy = double(dy[(n * d.c + c) * out_plane + p]);
          for (int k = 0; k < 4; ++k)
            if (b.valid[k]) acc[(n * d.c + c) * in_plane + b.iy[k] * d.w + b.ix[k]] += gy * double(b.weight[k]);
        }
    for (int64_t i = 0; i < d.n * d.c * in_plane; ++i) dx[i] = static_cast<T>(acc[i]);
    delete[] acc;
  }
  if (dgrid) {
    const double sx = grid_unnormalize_scale(d.w, d.align_corners), sy = grid_unnormalize_scale(d.h, d.align_corners);
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < out_plane; ++p) {
        const T* g = grid + (n * out_plane + p) * 2;
        const Bilinear<T> b = bilinear_at(g[0], g[1], d.h, d.w, d.align_corners);
        const double fx = double(b.fx), fy = double(b.fy);
        double gx = 0, gyy = 0;
        for (int64_t c = 0; c < d.c; ++c) {
          const T* xp = x + (n * d.c + c) * in_plane;
          double v[4];
          for (int k = 0; k < 4; ++k) v[k] = b.valid[k] ? double(xp[b.iy[k] * d.w + b.ix[k]]) : 0.0;
          const double go = double(dy[(n * d.c + c) * out_plane + p]);
          // d/dix of (1-fx)(1-fy) v0 + fx(1-fy) v1 + (1-fx) fy v2 + fx fy v3, likewise d/diy.
          gx += go * ((v[1] - v[0]) * (1 - fy) + (v[3] - v[2]) * fy);
          gyy += go * ((v[2] - v[0]) * (1 - fx) + (v[3] - v[1]) * fx);
        }
        dgrid[(n * out_plane + p) * 2] = static_cast<T>(b.finite ? gx * sx : NAN);
        dgrid[(n * out_plane + p) * 2 + 1] = static_cast<T>(b.finite ? gyy * sy : NAN);
      }
  }
}

// grid[n, h, w, :] = theta[n] (2x3, row-major) . (x_w, y_h, 1).
template <class T>
void affine_grid_fwd(const T* theta, T* grid, int64_t n, int64_t h, int64_t w, bool align_corners) {
  for (int64_t b = 0; b < n; ++b) {
    const T* th = theta + b * 6;
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j) {
        const double bx = double(affine_base<T>(j, w, align_corners)), by = double(affine_base<T>(i, h, align_corners));
        T* g = grid + ((b * h + i) * w + j) * 2;
        g[0] = static_cast<T>(double(th[0]) * bx + double(th[1]) * by + double(th[2]));
        g[1] = static_cast<T>(double(th[3]) * bx + double(th[4]) * by + double(th[5]));
      }
  }
}

// dtheta[n, r, k] = sum over (h, w) in row-major order of dgrid[n, h, w, r] * base_k.
template <class T>
void affine_grid_bwd(const T* dgrid, T* dtheta, int64_t n, int64_t h, int64_t w, bool align_corners) {
  for (int64_t b = 0; b < n; ++b) {
    double acc[6] = {0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j) {
        const double base[3] = {double(affine_base<T>(j, w, align_corners)),
                                double(affine_base<T>(i, h, align_corners)), 1.0};
        const T* g = dgrid + ((b * h + i) * w + j) * 2;
        for (int r = 0; r < 2; ++r)
          for (int k = 0; k < 3; ++k) acc[r * 3 + k] += double(g[r]) * base[k];
      }
    for (int k = 0; k < 6; ++k) dtheta[b * 6 + k] = static_cast<T>(acc[k]);
  }
}

}  // namespace ditto::ref
