// ditto's own pooling kernels. Which of them are deterministic, and why, is said per kernel.
// In-plane indices are int (the op checks H*W < 2^31); totals are int64.
#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/pool_cuda.h"
#include "engine/detail/float_map.cuh"

namespace ditto::cuda {
namespace {


// Max-pool forward with argmax: one thread per output. The window is scanned row-major and the
// first maximum wins (a NaN beats any number, the first NaN wins), exactly as ref::max_pool_fwd.
// No reduction across threads: deterministic.
template <class I>
__global__ void max_pool_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, int32_t* __restrict__ argmax,
                                    ref::PoolDims d) {
  const I OW = I(d.ow), OH = I(d.oh), H = I(d.h), W = I(d.w);
  const I total = I(d.n * d.c) * OH * OW;
  for (I o = blockIdx.x * I(blockDim.x) + threadIdx.x; o < total; o += I(gridDim.x) * I(blockDim.x)) {
    const I q = o / OW, ow = o - q * OW, pl = q / OH, oh = q - pl * OH;
    const float* xp = x + pl * H * W;
    const int h0 = int(oh) * d.sh - d.ph, w0 = int(ow) * d.sw - d.pw;
    const int hs = max(h0, 0), he = min(h0 + d.kh, int(d.h));
    const int ws = max(w0, 0), we = min(w0 + d.kw, int(d.w));
    float best = xp[hs * d.w + ws];
    int best_i = hs * int(d.w) + ws;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) {
        const float v = xp[ih * d.w + iw];
        if (v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_i = ih * int(d.w) + iw;
        }
      }
    y[o] = best;
    if (argmax) argmax[o] = best_i;
  }
}

// Max-pool backward by atomic scatter: one thread per OUTPUT adds its dy into dx[argmax] with
// atomicAdd. NOT deterministic: where windows overlap several outputs can share one argmax, and
// the order in which their float adds land depends on scheduling.
__global__ void max_pool_bwd_scatter_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                            float* __restrict__ dx, ref::PoolDims d) {
  const int64_t out_plane = d.oh * d.ow, in_plane = d.h * d.w;
  const int64_t total = (d.n * d.c) * out_plane;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(dx + (o / out_plane) * in_plane + argmax[o], dy[o]);
}

// Max-pool backward by gather: one thread per INPUT element visits the outputs whose windows
// cover it — output rows ascending, then columns ascending — and sums the dy of those whose
// argmax is this element. Each dx is written by one thread with a fixed summation order:
// deterministic, no atomics (Caffe's scheme).
template <class I>
__global__ void max_pool_bwd_gather_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                           float* __restrict__ dx, ref::PoolDims d) {
  const I H = I(d.h), W = I(d.w), OH = I(d.oh), OW = I(d.ow);
  const I total = I(d.n * d.c) * H * W;
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    const I q = i / W, iw_ = i - q * W, pl = q / H, ih_ = q - pl * H;
    const int iw = int(iw_), ih = int(ih_);
    const int me = ih * int(d.w) + iw;
    // Output row oh covers rows [oh*sh - ph, oh*sh - ph + kh): oh in [ceil((ih+ph-kh+1)/sh), (ih+ph)/sh].
    const int oh_lo = (ih + d.ph < d.kh) ? 0 : (ih + d.ph - d.kh) / d.sh + 1;
    const int oh_hi = min((ih + d.ph) / d.sh, int(d.oh) - 1);
    const int ow_lo = (iw + d.pw < d.kw) ? 0 : (iw + d.pw - d.kw) / d.sw + 1;
    const int ow_hi = min((iw + d.pw) / d.sw, int(d.ow) - 1);
    const I base = pl * OH * OW;
    float s = 0.f;
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {
        const I o = base + I(oh) * OW + I(ow);
        if (__ldg(argmax + o) == me) s += __ldg(dy + o);
      }
    dx[i] = s;
  }
}

// Average-pool forward: one thread per output sums its window row-major in float and divides by
// kh*kw (padding counts). No cross-thread reduction: deterministic.
__global__ void avg_pool_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, ref::PoolDims d) {
  const int64_t total = (d.n * d.c) * d.oh * d.ow;
  const float count = float(d.kh * d.kw);
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < total; o += int64_t(gridDim.x) * blockDim.x) {
    const int ow = static_cast<int>(o % d.ow);
    const int oh = static_cast<int>((o / d.ow) % d.oh);
    const float* xp = x + (o / (d.ow * d.oh)) * d.h * d.w;
    const int h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    const int hs = max(h0, 0), he = min(h0 + d.kh, int(d.h));
    const int ws = max(w0, 0), we = min(w0 + d.kw, int(d.w));
    float s = 0.f;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) s += xp[ih * d.w + iw];
    y[o] = s / count;
  }
}

