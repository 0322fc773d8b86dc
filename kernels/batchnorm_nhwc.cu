// ditto's own batch-norm kernels for channels-last tensors of any float dtype (f32, bf16, f16):
// a channel's M = N*HW values are a column of the M x C matrix that the memory is. Statistics,
// sums and the saved mean / inverse std are float whatever x's dtype; y and dx are rounded once
// to x's dtype.
//
// Per-channel reductions run on a (P, ceil(C/32)) grid of 32 x 8 blocks: block (p, t) owns the
// fixed row range p of the M rows (P and the ranges depend only on the shape) and channels
// 32t .. 32t+31, one per thread column; the 8 threads of a column take rows r, r+8, r+16, ... of
// the range in increasing order (a warp reads 32 neighbouring channels of one row). The 8
// per-thread results of a column are merged in row-lane order, then:
//   - statistics: per-thread shifted sums turned into (count, mean, M2) and merged with Chan's
//     pairwise update (as kernels/batchnorm.cu), the P partials of a channel merged in part order
//     by one thread: deterministic on any GPU;
//   - backward sums (sum dy, sum dy*(x - mean)): fixed order the same way, or, for the atomic
//     variant, each block's sum atomicAdded into the channel's accumulator (not_guaranteed).
// The elementwise passes (normalize, dx) are one thread per vector of 16 bytes when C is a
// multiple of the vector, else per element: deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/detail/cuda_state.h"
#include "engine/detail/float_map.cuh"
#include "engine/detail/launch.cuh"
#include "engine/error.h"
#include "kernels/detail/batchnorm_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int kCols = 32, kLanes = 8;  // block: 32 channels x 8 row lanes
constexpr int64_t kRowsPerPart = 512;
constexpr int64_t kMaxParts = 256;
constexpr int kUnroll = 4;

inline int64_t nhwc_parts(int64_t rows) {
  const int64_t p = (rows + kRowsPerPart - 1) / kRowsPerPart;
  return p < 1 ? 1 : (p > kMaxParts ? kMaxParts : p);
}

struct Moments {
  float n, mean, m2;
};
__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  if (a.n == 0.f) return b;
  if (b.n == 0.f) return a;
  const float n = a.n + b.n, d = b.mean - a.mean, f = b.n / n;
  return {n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
}

struct RowRange {
  int64_t begin, end;
};
__device__ __forceinline__ RowRange rows_of_part(int64_t rows, int64_t parts) {
  const int64_t len = (rows + parts - 1) / parts, b = int64_t(blockIdx.x) * len;
  return {b, b + len < rows ? b + len : rows};
}

// Visits the thread's rows of its column in increasing order, kUnroll loads in flight:
// fn(value of row r) for r = begin + lane, begin + lane + 8, ...
template <class T, class Fn>
__device__ __forceinline__ void walk_column(const T* __restrict__ x, int64_t c, int64_t ch, const RowRange& r, Fn&& fn) {
  int64_t row = r.begin + threadIdx.y;
  for (; row + (kUnroll - 1) * kLanes < r.end; row += kUnroll * kLanes) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = to_f(x[(row + u * kLanes) * c + ch]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fn(v[u], row + u * kLanes);
  }
  for (; row < r.end; row += kLanes) fn(to_f(x[row * c + ch]), row);
}

template <class T>
__global__ void __launch_bounds__(kCols* kLanes) nhwc_moments_kernel(const T* __restrict__ x, int64_t rows, int64_t c,
                                                                     int64_t parts, float* __restrict__ partial) {
  const int64_t ch = int64_t(blockIdx.y) * kCols + threadIdx.x;
  float n = 0.f, shift = 0.f, s1 = 0.f, s2 = 0.f;
  if (ch < c)
    walk_column(x, c, ch, rows_of_part(rows, parts), [&](float a, int64_t) {
      if (n == 0.f) shift = a;
      const float d = a - shift;
      n += 1.f;
      s1 += d;
      s2 += d * d;
    });
  __shared__ Moments lane[kLanes][kCols];
  Moments m{0.f, 0.f, 0.f};
  if (n > 0.f) {
    const float m2 = s2 - s1 * (s1 / n);
    m = {n, shift + s1 / n, m2 > 0.f ? m2 : 0.f};
  }
  lane[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y != 0 || ch >= c) return;
  Moments t = lane[0][threadIdx.x];
#pragma unroll
  for (int k = 1; k < kLanes; ++k) t = merge(t, lane[k][threadIdx.x]);
  float* p = partial + 3 * (ch * parts + blockIdx.x);
  p[0] = t.n, p[1] = t.mean, p[2] = t.m2;
}

