// CPU reference of kernels/roi_align: torchvision.ops.roi_align (average pooling of bilinear
// samples), forward and backward to the image. Data templated (gradient checks run in double);
// geometry (sample positions) in double; sums accumulate in double. The contract:
//
// A roi is (batch index, x1, y1, x2, y2) in input coordinates. With offset = 0.5 when `aligned`
// (pixel centres at integer + 0.5, torchvision's aligned=True) and 0 otherwise:
//   start = coordinate * spatial_scale - offset, for both corners;
//   roi size = end - start, at least 1 when not aligned (torchvision's legacy behaviour);
//   bin = roi size / pooled size; samples per bin = sampling_ratio if > 0, else ceil(roi size /
//   pooled size) (adaptive), per axis; count = max(grid_h * grid_w, 1);
//   sample (iy, ix) of bin (ph, pw) sits at y = start_h + ph * bin_h + (iy + 0.5) * bin_h / grid_h
//   (likewise x). output = (sum of the bilinear samples) / count.
// Bilinear sampling (torchvision's bilinear_interpolate): a sample with y < -1 or y > H (likewise
// x) is 0; otherwise y is clamped to >= 0, y_low = floor(y), and where y_low >= H - 1 both rows are
// H - 1 (likewise x); weights hy*hx, hy*lx, ly*hx, ly*lx for (low,low), (low,high), (high,low),
// (high,high), with ly = y - y_low, hy = 1 - ly.
// Backward: dx += dy / count * weight for every sample's four corners (the boxes get no gradient).
// A roi whose batch index is not in [0, N) (after truncation toward zero, as torchvision), whose
// coordinates are not finite, or whose scaled coordinates exceed 2^24 in magnitude (where the sample
// counts would overflow) outputs NaN in every channel and bin and contributes nothing to dx: a
// visible fault, never a silent zero.
//
// The geometry and bilinear helpers are host and device functions: ditto's CUDA kernels call them
// with G = float (torchvision's arithmetic), the reference with G = double.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/host_device.h"