// Average-pool backward by gather: one thread per input sums the dy of the covering windows in a
// fixed order (rows, then columns ascending), then divides by kh*kw. Deterministic, no atomics.
__global__ void avg_pool_bwd_kernel(const float* __restrict__ dy, float* __restrict__ dx, ref::PoolDims d) {
  const int64_t total = (d.n * d.c) * d.h * d.w;
  const float count = float(d.kh * d.kw);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int iw = static_cast<int>(i % d.w);
    const int ih = static_cast<int>((i / d.w) % d.h);
    const int64_t pl = i / (d.w * d.h);
    const int oh_lo = (ih + d.ph < d.kh) ? 0 : (ih + d.ph - d.kh) / d.sh + 1;
    const int oh_hi = min((ih + d.ph) / d.sh, int(d.oh) - 1);
    const int ow_lo = (iw + d.pw < d.kw) ? 0 : (iw + d.pw - d.kw) / d.sw + 1;
    const int ow_hi = min((iw + d.pw) / d.sw, int(d.ow) - 1);
    const float* dyp = dy + pl * d.oh * d.ow;
    float s = 0.f;
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) s += dyp[int64_t(oh) * d.ow + ow];
    dx[i] = s / count;
  }
}


}  // namespace

void max_pool_fwd_argmax(Context& ctx, const float* x, float* y, int32_t* argmax, const ref::PoolDims& d) {
  const int64_t n = d.planes() * d.oh * d.ow;
  if (n == 0) return;
  if (n < int64_t(INT32_MAX) && d.planes() * d.h * d.w < int64_t(INT32_MAX))
    max_pool_fwd_kernel<int32_t><<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, y, argmax, d);
  else
    max_pool_fwd_kernel<int64_t><<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, y, argmax, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void max_pool_bwd_atomic_scatter(Context& ctx, const float* dy, const int32_t* argmax, float* dx,
                                 const ref::PoolDims& d) {
  const int64_t n = d.planes() * d.oh * d.ow;
  if (n == 0) return;
  max_pool_bwd_scatter_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, argmax, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void max_pool_bwd_gather(Context& ctx, const float* dy, const int32_t* argmax, float* dx, const ref::PoolDims& d) {
  const int64_t n = d.planes() * d.h * d.w;
  if (n == 0) return;
  if (n < int64_t(INT32_MAX))
    max_pool_bwd_gather_kernel<int32_t><<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, argmax, dx, d);
  else
    max_pool_bwd_gather_kernel<int64_t><<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, argmax, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void avg_pool_fwd(Context& ctx, const float* x, float* y, const ref::PoolDims& d) {
  const int64_t n = d.planes() * d.oh * d.ow;
  if (n == 0) return;
  avg_pool_fwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, y, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void avg_pool_bwd(Context& ctx, const float* dy, float* dx, const ref::PoolDims& d) {
  const int64_t n = d.planes() * d.h * d.w;
  if (n == 0) return;
  avg_pool_bwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

namespace {

// Adaptive average pool forward: one thread per output; its window (ref::adaptive_start/end) is
// summed row-major in float, then divided by the window's size. No reductions across threads:
// deterministic.
__global__ void adaptive_avg_pool_fwd_kernel(const float* __restrict__ x, float* __restrict__ y,
                                             ref::AdaptivePoolDims d) {
  const int64_t total = d.planes * d.oh * d.ow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ow = i % d.ow, oh = (i / d.ow) % d.oh, pl = i / (d.ow * d.oh);
    const int64_t h0 = (oh * d.h) / d.oh, h1 = ((oh + 1) * d.h + d.oh - 1) / d.oh;
    const int64_t w0 = (ow * d.w) / d.ow, w1 = ((ow + 1) * d.w + d.ow - 1) / d.ow;
    const float* xp = x + pl * d.h * d.w;
    float s = 0.f;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += xp[ih * d.w + iw];
    y[i] = s / float((h1 - h0) * (w1 - w0));
  }
}

// Adaptive average pool backward as a GATHER: one thread per input element visits the outputs
// whose windows contain it (rows, then columns, ascending; ref::adaptive_first_out/last_out)
// and adds dy / window size. Each dx is written by one thread in a fixed order, no atomics:
// deterministic (the scatter formulation would need atomicAdd where windows overlap).
__global__ void adaptive_avg_pool_bwd_kernel(const float* __restrict__ dy, float* __restrict__ dx,
                                             ref::AdaptivePoolDims d) {
  const int64_t total = d.planes * d.h * d.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t iw = i % d.w, ih = (i / d.w) % d.h, pl = i / (d.w * d.h);
    const float* dyp = dy + pl * d.oh * d.ow;
    const int64_t oh0 = (ih * d.oh) / d.h, oh1 = ((ih + 1) * d.oh + d.h - 1) / d.h;
    const int64_t ow0 = (iw * d.ow) / d.w, ow1 = ((iw + 1) * d.ow + d.w - 1) / d.w;
    float s = 0.f;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t wh = ((oh + 1) * d.h + d.oh - 1) / d.oh - (oh * d.h) / d.oh;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t ww = ((ow + 1) * d.w + d.ow - 1) / d.ow - (ow * d.w) / d.ow;
        s += dyp[oh * d.ow + ow] / float(wh * ww);
      }
    }
    dx[i] = s;
  }
}

}  // namespace

