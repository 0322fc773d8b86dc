// CPU reference of kernels/upsample, and the index arithmetic its CUDA kernels share (the functions
// marked DITTO_UPSAMPLE_HD compile for the host and the device, so the gather the GPU runs is the
// one tests/cpu_upsample.cpp checks on the CPU). Templated on the value type: the reference and
// its gradient checks run in double, the GPU in float.
//
// Geometry (PyTorch's F.interpolate with size=(out_h, out_w), i.e. scale = in / out):
//   nearest   output o reads input floor(o * in / out), in exact integer arithmetic.
//   bilinear  per axis, source coordinate src(o) = o * (in - 1) / (out - 1) with align_corners
//             (0 when out == 1), else max((o + 0.5) * in / out - 0.5, 0); i0 = floor(src) (at most
//             in - 1), i1 = i0 + 1 (i0 at the last row), l1 = src - i0, l0 = 1 - l1.
//             y = l0h * (l0w * x[i0h, i0w] + l1w * x[i0h, i1w]) + l1h * (l0w * x[i1h, i0w] + l1w * x[i1h, i1w]).
// The backward pass is the adjoint: each output gradient dy[o] sends (wy * wx) * dy[o] to each of
// its taps (four for bilinear, also where two taps name one pixel).
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "kernels/index_math.h"

#if defined(__CUDACC__)
#define DITTO_UPSAMPLE_HD __host__ __device__ __forceinline__
#else
#define DITTO_UPSAMPLE_HD inline
#endif

namespace ditto::ref {

struct UpsampleDims {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;  // planes = N * C
  bool bilinear = false, align_corners = false;
};

// Nearest with whole scale factors along both axes (each input owns a kh x kw block of outputs), in
// int range: the GPU's forward copies each input to its block and its gather sums each block, in
// kernels of their own. ditto.torch asks the same question to pick the forward it runs.
DITTO_UPSAMPLE_HD bool nearest_whole(const UpsampleDims& d) {
  return !d.bilinear && d.h > 0 && d.w > 0 && d.oh % d.h == 0 && d.ow % d.w == 0 && d.w <= INT_MAX &&
         d.oh / d.h <= INT_MAX && d.ow / d.w <= INT_MAX;
}

// Nearest: the source of output o, and the first output whose source is i (outputs with source i
// are [nearest_first_out(i), nearest_first_out(i + 1))).
DITTO_UPSAMPLE_HD int64_t nearest_src(int64_t o, int64_t in, int64_t out) { return div_nonneg(o * in, out); }
DITTO_UPSAMPLE_HD int64_t nearest_first_out(int64_t i, int64_t in, int64_t out) {
  return div_nonneg(i * out + in - 1, in);
}

// a * b and a - b rounded to T on their own: on the device __fmul_rn / __fsub_rn keep the compiler
// from fusing them into an FMA, so host and device compute the same float taps, and the atomic and
// the gather backward add the same rounded contributions.
template <class T>
DITTO_UPSAMPLE_HD T mul_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4)
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
template <class T>
DITTO_UPSAMPLE_HD T sub_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4)
    return __fsub_rn(a, b);
  else
    return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

template <class T>
struct LinearTap {
  int64_t i0, i1;
  T l0, l1;
};

template <class T>
DITTO_UPSAMPLE_HD LinearTap<T> linear_tap(int64_t o, int64_t in, int64_t out, bool align_corners) {
  T src;
  if (align_corners) {
    const T scale = out > 1 ? T(in - 1) / T(out - 1) : T(0);
    src = mul_rn(scale, T(o));
  } else {
    const T scale = T(in) / T(out);
    src = sub_rn(mul_rn(scale, T(o) + T(0.5)), T(0.5));  // o + 0.5 is exact below 2^23
    if (src < T(0)) src = T(0);
  }
  int64_t i0 = static_cast<int64_t>(src);  // src >= 0: truncation is floor
  if (i0 > in - 1) i0 = in - 1;
  LinearTap<T> t;
  t.i0 = i0;
  t.i1 = i0 + (i0 < in - 1 ? 1 : 0);
  t.l1 = sub_rn(src, T(i0));
  t.l0 = sub_rn(T(1), t.l1);
  return t;
}