// One warp per channel: lane l merges partials l, l+32, l+64, ... in order, then the 32 lane
// results merge by a fixed xor-shuffle tree (the same tree on any GPU). Lane 0 writes the saved
// statistics, the running-stat update (unbiased variance, as kernels/batchnorm.cu's finalize) and
// the per-channel affine of the normalize pass: y = x * scale + shift.
constexpr int kFinalWarps = 8;
__device__ __forceinline__ Moments shfl_merge(Moments t) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Moments o{__shfl_xor_sync(0xffffffffu, t.n, off), __shfl_xor_sync(0xffffffffu, t.mean, off),
                    __shfl_xor_sync(0xffffffffu, t.m2, off)};
    // The lower lane's moments first, so both lanes of a pair compute the same merge.
    t = (threadIdx.x & off) ? merge(o, t) : merge(t, o);
  }
  return t;
}
__device__ __forceinline__ float shfl_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = (threadIdx.x & off) ? o + v : v + o;
  }
  return v;
}

__global__ void nhwc_moments_finalize_kernel(const float* __restrict__ partial, int64_t c, int64_t parts, float m,
                                             float momentum, float eps, const float* __restrict__ gamma,
                                             const float* __restrict__ beta, float* __restrict__ mean,
                                             float* __restrict__ invstd, float* __restrict__ running_mean,
                                             float* __restrict__ running_var, float* __restrict__ coef) {
  const int64_t ch = int64_t(blockIdx.x) * kFinalWarps + threadIdx.y;
  if (ch >= c) return;  // a whole warp leaves together
  const float* p = partial + 3 * ch * parts;
  Moments t{0.f, 0.f, 0.f};
  for (int64_t k = threadIdx.x; k < parts; k += 32) t = merge(t, Moments{p[3 * k], p[3 * k + 1], p[3 * k + 2]});
  t = shfl_merge(t);
  if (threadIdx.x != 0) return;
  const float is = 1.f / sqrtf(t.m2 / m + eps);
  mean[ch] = t.mean;
  invstd[ch] = is;
  running_mean[ch] = (1.f - momentum) * running_mean[ch] + momentum * t.mean;
  running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * (t.m2 / (m - 1.f));
  const float sc = is * gamma[ch];
  coef[ch] = sc;
  coef[c + ch] = beta[ch] - t.mean * sc;
}

// Inference: the running statistics, and the same affine.
__global__ void nhwc_running_affine_kernel(const float* __restrict__ mean, const float* __restrict__ invstd,
                                           const float* __restrict__ gamma, const float* __restrict__ beta, int64_t c,
                                           float* __restrict__ coef) {
  DITTO_GRID_STRIDE(ch, c) {
    const float sc = invstd[ch] * gamma[ch];
    coef[ch] = sc;
    coef[c + ch] = beta[ch] - mean[ch] * sc;
  }
}

// y = x * scale + shift per channel (coef: C scales, then C shifts), one rounding.
struct Affine {
  const float* coef;
  int64_t c;
  __device__ __forceinline__ float operator()(float v, int64_t ch) const { return fmaf(v, coef[ch], coef[c + ch]); }
};