void adaptive_avg_pool_fwd(Context& ctx, const float* x, float* y, const ref::AdaptivePoolDims& d) {
  const int64_t n = d.planes * d.oh * d.ow;
  if (n == 0) return;
  adaptive_avg_pool_fwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, y, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void adaptive_avg_pool_bwd(Context& ctx, const float* dy, float* dx, const ref::AdaptivePoolDims& d) {
  const int64_t n = d.planes * d.h * d.w;
  if (n == 0) return;
  adaptive_avg_pool_bwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

namespace {
// Channels-last: block (t, n) owns channels 32t..32t+31 of image n, one per thread column; the
// 16 threads of a column sum pixels k, k+16, k+32, ... in increasing order, and the 16 lane sums
// are added in lane order (a warp reads 32 neighbouring channels of one pixel). Deterministic.
constexpr int kGapCols = 32, kGapLanes = 16;
template <class T>
__global__ void __launch_bounds__(kGapCols* kGapLanes) gap_fwd_nhwc_kernel(const T* __restrict__ x,
                                                                           float* __restrict__ y, int64_t c,
                                                                           int64_t hw) {
  const int64_t img = blockIdx.y, ch = int64_t(blockIdx.x) * kGapCols + threadIdx.x;
  float s = 0.f;
  if (ch < c) {
    const T* p = x + img * hw * c + ch;
    for (int64_t k = threadIdx.y; k < hw; k += kGapLanes) s += to_f(p[k * c]);
  }
  const float t = column_sum<kGapLanes>(s);
  if (threadIdx.y == 0 && ch < c) y[img * c + ch] = t / float(hw);
}
constexpr int kWarpsPerBlock = 8;
// NCHW: one warp per plane; lane l sums elements l, l+32, ... in order, then the 32 lane sums are
// combined by a fixed xor-shuffle tree. The order depends only on hw: deterministic, no atomics.
template <class T>
__global__ void gap_fwd_nchw_kernel(const T* __restrict__ x, float* __restrict__ y, int64_t planes, int64_t hw) {
  const int lane = threadIdx.x & 31;
  for (int64_t p = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5); p < planes;
       p += int64_t(gridDim.x) * kWarpsPerBlock) {
    const T* xp = x + p * hw;
    float s = 0.f;
    for (int64_t i = lane; i < hw; i += 32) s += to_f(xp[i]);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) y[p] = s / float(hw);
  }
}
template <class T>
__global__ void gap_bwd_any_kernel(const float* __restrict__ dy, T* __restrict__ dx, int64_t n, int64_t c, int64_t hw,
                                   bool nhwc) {
  DITTO_GRID_STRIDE(i, n * c * hw) {
    const int64_t plane = nhwc ? (i / (hw * c)) * c + i % c : i / hw;
    dx[i] = from_f<T>(dy[plane] / float(hw));
  }
}
template <class T>
void gap_fwd(Context& ctx, bool nhwc, const void* x, float* y, int64_t n, int64_t c, int64_t hw) {
  cudaStream_t s = detail::stream_of(ctx);
  if (nhwc) {
    const dim3 grid(static_cast<unsigned>((c + kGapCols - 1) / kGapCols), static_cast<unsigned>(n));
    gap_fwd_nhwc_kernel<T><<<grid, dim3(kGapCols, kGapLanes), 0, s>>>(static_cast<const T*>(x), y, c, hw);
  } else {
    const int64_t b = (n * c + kWarpsPerBlock - 1) / kWarpsPerBlock;
    gap_fwd_nchw_kernel<T><<<static_cast<unsigned>(b < 524280 ? b : 524280), 32 * kWarpsPerBlock, 0, s>>>(
        static_cast<const T*>(x), y, n * c, hw);
  }
}
}  // namespace