// The outputs [lo, hi] whose taps can touch input i: those with i0(o) in {i - 1, i} (i0 is a
// non-decreasing function of o, in any rounding). Starts from the real-number estimate and walks
// to the exact bounds of i0 as linear_tap<T> computes it; lo > hi when none.
template <class T>
DITTO_UPSAMPLE_HD void linear_out_range(int64_t i, int64_t in, int64_t out, bool align_corners, int64_t& lo,
                                        int64_t& hi) {
  auto estimate = [&](int64_t target) -> int64_t {  // where i0 reaches target, roughly
    T o;
    if (align_corners)
      o = in > 1 ? T(target) * T(out - 1) / T(in - 1) : (target <= 0 ? T(0) : T(out - 1));
    else
      o = (T(target) + T(0.5)) * T(out) / T(in) - T(0.5);
    if (o < T(0)) return 0;
    if (o > T(out - 1)) return out - 1;
    return static_cast<int64_t>(o);
  };
  auto i0 = [&](int64_t o) { return linear_tap<T>(o, in, out, align_corners).i0; };
  lo = estimate(i - 1);
  while (lo > 0 && i0(lo - 1) >= i - 1) --lo;
  while (lo < out && i0(lo) < i - 1) ++lo;
  hi = estimate(i + 1);
  while (hi + 1 < out && i0(hi + 1) <= i) ++hi;
  while (hi >= 0 && i0(hi) > i) --hi;
}

// One output of one plane, computed in C (double for the reference, float on the GPU).
template <class C, class T>
DITTO_UPSAMPLE_HD C upsample_fwd_at(const T* xp, int64_t oh, int64_t ow, const UpsampleDims& d) {
  if (!d.bilinear) return C(xp[nearest_src(oh, d.h, d.oh) * d.w + nearest_src(ow, d.w, d.ow)]);
  const LinearTap<C> th = linear_tap<C>(oh, d.h, d.oh, d.align_corners);
  const LinearTap<C> tw = linear_tap<C>(ow, d.w, d.ow, d.align_corners);
  return th.l0 * (tw.l0 * C(xp[th.i0 * d.w + tw.i0]) + tw.l1 * C(xp[th.i0 * d.w + tw.i1])) +
         th.l1 * (tw.l0 * C(xp[th.i1 * d.w + tw.i0]) + tw.l1 * C(xp[th.i1 * d.w + tw.i1]));
}

// Where the gather reads its bilinear taps from. ComputedTaps<C> computes them (and the output
// ranges) where asked; TableTaps reads per-axis tables that build_tap_tables filled with the same
// functions, once per call: the CUDA gather's way, so each thread does a few loads instead of tens
// of tap computations. Both give the gather the same numbers.
template <class C>
struct ComputedTaps {
  const UpsampleDims* d;
  DITTO_UPSAMPLE_HD void rows(int64_t ih, int64_t& lo, int64_t& hi) const {
    linear_out_range<C>(ih, d->h, d->oh, d->align_corners, lo, hi);
  }
  DITTO_UPSAMPLE_HD void cols(int64_t iw, int64_t& lo, int64_t& hi) const {
    linear_out_range<C>(iw, d->w, d->ow, d->align_corners, lo, hi);
  }
  DITTO_UPSAMPLE_HD LinearTap<C> row_tap(int64_t oh) const { return linear_tap<C>(oh, d->h, d->oh, d->align_corners); }
  DITTO_UPSAMPLE_HD LinearTap<C> col_tap(int64_t ow) const { return linear_tap<C>(ow, d->w, d->ow, d->align_corners); }
};

// Per axis: range[2 * i], range[2 * i + 1] = the output range of input i; taps[o] = output o's tap.
struct TapTables {
  const int64_t* row_range = nullptr;
  const int64_t* col_range = nullptr;
  const LinearTap<float>* row_taps = nullptr;
  const LinearTap<float>* col_taps = nullptr;
  DITTO_UPSAMPLE_HD void rows(int64_t ih, int64_t& lo, int64_t& hi) const {
    lo = row_range[2 * ih];
    hi = row_range[2 * ih + 1];
  }
  DITTO_UPSAMPLE_HD void cols(int64_t iw, int64_t& lo, int64_t& hi) const {
    lo = col_range[2 * iw];
    hi = col_range[2 * iw + 1];
  }
  DITTO_UPSAMPLE_HD LinearTap<float> row_tap(int64_t oh) const { return row_taps[oh]; }
  DITTO_UPSAMPLE_HD LinearTap<float> col_tap(int64_t ow) const { return col_taps[ow]; }
};

// Entry k of the tables of one axis (in -> out): k < in fills range[2k..2k+1], in <= k < in + out
// fills taps[k - in]. The CUDA table kernel runs it per thread, build_tap_tables per entry.
DITTO_UPSAMPLE_HD void fill_tap_table(int64_t k, int64_t in, int64_t out, bool align_corners, int64_t* range,
                                      LinearTap<float>* taps) {
  if (k < in) {
    linear_out_range<float>(k, in, out, align_corners, range[2 * k], range[2 * k + 1]);
  } else {
    taps[k - in] = linear_tap<float>(k - in, in, out, align_corners);
  }
}

