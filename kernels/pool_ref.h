// CPU reference of kernels/pool: templated so gradient checks run in double; sums accumulate
// in double. The semantics here are the contract the own CUDA kernels follow bit for bit in
// their choices (which input a max-pool output comes from) and to rounding in their sums.
//
// Max pool: padding counts as -inf (a padded position never wins). Each window is scanned in
// row-major order (kernel row, then kernel column) and the FIRST maximum wins ties; a NaN wins
// over any number (the first NaN in scan order), so NaNs propagate. The winner's index inside
// its input plane (ih * W + iw) is the output's argmax; backward routes dy to it.
// Average pool: the divisor is always kernel_h * kernel_w — padded positions count (as
// cuDNN's CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING and PyTorch's count_include_pad=True).
#pragma once
#include <cmath>
#include <cstdint>

namespace ditto::ref {

// Geometry of one 2-D pooling: input N,C,H,W, output OH,OW (floor mode:
// OH = (H + 2*pad_h - kernel_h) / stride_h + 1), kernel, stride, padding.
struct PoolDims {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  int kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  int64_t planes() const { return n * c; }
};

// y[n,c,oh,ow] = max over the window; argmax (may be null) gets the winner's in-plane index.
template <class T>
void max_pool_fwd(const T* x, T* y, int32_t* argmax, const PoolDims& d) {
  for (int64_t pl = 0; pl < d.planes(); ++pl) {
    const T* xp = x + pl * d.h * d.w;
    for (int64_t oh = 0; oh < d.oh; ++oh)
      for (int64_t ow = 0; ow < d.ow; ++ow) {
        const int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
        bool found = false;
        T best = T(0);
        int64_t best_i = 0;
        for (int64_t ih = h0; ih < h0 + d.kh; ++ih) {
          if (ih < 0 || ih >= d.h) continue;
          for (int64_t iw = w0; iw < w0 + d.kw; ++iw) {
            if (iw < 0 || iw >= d.w) continue;
            const T v = xp[ih * d.w + iw];
            if (!found || v > best || (std::isnan(v) && !std::isnan(best))) {
              found = true;
              best = v;
              best_i = ih * d.w + iw;
            }
          }
        }
        const int64_t o = (pl * d.oh + oh) * d.ow + ow;
        y[o] = best;  // every window holds a real element: the op checks pad < kernel
        if (argmax) argmax[o] = static_cast<int32_t>(best_i);
      }
  }
}

// dx = 0, then dx[argmax(o)] += dy[o] for every output o in order.
template <class T>
void max_pool_bwd(const T* dy, const int32_t* argmax, T* dx, const PoolDims& d) {
  const int64_t in_plane = d.h * d.w, out_plane = d.oh * d.ow;
  for (int64_t i = 0; i < d.planes() * in_plane; ++i) dx[i] = T(0);
  for (int64_t pl = 0; pl < d.planes(); ++pl)
    for (int64_t o = 0; o < out_plane; ++o) dx[pl * in_plane + argmax[pl * out_plane + o]] += dy[pl * out_plane + o];
}

template <class T>
void avg_pool_fwd(const T* x, T* y, const PoolDims& d) {
  const double count = double(d.kh) * d.kw;
  for (int64_t pl = 0; pl < d.planes(); ++pl) {
    const T* xp = x + pl * d.h * d.w;
    for (int64_t oh = 0; oh < d.oh; ++oh)
      for (int64_t ow = 0; ow < d.ow; ++ow) {
        const int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
        double s = 0;
        for (int64_t ih = h0; ih < h0 + d.kh; ++ih)
          for (int64_t iw = w0; iw < w0 + d.kw; ++iw)
            if (ih >= 0 && ih < d.h && iw >= 0 && iw < d.w) s += double(xp[ih * d.w + iw]);
        y[(pl * d.oh + oh) * d.ow + ow] = static_cast<T>(s / count);
      }
  }
}

// dx[i] = sum over the windows covering i of dy / (kh*kw).
template <class T>
void avg_pool_bwd(const T* dy, T* dx, const PoolDims& d) {
  const double count = double(d.kh) * d.kw;
  for (int64_t pl = 0; pl < d.planes(); ++pl) {
    T* dxp = dx + pl * d.h * d.w;
    const T* dyp = dy + pl * d.oh * d.ow;
    for (int64_t ih = 0; ih < d.h; ++ih)
      for (int64_t iw = 0; iw < d.w; ++iw) {
        double s = 0;
        for (int64_t oh = 0; oh < d.oh; ++oh) {
          const int64_t h0 = oh * d.sh - d.ph;
          if (ih < h0 || ih >= h0 + d.kh) continue;
          for (int64_t ow = 0; ow < d.ow; ++ow) {
            const int64_t w0 = ow * d.sw - d.pw;
            if (iw >= w0 && iw < w0 + d.kw) s += double(dyp[oh * d.ow + ow]);
          }
        }
        dxp[ih * d.w + iw] = static_cast<T>(s / count);
      }
  }
}

// y[p] = mean of plane p (hw elements), for planes = N*C.
template <class T>
void global_avg_pool_fwd(const T* x, T* y, int64_t planes, int64_t hw) {
  for (int64_t p = 0; p < planes; ++p) {
    double s = 0;
    for (int64_t i = 0; i < hw; ++i) s += double(x[p * hw + i]);
    y[p] = static_cast<T>(s / double(hw));
  }
}

template <class T>
void global_avg_pool_bwd(const T* dy, T* dx, int64_t planes, int64_t hw) {
  for (int64_t p = 0; p < planes; ++p) {
    const T g = static_cast<T>(double(dy[p]) / double(hw));
    for (int64_t i = 0; i < hw; ++i) dx[p * hw + i] = g;
  }
}

// Adaptive average pool (torchvision's / PyTorch's AdaptiveAvgPool2d): output row i averages
// input rows [floor(i*H/OH), ceil((i+1)*H/OH)), likewise columns; windows may overlap and differ
// in size. Each output divides by its own window's element count.
struct AdaptivePoolDims {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
};

inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

template <class T>
void adaptive_avg_pool_fwd(const T* x, T* y, const AdaptivePoolDims& d) {
  for (int64_t pl = 0; pl < d.planes; ++pl) {
    const T* xp = x + pl * d.h * d.w;
    for (int64_t oh = 0; oh < d.oh; ++oh)
      for (int64_t ow = 0; ow < d.ow; ++ow) {
        const int64_t h0 = adaptive_start(oh, d.h, d.oh), h1 = adaptive_end(oh, d.h, d.oh);
        const int64_t w0 = adaptive_start(ow, d.w, d.ow), w1 = adaptive_end(ow, d.w, d.ow);
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += double(xp[ih * d.w + iw]);
        y[(pl * d.oh + oh) * d.ow + ow] = static_cast<T>(s / double((h1 - h0) * (w1 - w0)));
      }
  }
}

// Output rows whose windows contain input row i: [floor(i*OH/H), ceil((i+1)*OH/H)). (start(o)
// <= i iff o*H < (i+1)*OH; end(o) > i iff (o+1)*H > i*OH.) The same formulas as the windows,
// with in and out swapped; the CUDA gather uses them too.
inline int64_t adaptive_first_out(int64_t i, int64_t in, int64_t out) { return (i * out) / in; }
inline int64_t adaptive_last_out(int64_t i, int64_t in, int64_t out) { return ((i + 1) * out + in - 1) / in; }

// Gather: dx[i] = sum over the windows containing i of dy / window size, visiting output rows,
// then columns, in ascending order.
template <class T>
void adaptive_avg_pool_bwd(const T* dy, T* dx, const AdaptivePoolDims& d) {
  for (int64_t pl = 0; pl < d.planes; ++pl) {
    const T* dyp = dy + pl * d.oh * d.ow;
    for (int64_t ih = 0; ih < d.h; ++ih)
      for (int64_t iw = 0; iw < d.w; ++iw) {
        double s = 0;
        for (int64_t oh = adaptive_first_out(ih, d.h, d.oh); oh < adaptive_last_out(ih, d.h, d.oh); ++oh) {
          const int64_t wh = adaptive_end(oh, d.h, d.oh) - adaptive_start(oh, d.h, d.oh);
          for (int64_t ow = adaptive_first_out(iw, d.w, d.ow); ow < adaptive_last_out(iw, d.w, d.ow); ++ow) {
            const int64_t ww = adaptive_end(ow, d.w, d.ow) - adaptive_start(ow, d.w, d.ow);
            s += double(dyp[oh * d.ow + ow]) / double(wh * ww);
          }
        }
        dx[(pl * d.h + ih) * d.w + iw] = static_cast<T>(s);
      }
  }
}

}  // namespace ditto::ref