void global_avg_pool_fwd_any(Context& ctx, DType t, bool nhwc, const void* x, float* y, int64_t n, int64_t c,
                             int64_t hw) {
  if (n * c == 0) return;
  with_float_type(t, [&](auto tag) { gap_fwd<decltype(tag)>(ctx, nhwc, x, y, n, c, hw); });
  DITTO_CHECK_LAUNCH(ctx);
}

void global_avg_pool_bwd_any(Context& ctx, DType t, bool nhwc, const float* dy, void* dx, int64_t n, int64_t c,
                             int64_t hw) {
  launch_for_float_type(ctx, t, n * c * hw, [&](auto tag, unsigned blocks, cudaStream_t s) {
    using T = decltype(tag);
    gap_bwd_any_kernel<T><<<blocks, kThreads, 0, s>>>(dy, static_cast<T*>(dx), n, c, hw, nhwc);
  });
}

namespace {
// Element (n, c, h, w) of an N x C x H x W tensor in either layout.
struct Index4 {
  int64_t c, h, w;
  bool nhwc;
  __device__ __forceinline__ int64_t at(int64_t n, int64_t ch, int64_t ih, int64_t iw) const {
    return nhwc ? ((n * h + ih) * w + iw) * c + ch : ((n * c + ch) * h + ih) * w + iw;
  }
  // The (n, c, h, w) of memory offset i.
  __device__ __forceinline__ void decode(int64_t i, int64_t& n, int64_t& ch, int64_t& ih, int64_t& iw) const {
    if (nhwc) {
      ch = i % c;
      i /= c;
      iw = i % w;
      i /= w;
      ih = i % h;
      n = i / h;
    } else {
      iw = i % w;
      i /= w;
      ih = i % h;
      i /= h;
      ch = i % c;
      n = i / c;
    }
  }
};

// One thread per output, in memory order: the window scanned row-major, the first maximum wins
// (NaN beats any number), as max_pool_fwd_kernel.
template <class T>
__global__ void max_pool_fwd_any_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ argmax,
                                        ref::PoolDims d, bool nhwc) {
  const Index4 in{d.c, d.h, d.w, nhwc}, out{d.c, d.oh, d.ow, nhwc};
  DITTO_GRID_STRIDE(o, d.n * d.c * d.oh * d.ow) {
    int64_t n, ch, oh, ow;
    out.decode(o, n, ch, oh, ow);
    const int h0 = int(oh) * d.sh - d.ph, w0 = int(ow) * d.sw - d.pw;
    const int hs = max(h0, 0), he = min(h0 + d.kh, int(d.h));
    const int ws = max(w0, 0), we = min(w0 + d.kw, int(d.w));
    T best = x[in.at(n, ch, hs, ws)];
    float fb = to_f(best);
    int best_i = hs * int(d.w) + ws;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) {
        const T v = x[in.at(n, ch, ih, iw)];
        const float fv = to_f(v);
        if (fv > fb || (isnan(fv) && !isnan(fb))) {
          best = v;
          fb = fv;
          best_i = ih * int(d.w) + iw;
        }
      }
    y[o] = best;
    if (argmax) argmax[o] = best_i;
  }
}