// Host copy of the tables (tests check the CUDA gather's arithmetic with them).
struct HostTapTables {
  std::vector<int64_t> row_range, col_range;
  std::vector<LinearTap<float>> row_taps, col_taps;
  TapTables view() const { return {row_range.data(), col_range.data(), row_taps.data(), col_taps.data()}; }
};
inline HostTapTables build_tap_tables(const UpsampleDims& d) {
  HostTapTables t;
  t.row_range.resize(std::size_t(2 * d.h));
  t.col_range.resize(std::size_t(2 * d.w));
  t.row_taps.resize(std::size_t(d.oh));
  t.col_taps.resize(std::size_t(d.ow));
  for (int64_t k = 0; k < d.h + d.oh; ++k) fill_tap_table(k, d.h, d.oh, d.align_corners, t.row_range.data(), t.row_taps.data());
  for (int64_t k = 0; k < d.w + d.ow; ++k) fill_tap_table(k, d.w, d.ow, d.align_corners, t.col_range.data(), t.col_taps.data());
  return t;
}

// The gather form of the backward pass for input (ih, iw) of one plane: the sum, over the outputs
// whose taps name (ih, iw) — output rows ascending, then for each its taps i0 then i1, then output
// columns ascending and their taps i0 then i1 — of (wy * wx) * dy. Each input is written by one
// thread in this fixed order: what the CUDA gather kernel runs (C = float, taps from TapTables).
// Taps and sums in C.
template <class C, class T, class Taps>
DITTO_UPSAMPLE_HD C upsample_gather_at(const T* dyp, int64_t ih, int64_t iw, const UpsampleDims& d, const Taps& taps) {
  C s = C(0);
  if (!d.bilinear) {
    const int64_t h1 = nearest_first_out(ih + 1, d.h, d.oh), w0 = nearest_first_out(iw, d.w, d.ow),
                  w1 = nearest_first_out(iw + 1, d.w, d.ow);
    for (int64_t oh = nearest_first_out(ih, d.h, d.oh); oh < h1; ++oh)
      for (int64_t ow = w0; ow < w1; ++ow) s += C(dyp[oh * d.ow + ow]);
    return s;
  }
  int64_t h_lo, h_hi, w_lo, w_hi;
  taps.rows(ih, h_lo, h_hi);
  taps.cols(iw, w_lo, w_hi);
  for (int64_t oh = h_lo; oh <= h_hi; ++oh) {
    const LinearTap<C> th = taps.row_tap(oh);
    for (int side_h = 0; side_h < 2; ++side_h) {
      if ((side_h ? th.i1 : th.i0) != ih) continue;
      const C wy = side_h ? th.l1 : th.l0;
      for (int64_t ow = w_lo; ow <= w_hi; ++ow) {
        const LinearTap<C> tw = taps.col_tap(ow);
        const C g = C(dyp[oh * d.ow + ow]);
        if (tw.i0 == iw) s += mul_rn(mul_rn(wy, tw.l0), g);
        if (tw.i1 == iw) s += mul_rn(mul_rn(wy, tw.l1), g);
      }
    }
  }
  return s;
}

template <class T>
void upsample_fwd(const T* x, T* y, const UpsampleDims& d) {
  for (int64_t pl = 0; pl < d.planes; ++pl)
    for (int64_t oh = 0; oh < d.oh; ++oh)
      for (int64_t ow = 0; ow < d.ow; ++ow)
        y[(pl * d.oh + oh) * d.ow + ow] = static_cast<T>(upsample_fwd_at<double>(x + pl * d.h * d.w, oh, ow, d));
}

// The adjoint, scattered output by output and accumulated in double: dx is overwritten.
template <class T>
void upsample_bwd(const T* dy, T* dx, const UpsampleDims& d) {
  std::vector<double> acc(static_cast<std::size_t>(d.h * d.w));
  for (int64_t pl = 0; pl < d.planes; ++pl) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const T* g = dy + pl * d.oh * d.ow;
    for (int64_t oh = 0; oh < d.oh; ++oh)
      for (int64_t ow = 0; ow < d.ow; ++ow) {
        const double v = double(g[oh * d.ow + ow]);
        if (!d.bilinear) {
          acc[nearest_src(oh, d.h, d.oh) * d.w + nearest_src(ow, d.w, d.ow)] += v;
          continue;
        }
        const LinearTap<double> th = linear_tap<double>(oh, d.h, d.oh, d.align_corners);
        const LinearTap<double> tw = linear_tap<double>(ow, d.w, d.ow, d.align_corners);
        acc[th.i0 * d.w + tw.i0] += th.l0 * tw.l0 * v;
        acc[th.i0 * d.w + tw.i1] += th.l0 * tw.l1 * v;
        acc[th.i1 * d.w + tw.i0] += th.l1 * tw.l0 * v;
        acc[th.i1 * d.w + tw.i1] += th.l1 * tw.l1 * v;
      }
    for (int64_t i = 0; i < d.h * d.w; ++i) dx[pl * d.h * d.w + i] = static_cast<T>(acc[static_cast<std::size_t>(i)]);
  }
}

}  // namespace ditto::ref