template <class T, bool kAtomic>
__global__ void __launch_bounds__(kCols* kLanes) nhwc_bwd_reduce_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                                                        const float* __restrict__ mean,
                                                                        const float* __restrict__ invstd, int64_t rows,
                                                                        int64_t c, int64_t parts, float* __restrict__ out_dy,
                                                                        float* __restrict__ out_dyx) {
  const int64_t ch = int64_t(blockIdx.y) * kCols + threadIdx.x;
  float sdy = 0.f, sdyx = 0.f;
  if (ch < c) {
    const float mu = mean[ch];
    const RowRange r = rows_of_part(rows, parts);
    int64_t row = r.begin + threadIdx.y;
    for (; row + (kUnroll - 1) * kLanes < r.end; row += kUnroll * kLanes) {
      float a[kUnroll], g[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t o = (row + u * kLanes) * c + ch;
        a[u] = to_f(x[o]);
        g[u] = to_f(dy[o]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        sdy += g[u];
        sdyx += g[u] * (a[u] - mu);
      }
    }
    for (; row < r.end; row += kLanes) {
      const float a = to_f(x[row * c + ch]), g = to_f(dy[row * c + ch]);
      sdy += g;
      sdyx += g * (a - mu);
    }
  }
  const float a = column_sum<kLanes>(sdy), b = column_sum<kLanes>(sdyx);
  if (threadIdx.y != 0 || ch >= c) return;
  if (kAtomic) {
    atomicAdd(out_dy + ch, a);
    atomicAdd(out_dyx + ch, b * invstd[ch]);
  } else {
    out_dy[ch * parts + blockIdx.x] = a;
    out_dyx[ch * parts + blockIdx.x] = b;
  }
}

// One warp per channel, lane-strided sums of the partials in order, then the shuffle tree.
__global__ void nhwc_bwd_finalize_kernel(const float* __restrict__ pdy, const float* __restrict__ pdyx, int64_t c,
                                         int64_t parts, const float* __restrict__ invstd, float* __restrict__ dbeta,
                                         float* __restrict__ dgamma) {
  const int64_t ch = int64_t(blockIdx.x) * kFinalWarps + threadIdx.y;
  if (ch >= c) return;
  float a = 0.f, b = 0.f;
  for (int64_t k = threadIdx.x; k < parts; k += 32) {
    a += pdy[ch * parts + k];
    b += pdyx[ch * parts + k];
  }
  a = shfl_sum(a);
  b = shfl_sum(b);
  if (threadIdx.x != 0) return;
  dbeta[ch] = a;
  dgamma[ch] = b * invstd[ch];
}

// dx = A dy + B x + C per channel (training; inference: B = C = 0), from the reduced sums:
// dx = g (dy - dbeta/m - (x - mean) invstd dgamma/m) with g = gamma invstd.
__global__ void nhwc_dx_coef_kernel(const float* __restrict__ mean, const float* __restrict__ invstd,
                                    const float* __restrict__ gamma, const float* __restrict__ dgamma,
                                    const float* __restrict__ dbeta, bool training, float m, int64_t c,
                                    float* __restrict__ coef) {
  DITTO_GRID_STRIDE(ch, c) {
    const float is = invstd[ch], g = gamma[ch] * is;
    float b = 0.f, k = 0.f;
    if (training) {
      const float mg = dgamma[ch] / m, mb = dbeta[ch] / m;
      b = -g * is * mg;
      k = g * (is * mg * mean[ch] - mb);
    }
    coef[ch] = g;
    coef[c + ch] = b;
    coef[2 * c + ch] = k;
  }
}

template <class T, int V>
__global__ void nhwc_bwd_dx_kernel(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ coef,
                                   bool training, T* __restrict__ dx, int64_t vectors, int64_t c) {
  DITTO_GRID_STRIDE(i, vectors) {
    const int64_t c0 = (i * V) % c;
    const Pack<T, V> pg = reinterpret_cast<const Pack<T, V>*>(dy)[i];
    Pack<T, V> out;
    if (training) {
      const Pack<T, V> px = reinterpret_cast<const Pack<T, V>*>(x)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int64_t ch = c0 + k;
        out.v[k] = from_f<T>(fmaf(coef[ch], to_f(pg.v[k]), fmaf(coef[c + ch], to_f(px.v[k]), coef[2 * c + ch])));
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_f<T>(coef[c0 + k] * to_f(pg.v[k]));
    }
    reinterpret_cast<Pack<T, V>*>(dx)[i] = out;
  }
}

dim3 nhwc_grid(const BnDims& d, int64_t parts) {
  return dim3(static_cast<unsigned>(parts), static_cast<unsigned>((d.c + kCols - 1) / kCols));
}
unsigned channel_blocks(int64_t c) { return static_cast<unsigned>((c + kThreads - 1) / kThreads); }


template <class T, class Launch>
void vector_launch(int64_t c, int64_t total, Launch&& launch) {
  constexpr int V = 16 / sizeof(T);
  if (c % V == 0) launch(std::integral_constant<int, V>{}, total / V);
  else launch(std::integral_constant<int, 1>{}, total);
}

}  // namespace

// The partials (3 per channel and part), then 3 C floats of per-channel coefficients.
int64_t bn_nhwc_scratch_floats(const BnDims& d) { return 3 * d.c * nhwc_parts(d.m()) + 3 * d.c; }
namespace {
float* coef_of(float* scratch, const BnDims& d) { return scratch + 3 * d.c * nhwc_parts(d.m()); }
unsigned final_blocks(int64_t c) { return static_cast<unsigned>((c + kFinalWarps - 1) / kFinalWarps); }
}  // namespace