// One thread per input, in memory order: the covering outputs' dy whose argmax is this element,
// output rows then columns ascending, summed in float and rounded once.
template <class T>
__global__ void max_pool_bwd_gather_any_kernel(const T* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               T* __restrict__ dx, ref::PoolDims d, bool nhwc) {
  const Index4 in{d.c, d.h, d.w, nhwc}, out{d.c, d.oh, d.ow, nhwc};
  DITTO_GRID_STRIDE(i, d.n * d.c * d.h * d.w) {
    int64_t n, ch, ih, iw;
    in.decode(i, n, ch, ih, iw);
    const int me = int(ih) * int(d.w) + int(iw);
    const int oh_lo = (ih + d.ph < d.kh) ? 0 : (int(ih) + d.ph - d.kh) / d.sh + 1;
    const int oh_hi = min((int(ih) + d.ph) / d.sh, int(d.oh) - 1);
    const int ow_lo = (iw + d.pw < d.kw) ? 0 : (int(iw) + d.pw - d.kw) / d.sw + 1;
    const int ow_hi = min((int(iw) + d.pw) / d.sw, int(d.ow) - 1);
    float s = 0.f;
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t o = out.at(n, ch, oh, ow);
        if (__ldg(argmax + o) == me) s += to_f(dy[o]);
      }
    dx[i] = from_f<T>(s);
  }
}

// One thread per output: atomicAdd of its dy into the float buffer at its argmax. NOT
// deterministic where windows overlap (the adds land in scheduling order).
template <class T>
__global__ void max_pool_bwd_scatter_any_kernel(const T* __restrict__ dy, const int32_t* __restrict__ argmax,
                                                float* __restrict__ dx, ref::PoolDims d, bool nhwc) {
  const Index4 in{d.c, d.h, d.w, nhwc}, out{d.c, d.oh, d.ow, nhwc};
  DITTO_GRID_STRIDE(o, d.n * d.c * d.oh * d.ow) {
    int64_t n, ch, oh, ow;
    out.decode(o, n, ch, oh, ow);
    const int a = argmax[o];
    atomicAdd(dx + in.at(n, ch, a / int(d.w), a % int(d.w)), to_f(dy[o]));
  }
}

// Channels-last: each pixel (an output pixel in the forwards and the atomic scatter, an input pixel
// in the gathers) is taken by a group of L neighbouring lanes over its channels (L the power of two
// at or above C, at most 32; a warp takes 32 / L pixels), so every access reads neighbouring
// channels and the pixel's window, or the outputs that cover it, is worked out once per lane rather
// than once per element by 64-bit divisions. Per element the window scan and the sum orders are
// those of the kernels above, so the bits are theirs. Pixel counts and in-plane offsets fit in int
// (pixel_kernels_fit).
constexpr int kPixWarps = 8;

// A lane's pixels and channels: pixel `first`, then every `step`-th; channels `ch0`, ch0 + L, ...
struct PixelLanes {
  int first, step, ch0, lanes;
};
__device__ __forceinline__ PixelLanes pixel_lanes(int log2_lanes) {
  const int per_warp = 32 >> log2_lanes;
  return {(int(blockIdx.x) * kPixWarps + int(threadIdx.y)) * per_warp + (int(threadIdx.x) >> log2_lanes),
          int(gridDim.x) * kPixWarps * per_warp, int(threadIdx.x) & ((1 << log2_lanes) - 1), 1 << log2_lanes};
}
inline int log2_lanes_for(int64_t c) {
  int l = 0;
  while (l < 5 && (int64_t(1) << l) < c) ++l;
  return l;
}

struct Pixel {
  int n, h, w;
};
__device__ __forceinline__ Pixel pixel_of(int p, int h, int w) {
  const int q = p / w;
  return {q / h, q - (q / h) * h, p - q * w};
}
// Pixel indices stay below half of INT_MAX, so a lane's last stride step cannot overflow.
inline bool pixel_kernels_fit(const ref::PoolDims& d) {
  constexpr int64_t kMax = INT_MAX / 2;
  return d.n * d.h * d.w < kMax && d.n * d.oh * d.ow < kMax && d.c < INT_MAX;
}
inline unsigned pixel_blocks(int64_t pixels, int log2_lanes) {
  const int64_t per_block = int64_t(kPixWarps) * (32 >> log2_lanes);
  const int64_t b = (pixels + per_block - 1) / per_block;
  return static_cast<unsigned>(b < (int64_t(1) << 20) ? b : (int64_t(1) << 20));
}

// Output pixel o's window clipped to the input: rows [hs, he), columns [ws, we).
struct Window {
  int hs, he, ws, we;
};
__device__ __forceinline__ Window window_of(const Pixel& o, const ref::PoolDims& d) {
  const int h0 = o.h * d.sh - d.ph, w0 = o.w * d.sw - d.pw;
  return {max(h0, 0), min(h0 + d.kh, int(d.h)), max(w0, 0), min(w0 + d.kw, int(d.w))};
}
// Input pixel i is covered by output rows [oh_lo, oh_hi] and columns [ow_lo, ow_hi].
struct Cover {
  int oh_lo, oh_hi, ow_lo, ow_hi;
};
__device__ __forceinline__ Cover cover_of(const Pixel& i, const ref::PoolDims& d) {
  return {(i.h + d.ph < d.kh) ? 0 : (i.h + d.ph - d.kh) / d.sh + 1, min((i.h + d.ph) / d.sh, int(d.oh) - 1),
          (i.w + d.pw < d.kw) ? 0 : (i.w + d.pw - d.kw) / d.sw + 1, min((i.w + d.pw) / d.sw, int(d.ow) - 1)};
}