namespace ditto::ref {

constexpr double kRoiMaxCoordinate = 16777216.0;  // 2^24

struct RoiAlignDims {
  int64_t n = 0, c = 0, h = 0, w = 0, rois = 0, ph = 1, pw = 1;
  float spatial_scale = 1.f;
  int sampling_ratio = -1;  // <= 0: adaptive
  bool aligned = false;
};

template <class G>
struct RoiGeometry {
  int64_t batch = 0;
  bool ok = false;  // batch index in range, coordinates finite
  G start_h = 0, start_w = 0, bin_h = 0, bin_w = 0, count = 1;
  int64_t grid_h = 0, grid_w = 0;
};

template <class G, class T>
DITTO_HD RoiGeometry<G> roi_geometry(const T* roi, const RoiAlignDims& d) {
  RoiGeometry<G> g;
  bool finite = true;
  for (int i = 0; i < 5; ++i) finite = finite && std::isfinite(double(roi[i]));
  if (!finite) return g;
  const double b = std::trunc(double(roi[0]));
  if (b < 0 || b >= double(d.n)) return g;
  for (int i = 1; i < 5; ++i)
    if (std::fabs(double(roi[i]) * double(d.spatial_scale)) > kRoiMaxCoordinate) return g;
  g.batch = static_cast<int64_t>(b);
  const G scale = G(d.spatial_scale), offset = d.aligned ? G(0.5) : G(0);
  g.start_w = G(roi[1]) * scale - offset;
  g.start_h = G(roi[2]) * scale - offset;
  G roi_w = G(roi[3]) * scale - offset - g.start_w;
  G roi_h = G(roi[4]) * scale - offset - g.start_h;
  if (!d.aligned) {
    roi_w = roi_w > G(1) ? roi_w : G(1);
    roi_h = roi_h > G(1) ? roi_h : G(1);
  }
  g.bin_h = roi_h / G(d.ph);
  g.bin_w = roi_w / G(d.pw);
  g.grid_h = d.sampling_ratio > 0 ? d.sampling_ratio : static_cast<int64_t>(std::ceil(roi_h / G(d.ph)));
  g.grid_w = d.sampling_ratio > 0 ? d.sampling_ratio : static_cast<int64_t>(std::ceil(roi_w / G(d.pw)));
  const int64_t cnt = g.grid_h * g.grid_w;
  g.count = G(cnt > 1 ? cnt : 1);
  g.ok = true;
  return g;
}

template <class G>
DITTO_HD inline G roi_sample_coord(G start, int64_t bin_index, G bin, int64_t i, int64_t grid) {
  return start + G(bin_index) * bin + G(double(i) + 0.5) * bin / G(grid);
}

// One axis of torchvision's bilinear_interpolate: a coordinate below -1 or above `size` is no
// sample; otherwise it is clamped to >= 0, low = floor, and where low >= size - 1 both neighbours
// are size - 1. l = the fraction toward `high`, h = 1 - l.
template <class G>
struct RoiAxis {
  bool valid = false;
  int64_t low = 0, high = 0;
  G l = 0, h = 0;
};

template <class G>
DITTO_HD RoiAxis<G> roi_axis(G v, int64_t size) {
  RoiAxis<G> a;
  if (v < G(-1) || v > G(size)) return a;
  if (v <= 0) v = 0;
  a.low = static_cast<int64_t>(v);
  if (a.low >= size - 1) {
    a.high = a.low = size - 1;
    v = G(a.low);
  } else {
    a.high = a.low + 1;
  }
  a.l = v - G(a.low);
  a.h = G(1) - a.l;
  a.valid = true;
  return a;
}

template <class G>
struct RoiBilinear {
  bool valid = false;
  int64_t y_low = 0, y_high = 0, x_low = 0, x_high = 0;
  G w[4] = {0, 0, 0, 0};  // (low,low), (low,high), (high,low), (high,high): hy*hx, hy*lx, ly*hx, ly*lx
};

template <class G>
DITTO_HD RoiBilinear<G> roi_bilinear(G y, G x, int64_t h, int64_t w) {
  RoiBilinear<G> s;
  const RoiAxis<G> ay = roi_axis(y, h), ax = roi_axis(x, w);
  if (!ay.valid || !ax.valid) return s;
  s.y_low = ay.low;
  s.y_high = ay.high;
  s.x_low = ax.low;
  s.x_high = ax.high;
  s.w[0] = ay.h * ax.h;
  s.w[1] = ay.h * ax.l;
  s.w[2] = ay.l * ax.h;
  s.w[3] = ay.l * ax.l;
  s.valid = true;
  return s;
}

// Calls fn(sample) for every valid bilinear sample of bin (py, px) of a roi, row-major.
template <class G, class F>
DITTO_HD void roi_for_each_sample(const RoiGeometry<G>& g, int64_t py, int64_t px, const RoiAlignDims& d, F&& fn) {
  for (int64_t iy = 0; iy < g.grid_h; ++iy) {
    const G yy = roi_sample_coord(g.start_h, py, g.bin_h, iy, g.grid_h);
    for (int64_t ix = 0; ix < g.grid_w; ++ix) {
      const RoiBilinear<G> b = roi_bilinear(yy, roi_sample_coord(g.start_w, px, g.bin_w, ix, g.grid_w), d.h, d.w);
      if (b.valid) fn(b);
    }
  }
}

// y[k, c, ph, pw]; rois {K, 5}.
template <class T>
void roi_align_fwd(const T* x, const T* rois, T* y, const RoiAlignDims& d) {
  const int64_t bins = d.ph * d.pw;
  for (int64_t k = 0; k < d.rois; ++k) {
    const RoiGeometry<double> g = roi_geometry<double>(rois + k * 5, d);
    for (int64_t c = 0; c < d.c; ++c)
      for (int64_t py = 0; py < d.ph; ++py)
        for (int64_t px = 0; px < d.pw; ++px) {
          T* out = y + (k * d.c + c) * bins + py * d.pw + px;
          if (!g.ok) {
            *out = static_cast<T>(NAN);
            continue;
          }
          const T* xp = x + (g.batch * d.c + c) * d.h * d.w;
          double s = 0;
          roi_for_each_sample(g, py, px, d, [&](const RoiBilinear<double>& b) {
            s += b.w[0] * double(xp[b.y_low * d.w + b.x_low]) + b.w[1] * double(xp[b.y_low * d.w + b.x_high]) +
                 b.w[2] * double(xp[b.y_high * d.w + b.x_low]) + b.w[3] * double(xp[b.y_high * d.w + b.x_high]);
          });
          *out = static_cast<T>(s / g.count);
        }
  }
}

// dx = 0, then the scatter of dy / count * weight, rois, channels, bins and samples in order.
template <class T>
void roi_align_bwd(const T* rois, const T* dy, T* dx, const RoiAlignDims& d) {
  const int64_t bins = d.ph * d.pw, plane = d.h * d.w;
  std::vector<double> acc(static_cast<std::size_t>(d.n * d.c * plane), 0.0);
  for (int64_t k = 0; k < d.rois; ++k) {
    const RoiGeometry<double> g = roi_geometry<double>(rois + k * 5, d);
    if (!g.ok) continue;
    for (int64_t c = 0; c < d.c; ++c) {
      double* ap = acc.data() + (g.batch * d.c + c) * plane;
      for (int64_t py = 0; py < d.ph; ++py)
        for (int64_t px = 0; px < d.pw; ++px) {
          const double gy = double(dy[(k * d.c + c) * bins + py * d.pw + px]) / g.count;
          roi_for_each_sample(g, py, px, d, [&](const RoiBilinear<double>& b) {
            ap[b.y_low * d.w + b.x_low] += gy * b.w[0];
            ap[b.y_low * d.w + b.x_high] += gy * b.w[1];
            ap[b.y_high * d.w + b.x_low] += gy * b.w[2];
            ap[b.y_high * d.w + b.x_high] += gy * b.w[3];
          });
        }
    }
  }
  for (std::size_t i = 0; i < acc.size(); ++i) dx[i] = static_cast<T>(acc[i]);
}

}  // namespace ditto::ref