void bn_nhwc_batch_stats(Context& ctx, DType t, const void* x, const BnDims& d, float momentum, float eps,
                         const float* gamma, const float* beta, float* saved_mean, float* saved_invstd,
                         float* running_mean, float* running_var, float* scratch) {
  if (d.c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = nhwc_parts(d.m());
  with_float_type(t, [&](auto tag) {
    using T = decltype(tag);
    nhwc_moments_kernel<T><<<nhwc_grid(d, parts), dim3(kCols, kLanes), 0, s>>>(static_cast<const T*>(x), d.m(), d.c,
                                                                             parts, scratch);
  });
  DITTO_CHECK_LAUNCH(ctx);
  nhwc_moments_finalize_kernel<<<final_blocks(d.c), dim3(32, kFinalWarps), 0, s>>>(
      scratch, d.c, parts, float(d.m()), momentum, eps, gamma, beta, saved_mean, saved_invstd, running_mean,
      running_var, coef_of(scratch, d));
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_nhwc_running_affine(Context& ctx, const float* mean, const float* invstd, const float* gamma,
                            const float* beta, const BnDims& d, float* scratch) {
  if (d.c == 0) return;
  nhwc_running_affine_kernel<<<channel_blocks(d.c), kThreads, 0, detail::stream_of(ctx)>>>(mean, invstd, gamma, beta,
                                                                                          d.c, coef_of(scratch, d));
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_nhwc_apply(Context& ctx, DType t, const void* x, void* y, const BnDims& d, const float* scratch) {
  const int64_t total = d.n * d.c * d.hw;
  if (total == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const float* coef = coef_of(const_cast<float*>(scratch), d);
  with_float_type(t, [&](auto tag) { launch_channel_map<decltype(tag)>(s, x, y, total, d.c, Affine{coef, d.c}); });
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_nhwc_bwd_reduce(Context& ctx, DType t, const void* x, const void* dy, const float* mean, const float* invstd,
                        const BnDims& d, bool atomic, float* dgamma, float* dbeta, float* scratch) {
  if (d.c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = nhwc_parts(d.m());
  const dim3 grid = nhwc_grid(d, parts), block(kCols, kLanes);
  if (atomic) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(dbeta, 0, sizeof(float) * d.c, s));
    DITTO_CUDA_CHECK(cudaMemsetAsync(dgamma, 0, sizeof(float) * d.c, s));
  }
  with_float_type(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    const T* gp = static_cast<const T*>(dy);
    if (atomic)
      nhwc_bwd_reduce_kernel<T, true><<<grid, block, 0, s>>>(xp, gp, mean, invstd, d.m(), d.c, parts, dbeta, dgamma);
    else
      nhwc_bwd_reduce_kernel<T, false><<<grid, block, 0, s>>>(xp, gp, mean, invstd, d.m(), d.c, parts, scratch,
                                                              scratch + d.c * parts);
  });
  DITTO_CHECK_LAUNCH(ctx);
  if (!atomic) {
    nhwc_bwd_finalize_kernel<<<final_blocks(d.c), dim3(32, kFinalWarps), 0, s>>>(scratch, scratch + d.c * parts, d.c,
                                                                                 parts, invstd, dbeta, dgamma);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

void bn_nhwc_bwd_dx(Context& ctx, DType t, const void* x, const void* dy, const float* mean, const float* invstd,
                    const float* gamma, const float* dgamma, const float* dbeta, bool training, void* dx,
                    const BnDims& d, float* scratch) {
  const int64_t total = d.n * d.c * d.hw;
  if (total == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  float* coef = coef_of(scratch, d);
  nhwc_dx_coef_kernel<<<channel_blocks(d.c), kThreads, 0, s>>>(mean, invstd, gamma, dgamma, dbeta, training,
                                                               float(d.m()), d.c, coef);
  DITTO_CHECK_LAUNCH(ctx);
  with_float_type(t, [&](auto tag) {
    using T = decltype(tag);
    vector_launch<T>(d.c, total, [&](auto v, int64_t vectors) {
      nhwc_bwd_dx_kernel<T, decltype(v)::value><<<blocks_for(vectors), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(dy), coef, training, static_cast<T*>(dx), vectors, d.c);
    });
  });
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