template <class T>
__global__ void __launch_bounds__(32 * kPixWarps)
    max_pool_fwd_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ argmax, ref::PoolDims d,
                             int log2_lanes) {
  const int C = int(d.c), W = int(d.w), pixels = int(d.n * d.oh * d.ow);
  const PixelLanes pl = pixel_lanes(log2_lanes);
  for (int p = pl.first; p < pixels; p += pl.step) {
    const Pixel o = pixel_of(p, int(d.oh), int(d.ow));
    const Window win = window_of(o, d);
    const T* xn = x + int64_t(o.n) * d.h * W * C;
    for (int ch = pl.ch0; ch < C; ch += pl.lanes) {
      T best = xn[(int64_t(win.hs) * W + win.ws) * C + ch];
      float fb = to_f(best);
      int best_i = win.hs * W + win.ws;
      for (int ih = win.hs; ih < win.he; ++ih)
        for (int iw = win.ws; iw < win.we; ++iw) {
          const T v = xn[(int64_t(ih) * W + iw) * C + ch];
          const float fv = to_f(v);
          if (fv > fb || (isnan(fv) && !isnan(fb))) {
            best = v;
            fb = fv;
            best_i = ih * W + iw;
          }
        }
      y[int64_t(p) * C + ch] = best;
      if (argmax) argmax[int64_t(p) * C + ch] = best_i;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kPixWarps)
    max_pool_bwd_gather_nhwc_kernel(const T* __restrict__ dy, const int32_t* __restrict__ argmax, T* __restrict__ dx,
                                    ref::PoolDims d, int log2_lanes) {
  const int C = int(d.c), W = int(d.w), OW = int(d.ow), pixels = int(d.n * d.h * d.w);
  const PixelLanes pl = pixel_lanes(log2_lanes);
  for (int p = pl.first; p < pixels; p += pl.step) {
    const Pixel i = pixel_of(p, int(d.h), W);
    const Cover cv = cover_of(i, d);
    const int me = i.h * W + i.w;
    const int64_t out0 = int64_t(i.n) * d.oh * OW;
    for (int ch = pl.ch0; ch < C; ch += pl.lanes) {
      float s = 0.f;
      for (int oh = cv.oh_lo; oh <= cv.oh_hi; ++oh)
        for (int ow = cv.ow_lo; ow <= cv.ow_hi; ++ow) {
          const int64_t o = (out0 + int64_t(oh) * OW + ow) * C + ch;
          if (__ldg(argmax + o) == me) s += to_f(dy[o]);
        }
      dx[int64_t(p) * C + ch] = from_f<T>(s);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kPixWarps)
    max_pool_bwd_scatter_nhwc_kernel(const T* __restrict__ dy, const int32_t* __restrict__ argmax,
                                     float* __restrict__ dx, ref::PoolDims d, int log2_lanes) {
  const int C = int(d.c), pixels = int(d.n * d.oh * d.ow);
  const PixelLanes pl = pixel_lanes(log2_lanes);
  for (int p = pl.first; p < pixels; p += pl.step) {
    const int64_t in0 = int64_t(p / int(d.oh * d.ow)) * d.h * d.w;
    for (int ch = pl.ch0; ch < C; ch += pl.lanes) {
      const int64_t o = int64_t(p) * C + ch;
      atomicAdd(dx + (in0 + argmax[o]) * C + ch, to_f(dy[o]));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kPixWarps)
    avg_pool_fwd_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, ref::PoolDims d, int log2_lanes) {
  const int C = int(d.c), W = int(d.w), pixels = int(d.n * d.oh * d.ow);
  const float count = float(d.kh * d.kw);
  const PixelLanes pl = pixel_lanes(log2_lanes);
  for (int p = pl.first; p < pixels; p += pl.step) {
    const Pixel o = pixel_of(p, int(d.oh), int(d.ow));
    const Window win = window_of(o, d);
    const T* xn = x + int64_t(o.n) * d.h * W * C;
    for (int ch = pl.ch0; ch < C; ch += pl.lanes) {
      float s = 0.f;
      for (int ih = win.hs; ih < win.he; ++ih)
        for (int iw = win.ws; iw < win.we; ++iw) s += to_f(xn[(int64_t(ih) * W + iw) * C + ch]);
      y[int64_t(p) * C + ch] = from_f<T>(s / count);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kPixWarps)
    avg_pool_bwd_nhwc_kernel(const T* __restrict__ dy, T* __restrict__ dx, ref::PoolDims d, int log2_lanes) {
  const int C = int(d.c), W = int(d.w), OW = int(d.ow), pixels = int(d.n * d.h * d.w);
  const float count = float(d.kh * d.kw);
  const PixelLanes pl = pixel_lanes(log2_lanes);
  for (int p = pl.first; p < pixels; p += pl.step) {
    const Pixel i = pixel_of(p, int(d.h), W);
    const Cover cv = cover_of(i, d);
    const int64_t out0 = int64_t(i.n) * d.oh * OW;
    for (int ch = pl.ch0; ch < C; ch += pl.lanes) {
      float s = 0.f;
      for (int oh = cv.oh_lo; oh <= cv.oh_hi; ++oh)
        for (int ow = cv.ow_lo; ow <= cv.ow_hi; ++ow) s += to_f(dy[(out0 + int64_t(oh) * OW + ow) * C + ch]);
      dx[int64_t(p) * C + ch] = from_f<T>(s / count);
    }
  }
}

// Launches a channels-last kernel over `pixels` pixels of c channels: fn(T{}, blocks, block, log2 of
// the lanes per pixel, stream).
template <class Fn>
void launch_pixels(Context& ctx, DType t, int64_t pixels, int64_t c, Fn&& fn) {
  if (pixels == 0 || c == 0) return;
  const int l = log2_lanes_for(c);
  with_float_type(t, [&](auto tag) { fn(tag, pixel_blocks(pixels, l), dim3(32, kPixWarps), l, detail::stream_of(ctx)); });
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace

void max_pool_fwd_argmax_any(Context& ctx, DType t, bool nhwc, const void* x, void* y, int32_t* argmax,
                             const ref::PoolDims& d) {
  if (nhwc && pixel_kernels_fit(d))
    return launch_pixels(ctx, t, d.n * d.oh * d.ow, d.c, [&](auto tag, unsigned blocks, dim3 block, int l, cudaStream_t s) {
      using T = decltype(tag);
      max_pool_fwd_nhwc_kernel<T><<<blocks, block, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), argmax, d, l);
    });
  launch_for_float_type(ctx, t, d.n * d.c * d.oh * d.ow, [&](auto tag, unsigned blocks, cudaStream_t s) {
    using T = decltype(tag);
    max_pool_fwd_any_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), argmax, d,
                                                           nhwc);
  });
}

void max_pool_bwd_gather_any(Context& ctx, DType t, bool nhwc, const void* dy, const int32_t* argmax, void* dx,
                             const ref::PoolDims& d) {
  if (nhwc && pixel_kernels_fit(d))
    return launch_pixels(ctx, t, d.n * d.h * d.w, d.c, [&](auto tag, unsigned blocks, dim3 block, int l, cudaStream_t s) {
      using T = decltype(tag);
      max_pool_bwd_gather_nhwc_kernel<T><<<blocks, block, 0, s>>>(static_cast<const T*>(dy), argmax,
                                                                  static_cast<T*>(dx), d, l);
    });
  launch_for_float_type(ctx, t, d.n * d.c * d.h * d.w, [&](auto tag, unsigned blocks, cudaStream_t s) {
    using T = decltype(tag);
    max_pool_bwd_gather_any_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(dy), argmax,
                                                                  static_cast<T*>(dx), d, nhwc);
  });
}

void max_pool_bwd_atomic_scatter_any(Context& ctx, DType t, bool nhwc, const void* dy, const int32_t* argmax,
                                     float* dx32, const ref::PoolDims& d) {
  if (nhwc && pixel_kernels_fit(d))
    return launch_pixels(ctx, t, d.n * d.oh * d.ow, d.c, [&](auto tag, unsigned blocks, dim3 block, int l, cudaStream_t s) {
      using T = decltype(tag);
      max_pool_bwd_scatter_nhwc_kernel<T><<<blocks, block, 0, s>>>(static_cast<const T*>(dy), argmax, dx32, d, l);
    });
  launch_for_float_type(ctx, t, d.n * d.c * d.oh * d.ow, [&](auto tag, unsigned blocks, cudaStream_t s) {
    using T = decltype(tag);
    max_pool_bwd_scatter_any_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(dy), argmax, dx32, d,
                                                                   nhwc);
  });
}

namespace {
// One thread per output: its window summed row-major in float, divided by kh*kw (padding counts),
// as avg_pool_fwd_kernel; rounded once.
template <class T>
__global__ void avg_pool_fwd_any_kernel(const T* __restrict__ x, T* __restrict__ y, ref::PoolDims d, bool nhwc) {
  const Index4 in{d.c, d.h, d.w, nhwc}, out{d.c, d.oh, d.ow, nhwc};
  const float count = float(d.kh * d.kw);
  DITTO_GRID_STRIDE(o, d.n * d.c * d.oh * d.ow) {
    int64_t n, ch, oh, ow;
    out.decode(o, n, ch, oh, ow);
    const int h0 = int(oh) * d.sh - d.ph, w0 = int(ow) * d.sw - d.pw;
    const int hs = max(h0, 0), he = min(h0 + d.kh, int(d.h));
    const int ws = max(w0, 0), we = min(w0 + d.kw, int(d.w));
    float s = 0.f;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) s += to_f(x[in.at(n, ch, ih, iw)]);
    y[o] = from_f<T>(s / count);
  }
}
// One thread per input: the covering windows' dy summed (rows, then columns ascending), then / kh*kw.
template <class T>
__global__ void avg_pool_bwd_any_kernel(const T* __restrict__ dy, T* __restrict__ dx, ref::PoolDims d, bool nhwc) {
  const Index4 in{d.c, d.h, d.w, nhwc}, out{d.c, d.oh, d.ow, nhwc};
  const float count = float(d.kh * d.kw);
  DITTO_GRID_STRIDE(i, d.n * d.c * d.h * d.w) {
    int64_t n, ch, ih, iw;
    in.decode(i, n, ch, ih, iw);
    const int oh_lo = (ih + d.ph < d.kh) ? 0 : (int(ih) + d.ph - d.kh) / d.sh + 1;
    const int oh_hi = min((int(ih) + d.ph) / d.sh, int(d.oh) - 1);
    const int ow_lo = (iw + d.pw < d.kw) ? 0 : (int(iw) + d.pw - d.kw) / d.sw + 1;
    const int ow_hi = min((int(iw) + d.pw) / d.sw, int(d.ow) - 1);
    float s = 0.f;
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) s += to_f(dy[out.at(n, ch, oh, ow)]);
    dx[i] = from_f<T>(s / count);
  }
}
}  // namespace

void avg_pool_fwd_any(Context& ctx, DType t, bool nhwc, const void* x, void* y, const ref::PoolDims& d) {
  if (nhwc && pixel_kernels_fit(d))
    return launch_pixels(ctx, t, d.n * d.oh * d.ow, d.c, [&](auto tag, unsigned blocks, dim3 block, int l, cudaStream_t s) {
      using T = decltype(tag);
      avg_pool_fwd_nhwc_kernel<T><<<blocks, block, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), d, l);
    });
  launch_for_float_type(ctx, t, d.n * d.c * d.oh * d.ow, [&](auto tag, unsigned blocks, cudaStream_t s) {
    using T = decltype(tag);
    avg_pool_fwd_any_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), d, nhwc);
  });
}

void avg_pool_bwd_any(Context& ctx, DType t, bool nhwc, const void* dy, void* dx, const ref::PoolDims& d) {
  if (nhwc && pixel_kernels_fit(d))
    return launch_pixels(ctx, t, d.n * d.h * d.w, d.c, [&](auto tag, unsigned blocks, dim3 block, int l, cudaStream_t s) {
      using T = decltype(tag);
      avg_pool_bwd_nhwc_kernel<T><<<blocks, block, 0, s>>>(static_cast<const T*>(dy), static_cast<T*>(dx), d, l);
    });
  launch_for_float_type(ctx, t, d.n * d.c * d.h * d.w, [&](auto tag, unsigned blocks, cudaStream_t s) {
    using T = decltype(tag);
    avg_pool_bwd_any_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<T*>(dx), d, nhwc);
  });
}

}  // namespace ditto::cuda
