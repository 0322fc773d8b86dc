// ditto's own convolution kernels (see kernels/detail/conv2d_own.h for the variants and why each
// is deterministic).
//
// conv_fwd_direct: the fixed-order GEMM of kernels/detail/fixed_gemm.cuh over an implicit im2col
// (rows: output positions n*Ho*Wo + p, columns: the group's output channels, reduction: c*r*s in
// ascending order), one launch per convolution group. Batch-invariant.
// im2col_kernel / dy_rearrange_kernel: copies, one writer per output element: deterministic.
// col2im_gather_kernel: one thread per dX element adds its (r, s) taps in r-major order.
// fold_kernel: one thread per element adds `count` partial arrays left to right onto acc.
// dw_bwd_data_kernel: one thread per dX element adds (multiplier, r, s) taps in that order.
// dw_bwd_filter_kernel: grid (K, parts); each thread sums its positions in increasing order, then
// cub::BlockReduce (fixed tree, kernels/detail/reduce.cuh) per tap; the parts are folded in part
// order. Grid and part count depend on the shape alone.
// The GEMMs are cuBLAS's (atomics mode off, FMA or TF32 compute as the layer's math says).
#include <cublas_v2.h>

#include <climits>
#include <cstdint>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/conv2d_own.h"
#include "kernels/detail/cublas_modes.h"
#include "kernels/detail/fixed_gemm.cuh"
#include "kernels/detail/reduce.cuh"

namespace ditto::cuda {
namespace {

using own::ConvGeom;

inline bool fits32(int64_t n) { return n < int64_t(INT_MAX); }

// Blocks of (tx, ty) threads: ty rows of a row-major array side by side, tx threads along each row
// (tx a power of two up to 256, about the row's length in work items), so short rows do not leave
// most of a block idle.
struct RowGrid {
  dim3 grid, block;
};
RowGrid row_grid(int64_t rows, int64_t items_per_row) {
  unsigned tx = 32;
  while (tx < unsigned(kThreads) && int64_t(tx) < items_per_row) tx *= 2;
  const unsigned ty = unsigned(kThreads) / tx;
  const int64_t gx = (items_per_row + tx - 1) / tx, gy = (rows + ty - 1) / ty;
  return {dim3(unsigned(gx < 65535 ? gx : 65535), unsigned(gy < 65535 ? gy : 65535)), dim3(tx, ty)};
}

// im2col: cols is [item][crs][b*HoWo + pos]. One row of cols (an item's input channel c and tap
// (r, s)) per thread row: its channel, tap offsets and image base are worked out once; each thread
// fills V consecutive positions, the first one's (image, ho, wo) by division and the others by
// stepping, and stores them as one float4 where V is 4. A copy: deterministic.
template <class I, int V>
__global__ void im2col_kernel(ConvGeom g, const float* __restrict__ x, float* __restrict__ cols, I n0, I images, I grp,
                              I rows, I row_len) {
  const I Wo = I(g.Wo), Ho = I(g.Ho), howo = Ho * Wo, crsg = I(g.CRSg());
  const I H = I(g.H), W = I(g.W), sh = I(g.sh), sw = I(g.sw), image = I(g.C) * H * W;
  const I vecs = (row_len + V - 1) / V;
  for (I row = blockIdx.y * I(blockDim.y) + threadIdx.y; row < rows; row += I(gridDim.y) * I(blockDim.y)) {
    const I item = row / crsg;
    const own::Im2colRow<I> tap = own::im2col_row<I>(g, grp, row - item * crsg);
    const float* xc = x + (n0 + item * images) * image + tap.c * H * W;
    float* out = cols + row * row_len;
    for (I v = blockIdx.x * I(blockDim.x) + threadIdx.x; v < vecs; v += I(gridDim.x) * I(blockDim.x)) {
      const I j0 = v * V;
      I b = j0 / howo, pos = j0 - b * howo;
      I ho = pos / Wo, wo = pos - ho * Wo;
      float val[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const I h = ho * sh + tap.hoff, w = wo * sw + tap.woff;
        val[k] = j0 + k < row_len && h >= 0 && h < H && w >= 0 && w < W ? __ldg(xc + b * image + h * W + w) : 0.f;
        if (++wo == Wo) {
          wo = 0;
          if (++ho == Ho) ho = 0, ++b;
        }
      }
      if constexpr (V == 4) {
        *reinterpret_cast<float4*>(out + j0) = make_float4(val[0], val[1], val[2], val[3]);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (j0 + k < row_len) out[j0 + k] = val[k];
      }
    }
  }
}

// dY rearranged to [item][k][b*HoWo + pos]: one row (an item's output channel k) per thread row,
// V consecutive positions per thread, the first one's image by division and the others by
// stepping. A copy: deterministic.
template <class I, int V>
__global__ void dy_rearrange_kernel(ConvGeom g, const float* __restrict__ dy, float* __restrict__ out, I n0, I images,
                                    I grp, I rows, I row_len) {
  const I howo = I(g.Ho * g.Wo), kg = I(g.Kg()), image = I(g.K) * howo;
  const I vecs = (row_len + V - 1) / V;
  for (I row = blockIdx.y * I(blockDim.y) + threadIdx.y; row < rows; row += I(gridDim.y) * I(blockDim.y)) {
    const I item = row / kg, k = row - item * kg;
    const float* src = dy + (n0 + item * images) * image + (grp * kg + k) * howo;
    float* dst = out + row * row_len;
    for (I v = blockIdx.x * I(blockDim.x) + threadIdx.x; v < vecs; v += I(gridDim.x) * I(blockDim.x)) {
      const I j0 = v * V;
      I b = j0 / howo, pos = j0 - b * howo;
#pragma unroll
      for (int q = 0; q < V; ++q) {
        if (j0 + q < row_len) dst[j0 + q] = __ldg(src + b * image + pos);
        if (++pos == howo) pos = 0, ++b;
      }
    }
  }
}

// col2im: one dX plane (an image and a channel of the group) per thread row, one pixel per thread:
// the plane's bases are worked out once; the pixel adds its (r, s) taps in r-major order, from
// 0.0f. With unit strides a tap's output position needs no division (tap_target's UnitStride).
template <class I, bool UnitStride>
__global__ void col2im_gather_kernel(ConvGeom g, const float* __restrict__ cols, float* __restrict__ dx, I n0,
                                     I images, I grp, I planes) {
  const I H = I(g.H), W = I(g.W), hw = H * W, cg = I(g.Cg()), R = I(g.R), S = I(g.S);
  const I howo = I(g.Ho * g.Wo), per_row = images * howo;
  for (I pl = blockIdx.y * I(blockDim.y) + threadIdx.y; pl < planes; pl += I(gridDim.y) * I(blockDim.y)) {
    const I nl = pl / cg, c = pl - nl * cg;
    const I item = nl / images, b = nl - item * images;
    const float* base = cols + (item * cg + c) * R * S * per_row + b * howo;
    float* out = dx + ((n0 + nl) * I(g.C) + grp * cg + c) * hw;
    for (I p = blockIdx.x * I(blockDim.x) + threadIdx.x; p < hw; p += I(gridDim.x) * I(blockDim.x)) {
      const I h = p / W, w = p - h * W;
      float acc = 0.f;
      for (I r = 0; r < R; ++r)
        for (I s = 0; s < S; ++s) {
          const I pos = own::tap_target<I, UnitStride>(g, h, w, r, s);
          if (pos >= 0) acc += __ldg(base + (r * S + s) * per_row + pos);
        }
      out[p] = acc;
    }
  }
}

__global__ void fold_kernel(float* __restrict__ acc, const float* __restrict__ parts, int64_t count, int64_t elems,
                            bool first) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < elems; i += int64_t(gridDim.x) * blockDim.x) {
    float v = first ? 0.f : acc[i];
#pragma unroll 8
    for (int64_t p = 0; p < count; ++p) v += __ldg(parts + p * elems + i);
    acc[i] = v;
  }
}

// Implicit-GEMM weight gradient: block (crs tile, k tile, part * G + group) accumulates
// dW[k][crs] over the part's positions (n, ho, wo) in stages of 32: the stage's dY values and
// input taps go to shared memory (each thread loads 8 of each, threads along positions so the
// loads coalesce), then thread (ty, tx) adds the 32 positions' products into its 4x4 weights
// (k = ty*4.., crs = tx*4..) in position order. Each weight of the tile has one owner, so the
// part's sum needs no reduction across threads; the parts are folded afterwards in part order.
// One function of about 80 lines on purpose: the stage loop's loads, barrier and register tile
// share the shared-memory arrays and the 4x4 accumulators, which helpers would have to pass by
// reference through every call; it reads top to bottom as load stage, sync, multiply, sync.
template <class I>
__global__ void __launch_bounds__(kThreads) implicit_wgrad_kernel(ConvGeom g, const float* __restrict__ x,
                                                                  const float* __restrict__ dy,
                                                                  float* __restrict__ parts, I part_len, I nparts) {
  constexpr int T = int(own::kImplicitTile), ST = int(own::kImplicitStage);
  __shared__ __align__(16) float dys[ST][T + 4];
  __shared__ __align__(16) float xs[ST][T + 4];
  __shared__ I pos_n[ST], pos_rem[ST], pos_h[ST], pos_w[ST];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int lane = tid % ST, row0 = tid / ST;  // loads: position lane, rows row0 + 8i
  const I kg = I(g.Kg()), crsg = I(g.CRSg()), cg = I(g.Cg()), howo = I(g.Ho * g.Wo), wo_n = I(g.Wo);
  const I R = I(g.R), S = I(g.S), H = I(g.H), W = I(g.W);
  const I part = I(blockIdx.z) % nparts, grp = I(blockIdx.z) / nparts;
  const I k0 = I(blockIdx.y) * T, crs0 = I(blockIdx.x) * T;
  const I begin = part * part_len, total = I(g.N) * howo;
  const I end = begin + part_len < total ? begin + part_len : total;
  // This thread's 8 load rows: (c, r, s) of its input taps, and its dY channels.
  I tap_c[8], tap_r[8], tap_s[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const I crs = crs0 + row0 + 8 * i;
    if (crs < crsg) {
      tap_c[i] = crs / (R * S);
      const I rs = crs - tap_c[i] * R * S;
      tap_r[i] = rs / S;
      tap_s[i] = rs - tap_r[i] * S;
    } else {
      tap_c[i] = -1, tap_r[i] = 0, tap_s[i] = 0;
    }
  }
  float acc[4][4] = {};
  for (I base = begin; base < end; base += ST) {
    if (tid < ST) {
      const I p = base + tid;
      if (p < end) {
        const I n = p / howo, rem = p - n * howo, ho = rem / wo_n, wo = rem - ho * wo_n;
        pos_n[tid] = n, pos_rem[tid] = rem, pos_h[tid] = ho * I(g.sh) - I(g.ph), pos_w[tid] = wo * I(g.sw) - I(g.pw);
      } else {
        pos_n[tid] = -1;
      }
    }
    __syncthreads();
    const I n = pos_n[lane];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = row0 + 8 * i;
      const I k = k0 + row;
      float d = 0.f, v = 0.f;
      if (n >= 0) {
        if (k < kg) d = __ldg(dy + ((n * I(g.K) + grp * kg + k) * howo + pos_rem[lane]));
        if (tap_c[i] >= 0) {
          const I h = pos_h[lane] + tap_r[i] * I(g.dh), w = pos_w[lane] + tap_s[i] * I(g.dw);
          if (h >= 0 && h < H && w >= 0 && w < W) v = __ldg(x + (((n * I(g.C) + grp * cg + tap_c[i]) * H + h) * W + w));
        }
      }
      dys[lane][row] = d;
      xs[lane][row] = v;
    }
    __syncthreads();
#pragma unroll 8
    for (int q = 0; q < ST; ++q) {
      const float4 a = *reinterpret_cast<const float4*>(&dys[q][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&xs[q][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
  float* out = parts + I(part) * I(g.K) * crsg;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const I k = k0 + ty * 4 + i;
    if (k >= kg) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const I crs = crs0 + tx * 4 + j;
      if (crs < crsg) out[(grp * kg + k) * crsg + crs] = acc[i][j];
    }
  }
}

template <class I>
__global__ void dw_bwd_data_kernel(ConvGeom g, const float* __restrict__ w, const float* __restrict__ dy,
                                   float* __restrict__ dx, I total) {
  const I H = I(g.H), W = I(g.W), C = I(g.C), R = I(g.R), S = I(g.S), mult = I(g.Kg()), howo = I(g.Ho * g.Wo);
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    I t = i;
    const I x = t % W;
    t /= W;
    const I h = t % H;
    t /= H;
    const I c = t % C;
    const I n = t / C;
    float acc = 0.f;
    for (I m = 0; m < mult; ++m) {
      const I k = c * mult + m;
      const float* dyk = dy + (n * C * mult + k) * howo;
      const float* wk = w + k * R * S;
      for (I r = 0; r < R; ++r)
        for (I s = 0; s < S; ++s) {
          const I pos = own::tap_target<I>(g, h, x, r, s);
          if (pos >= 0) acc += __ldg(wk + r * S + s) * __ldg(dyk + pos);
        }
    }
    dx[i] = acc;
  }
}

// KR x KS taps known at compile time keep the accumulators in registers; KR = 0 takes R, S at run
// time with up to 49 taps (local memory).
template <int KR, int KS, class I>
__global__ void __launch_bounds__(kThreads) dw_bwd_filter_kernel(ConvGeom g, const float* __restrict__ x,
                                                                 const float* __restrict__ dy,
                                                                 float* __restrict__ parts, I nparts) {
  constexpr int kTaps = KR > 0 ? KR * KS : 49;
  const I R = KR > 0 ? I(KR) : I(g.R), S = KR > 0 ? I(KS) : I(g.S);
  const I k = blockIdx.x, p = blockIdx.y, K = I(g.K), N = I(g.N);
  const I c = k / I(g.Kg()), H = I(g.H), W = I(g.W), Wo = I(g.Wo), howo = I(g.Ho * g.Wo);
  const I n_lo = p * N / nparts, n_hi = (p + 1) * N / nparts;
  float acc[kTaps];
#pragma unroll
  for (int t = 0; t < kTaps; ++t) acc[t] = 0.f;
  const I count = (n_hi - n_lo) * howo;
  for (I j = threadIdx.x; j < count; j += kThreads) {
    const I nl = j / howo, pos = j - nl * howo, n = n_lo + nl;
    const I ho = pos / Wo, wo = pos - ho * Wo;
    const float d = __ldg(dy + (n * K + k) * howo + pos);
    const float* xc = x + (n * I(g.C) + c) * H * W;
    const I h0 = ho * I(g.sh) - I(g.ph), w0 = wo * I(g.sw) - I(g.pw);
#pragma unroll
    for (int r = 0; r < (KR > 0 ? KR : 7); ++r) {
      if (KR == 0 && r >= R) break;
      const I h = h0 + I(r) * I(g.dh);
#pragma unroll
      for (int s = 0; s < (KS > 0 ? KS : 7); ++s) {
        if (KS == 0 && s >= S) break;
        const I w = w0 + I(s) * I(g.dw);
        if (h >= 0 && h < H && w >= 0 && w < W) acc[r * (KS > 0 ? KS : S) + s] += d * __ldg(xc + h * W + w);
      }
    }
  }
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  const I taps = R * S;
  for (int t = 0; t < kTaps; ++t) {
    if (t >= taps) break;
    const float v = BlockSum<kThreads>(tmp).Sum(acc[t]);
    if (threadIdx.x == 0) parts[(p * K + k) * taps + t] = v;
    __syncthreads();  // tmp is reused by the next tap's reduction
  }
}

template <class I, class Kernel, class... Args>
void launch_flat(Context& ctx, Kernel kernel, int64_t total, Args... args) {
  if (total == 0) return;
  kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(args..., I(total));
  DITTO_CHECK_LAUNCH(ctx);
}

template <class I>
void im2col(Context& ctx, const ConvGeom& g, const float* x, float* cols, int64_t n0, int64_t images, int64_t grp,
            int64_t rows, int64_t row_len) {
  if (rows == 0 || row_len == 0) return;
  const bool v4 = row_len % 4 == 0 && reinterpret_cast<std::uintptr_t>(cols) % 16 == 0;
  const RowGrid rg = row_grid(rows, v4 ? row_len / 4 : row_len);
  cudaStream_t st = detail::stream_of(ctx);
  if (v4)
    im2col_kernel<I, 4><<<rg.grid, rg.block, 0, st>>>(g, x, cols, I(n0), I(images), I(grp), I(rows), I(row_len));
  else
    im2col_kernel<I, 1><<<rg.grid, rg.block, 0, st>>>(g, x, cols, I(n0), I(images), I(grp), I(rows), I(row_len));
  DITTO_CHECK_LAUNCH(ctx);
}

template <class I>
void dy_rearrange(Context& ctx, const ConvGeom& g, const float* dy, float* out, int64_t n0, int64_t images, int64_t grp,
                  int64_t rows, int64_t row_len) {
  if (rows == 0 || row_len == 0) return;
  constexpr int V = 4;
  const RowGrid rg = row_grid(rows, (row_len + V - 1) / V);
  dy_rearrange_kernel<I, V><<<rg.grid, rg.block, 0, detail::stream_of(ctx)>>>(g, dy, out, I(n0), I(images), I(grp),
                                                                                I(rows), I(row_len));
  DITTO_CHECK_LAUNCH(ctx);
}

template <class I>
void col2im(Context& ctx, const ConvGeom& g, const float* cols, float* dx, int64_t n0, int64_t images, int64_t grp,
            int64_t planes) {
  if (planes == 0 || g.HW() == 0) return;
  const RowGrid rg = row_grid(planes, g.HW());
  cudaStream_t st = detail::stream_of(ctx);
  if (g.sh == 1 && g.sw == 1)
    col2im_gather_kernel<I, true><<<rg.grid, rg.block, 0, st>>>(g, cols, dx, I(n0), I(images), I(grp), I(planes));
  else
    col2im_gather_kernel<I, false><<<rg.grid, rg.block, 0, st>>>(g, cols, dx, I(n0), I(images), I(grp), I(planes));
  DITTO_CHECK_LAUNCH(ctx);
}

void fold(Context& ctx, float* acc, const float* parts, int64_t count, int64_t elems, bool first) {
  fold_kernel<<<blocks_for(elems), kThreads, 0, detail::stream_of(ctx)>>>(acc, parts, count, elems, first);
  DITTO_CHECK_LAUNCH(ctx);
}

// One strided-batched GEMM in cuBLAS's column-major terms.
struct Gemm {
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  const float* a;
  int64_t lda, stride_a;
  const float* b;
  int64_t ldb, stride_b;
  float* c;
  int64_t ldc, stride_c;
  int64_t batch;
};

void run_gemm(Context& ctx, const Gemm& q, bool tf32) {
  const float one = 1.f, zero = 0.f;
  DITTO_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      detail::cuda_state(ctx).cublas, q.ta, q.tb, int(q.m), int(q.n), int(q.k), &one, q.a, CUDA_R_32F, int(q.lda), q.stride_a, q.b,
      CUDA_R_32F, int(q.ldb), q.stride_b, &zero, q.c, CUDA_R_32F, int(q.ldc), q.stride_c, int(q.batch),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Calls fn(n0, items, images) for every run of items: full items in chunks of the plan's size,
// then the remainder images (N % images_per_item) as one item of their own.
template <class Fn>
void each_chunk(const ConvGeom& g, const own::GemmPlan& p, Fn&& fn) {
  const int64_t b = p.images_per_item, full = g.N / b, rem = g.N % b;
  for (int64_t i = 0; i < full; i += p.items_per_chunk) fn(i * b, std::min(p.items_per_chunk, full - i), b);
  if (rem) fn(full * b, int64_t(1), rem);
}

// The implicit GEMM of the forward pass: A(i, l) = the im2col value of position i (image n = i /
// HoWo) at tap l = (c, r, s) of group grp, B(l, j) = w[grp*Kg + j][l], C(i, j) = y[n][grp*Kg + j][p].
template <class I>
struct Im2colRows {
  ConvGeom g;
  const float* x;
  I grp;
  __device__ float operator()(I i, I l) const {
    const I howo = I(g.Ho) * I(g.Wo), n = i / howo;
    const I src = own::im2col_source<I>(g, n, grp, l, i - n * howo);
    return src < 0 ? 0.f : __ldg(x + src);
  }
};
template <class I>
struct FilterColumns {
  const float* w;
  I crs, k0;
  __device__ float operator()(I l, I j) const { return __ldg(w + (k0 + j) * crs + l); }
};
template <class I>
struct OutputStore {
  float* y;
  I howo, K, k0;
  __device__ void operator()(I i, I j, float v) const {
    const I n = i / howo;
    y[(n * K + k0 + j) * howo + (i - n * howo)] = v;
  }
};

template <class I>
void conv_fwd_direct_as(Context& ctx, const ConvGeom& g, const float* x, const float* w, float* y) {
  const I howo = I(g.HoWo()), positions = I(g.N) * howo, kg = I(g.Kg()), crs = I(g.CRSg());
  for (int64_t grp = 0; grp < g.G; ++grp) {
    const I k0 = I(grp) * kg;
    fixed_gemm::kernel<true, true, I><<<fixed_gemm::grid(positions, kg), fixed_gemm::kThreads, 0, detail::stream_of(ctx)>>>(
        positions, kg, crs, Im2colRows<I>{g, x, I(grp)}, FilterColumns<I>{w, crs, k0}, OutputStore<I>{y, howo, I(g.K), k0});
    DITTO_CHECK_LAUNCH(ctx);
  }
}

// ---- ditto-winograd bwd_filter (kernels/detail/conv2d_own.h) ---------------------------------------

// One thread per (part of the chunk, channel c, position q of the part): the 4x4 window of x around
// tile q's dY tile, transformed, written to v[e][part][c][q] (consecutive threads: consecutive q).
__global__ void winograd_input_kernel(ConvGeom g, own::WinogradPlan p, const float* __restrict__ x, int64_t part0,
                                      int64_t parts, float* __restrict__ v) {
  const int64_t P = p.part_positions(), T = p.tiles(), total = parts * g.C * P;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = i % P, c = (i / P) % g.C, pl = i / (P * g.C);
    const int64_t n = (part0 + pl) * p.images_per_part + q / T, t = q % T;
    const int64_t h0 = 2 * (t / p.tiles_w) - g.ph, w0 = 2 * (t % p.tiles_w) - g.pw;
    float d[16], e[16];
    own::winograd_window(n < g.N ? x + (n * g.C + c) * g.H * g.W : nullptr, h0, w0, g.H, g.W, d);
    own::winograd_input_tile(d, e);
#pragma unroll
    for (int k = 0; k < 16; ++k) v[((k * parts + pl) * g.C + c) * P + q] = e[k];
  }
}

// One thread per (part of the chunk, channel k, position q): tile q of dY[k] (zero past dY's edge or a
// padding image), transformed, written to u[e][part][k][q].
__global__ void winograd_grad_kernel(ConvGeom g, own::WinogradPlan p, const float* __restrict__ dy, int64_t part0,
                                     int64_t parts, float* __restrict__ u) {
  const int64_t P = p.part_positions(), T = p.tiles(), total = parts * g.K * P;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = i % P, k = (i / P) % g.K, pl = i / (P * g.K);
    const int64_t n = (part0 + pl) * p.images_per_part + q / T, t = q % T;
    const int64_t h0 = 2 * (t / p.tiles_w), w0 = 2 * (t % p.tiles_w);
    float gt[4], e[16];
    const float* dk = dy + (n * g.K + k) * g.Ho * g.Wo;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int64_t h = h0 + a, w = w0 + b;
        gt[a * 2 + b] = n < g.N && h < g.Ho && w < g.Wo ? __ldg(dk + h * g.Wo + w) : 0.f;
      }
    own::winograd_grad_tile(gt, e);
#pragma unroll
    for (int j = 0; j < 16; ++j) u[((j * parts + pl) * g.K + k) * P + q] = e[j];
  }
}

// acc[e][k][c] = (first ? m[e][0] : acc + m[e][0]) + m[e][1] + ... over the chunk's parts, left to right.
__global__ void winograd_fold_kernel(const float* __restrict__ m, int64_t parts, int64_t kc, bool first,
                                     float* __restrict__ acc) {
  const int64_t total = 16 * kc;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / kc, r = i % kc;
    float s = first ? m[(e * parts) * kc + r] : acc[i] + m[(e * parts) * kc + r];
    for (int64_t pl = 1; pl < parts; ++pl) s += m[(e * parts + pl) * kc + r];
    acc[i] = s;
  }
}

// One thread per (k, c): dW[k][c] = At acc[.][k][c] A.
__global__ void winograd_output_kernel(int64_t kc, const float* __restrict__ acc, float* __restrict__ dw) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < kc; i += int64_t(gridDim.x) * blockDim.x) {
    float m[16], y[9];
#pragma unroll
    for (int e = 0; e < 16; ++e) m[e] = acc[e * kc + i];
    own::winograd_output_tile(m, y);
#pragma unroll
    for (int r = 0; r < 9; ++r) dw[i * 9 + r] = y[r];
  }
}

// ---- ditto-winograd fwd and bwd_data: F(2x2, 3x3) (kernels/detail/conv2d_own.h) --------------------

// One thread per (o, i): the filter's transform, u[e][o][i].
__global__ void winograd_conv_filter_kernel(own::WinogradConv c, const float* __restrict__ w, float* __restrict__ u) {
  const int64_t total = c.Co * c.Ci;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < total; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = j / c.Ci, i = j - o * c.Ci;
    float f[9], t[16];
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
      for (int s = 0; s < 3; ++s) f[r * 3 + s] = __ldg(w + c.tap(o, i, r, s));
    own::winograd_filter_tile(f, t);
#pragma unroll
    for (int e = 0; e < 16; ++e) u[e * total + j] = t[e];
  }
}

// One thread per (image of the chunk, input channel i, tile t): the tile's 4x4 window of the input,
// transformed, written to v[e][i][q], q = image * tiles + t (consecutive threads: consecutive q).
template <class I>
__global__ void winograd_conv_input_kernel(own::WinogradConv c, const float* __restrict__ in, I n0, I images,
                                           float* __restrict__ v) {
  const I T = I(c.tiles()), tw = I(c.tiles_w()), Ci = I(c.Ci), H = I(c.H), W = I(c.W), P = images * T;
  const I total = P * Ci;
  for (I j = blockIdx.x * I(blockDim.x) + threadIdx.x; j < total; j += I(gridDim.x) * I(blockDim.x)) {
    const I q = j % P, i = j / P, nl = q / T, t = q - nl * T, th = t / tw;
    const I h0 = 2 * th - I(c.ph), w0 = 2 * (t - th * tw) - I(c.pw);
    float d[16], e[16];
    own::winograd_window(in + ((n0 + nl) * Ci + i) * H * W, h0, w0, H, W, d);
    own::winograd_input_tile(d, e);
#pragma unroll
    for (int k = 0; k < 16; ++k) v[I(k) * total + j] = e[k];
  }
}

// One thread per (image of the chunk, output channel o, tile t): out's 2x2 tile = At m[.][o][q] A.
template <class I>
__global__ void winograd_conv_output_kernel(own::WinogradConv c, const float* __restrict__ m, I n0, I images,
                                            float* __restrict__ out) {
  const I T = I(c.tiles()), tw = I(c.tiles_w()), Co = I(c.Co), Ho = I(c.Ho), Wo = I(c.Wo), P = images * T;
  const I total = P * Co;
  for (I j = blockIdx.x * I(blockDim.x) + threadIdx.x; j < total; j += I(gridDim.x) * I(blockDim.x)) {
    const I q = j % P, o = j / P, nl = q / T, t = q - nl * T, th = t / tw;
    const I h0 = 2 * th, w0 = 2 * (t - th * tw);
    float mm[16], y[4];
#pragma unroll
    for (int e = 0; e < 16; ++e) mm[e] = m[I(e) * total + j];
    own::winograd_result_tile(mm, y);
    float* dst = out + ((n0 + nl) * Co + o) * Ho * Wo;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int b = 0; b < 2; ++b)
        if (h0 + a < Ho && w0 + b < Wo) dst[(h0 + a) * Wo + w0 + b] = y[a * 2 + b];
  }
}

}  // namespace

void conv_fwd_direct(Context& ctx, const ConvGeom& g, const float* x, const float* w, float* y) {
  if (g.N == 0 || g.HoWo() == 0 || g.K == 0) return;
  if (fits32(g.N * g.C * g.HW()) && fits32(g.N * g.K * g.HoWo()) && fits32(g.K * g.CRSg()))
    conv_fwd_direct_as<int32_t>(ctx, g, x, w, y);
  else
    conv_fwd_direct_as<int64_t>(ctx, g, x, w, y);
}

void conv_bwd_filter_gemm(Context& ctx, const ConvGeom& g, const float* x, const float* dy, float* dw, void* ws,
                          bool tf32) {
  const own::GemmPlan p = own::plan_gemm(g, true);
  float* cols = static_cast<float*>(ws);
  float* dyt = cols + p.cols_floats;
  float* partials = dyt + p.dy_floats;
  const bool narrow = fits32(g.N * g.C * g.HW()) && fits32(g.N * g.K * g.HoWo()) && fits32(int64_t(p.cols_floats)) &&
                      fits32(int64_t(p.dy_floats));
  const int64_t kg = g.Kg(), crs = g.CRSg(), howo = g.HoWo();
  detail::CublasModes modes(detail::cuda_state(ctx).cublas, /*allow_atomics=*/false);
  for (int64_t grp = 0; grp < g.G; ++grp) {
    bool first = true;
    each_chunk(g, p, [&](int64_t n0, int64_t items, int64_t images) {
      const int64_t positions = images * howo;
      const bool in_place = g.pointwise() && images == 1;
      Gemm q{CUBLAS_OP_T, CUBLAS_OP_N, crs, kg, positions, nullptr, 0, 0, nullptr, 0, 0, partials, crs, kg * crs,
             items};
      if (in_place) {
        q.a = x + (n0 * g.C + grp * g.Cg()) * g.HW(), q.lda = g.HW(), q.stride_a = g.C * g.HW();
      } else {
        if (narrow) im2col<int32_t>(ctx, g, x, cols, n0, images, grp, items * crs, positions);
        else im2col<int64_t>(ctx, g, x, cols, n0, images, grp, items * crs, positions);
        q.a = cols, q.lda = positions, q.stride_a = crs * positions;
      }
      if (images > 1) {
        if (narrow) dy_rearrange<int32_t>(ctx, g, dy, dyt, n0, images, grp, items * kg, positions);
        else dy_rearrange<int64_t>(ctx, g, dy, dyt, n0, images, grp, items * kg, positions);
        q.b = dyt, q.ldb = positions, q.stride_b = kg * positions;
      } else {
        q.b = dy + (n0 * g.K + grp * kg) * howo, q.ldb = howo, q.stride_b = g.K * howo;
      }
      run_gemm(ctx, q, tf32);
      fold(ctx, dw + grp * kg * crs, partials, items, kg * crs, first);
      first = false;
    });
  }
}

void conv_bwd_data_gemm(Context& ctx, const ConvGeom& g, const float* w, const float* dy, float* dx, void* ws,
                        bool tf32) {
  const own::GemmPlan p = own::plan_gemm(g, false);
  float* cols = static_cast<float*>(ws);
  float* dyt = cols + p.cols_floats;
  const bool narrow = fits32(g.N * g.C * g.HW()) && fits32(g.N * g.K * g.HoWo()) && fits32(int64_t(p.cols_floats)) &&
                      fits32(int64_t(p.dy_floats));
  const int64_t kg = g.Kg(), crs = g.CRSg(), howo = g.HoWo();
  detail::CublasModes modes(detail::cuda_state(ctx).cublas, /*allow_atomics=*/false);
  for (int64_t grp = 0; grp < g.G; ++grp) {
    each_chunk(g, p, [&](int64_t n0, int64_t items, int64_t images) {
      const int64_t positions = images * howo;
      const bool in_place = g.pointwise() && images == 1;
      Gemm q{CUBLAS_OP_N, CUBLAS_OP_T, positions, crs, kg, nullptr, 0, 0, w + grp * kg * crs, crs, 0, nullptr, 0, 0,
             items};
      if (images > 1) {
        if (narrow) dy_rearrange<int32_t>(ctx, g, dy, dyt, n0, images, grp, items * kg, positions);
        else dy_rearrange<int64_t>(ctx, g, dy, dyt, n0, images, grp, items * kg, positions);
        q.a = dyt, q.lda = positions, q.stride_a = kg * positions;
      } else {
        q.a = dy + (n0 * g.K + grp * kg) * howo, q.lda = howo, q.stride_a = g.K * howo;
      }
      if (in_place) {
        q.c = dx + (n0 * g.C + grp * g.Cg()) * g.HW(), q.ldc = g.HW(), q.stride_c = g.C * g.HW();
        run_gemm(ctx, q, tf32);
        return;
      }
      q.c = cols, q.ldc = positions, q.stride_c = crs * positions;
      run_gemm(ctx, q, tf32);
      if (narrow) col2im<int32_t>(ctx, g, cols, dx, n0, images, grp, items * images * g.Cg());
      else col2im<int64_t>(ctx, g, cols, dx, n0, images, grp, items * images * g.Cg());
    });
  }
}

void conv_bwd_data_direct(Context& ctx, const ConvGeom& g, const float* w, const float* dy, float* dx) {
  const int64_t total = g.N * g.C * g.HW();
  if (fits32(total) && fits32(g.N * g.K * g.HoWo()))
    launch_flat<int32_t>(ctx, dw_bwd_data_kernel<int32_t>, total, g, w, dy, dx);
  else
    launch_flat<int64_t>(ctx, dw_bwd_data_kernel<int64_t>, total, g, w, dy, dx);
}

void conv_bwd_filter_direct(Context& ctx, const ConvGeom& g, const float* x, const float* dy, float* dw, void* ws) {
  const int64_t parts = own::direct_filter_parts(g), taps = g.R * g.S;
  float* partials = static_cast<float*>(ws);
  if (!g.depthwise()) {
    const int64_t len = own::implicit_part_length(g), t = own::kImplicitTile;
    const dim3 grid(static_cast<unsigned>((g.CRSg() + t - 1) / t), static_cast<unsigned>((g.Kg() + t - 1) / t),
                    static_cast<unsigned>(parts * g.G));
    if (fits32(g.N * g.C * g.HW()) && fits32(g.N * g.K * g.HoWo()) && fits32(parts * g.K * g.CRSg()))
      implicit_wgrad_kernel<int32_t><<<grid, kThreads, 0, detail::stream_of(ctx)>>>(g, x, dy, partials, int32_t(len),
                                                                                   int32_t(parts));
    else
      implicit_wgrad_kernel<int64_t><<<grid, kThreads, 0, detail::stream_of(ctx)>>>(g, x, dy, partials, len, parts);
    DITTO_CHECK_LAUNCH(ctx);
    fold(ctx, dw, partials, parts, g.K * g.CRSg(), true);
    return;
  }
  const dim3 grid(static_cast<unsigned>(g.K), static_cast<unsigned>(parts));
  cudaStream_t st = detail::stream_of(ctx);
  const bool narrow = fits32(g.N * g.C * g.HW()) && fits32(g.N * g.K * g.HoWo());
  auto launch = [&](auto kernel_narrow, auto kernel_wide) {
    if (narrow) kernel_narrow<<<grid, kThreads, 0, st>>>(g, x, dy, partials, int32_t(parts));
    else kernel_wide<<<grid, kThreads, 0, st>>>(g, x, dy, partials, parts);
  };
  if (g.R == 3 && g.S == 3) launch(dw_bwd_filter_kernel<3, 3, int32_t>, dw_bwd_filter_kernel<3, 3, int64_t>);
  else if (g.R == 5 && g.S == 5) launch(dw_bwd_filter_kernel<5, 5, int32_t>, dw_bwd_filter_kernel<5, 5, int64_t>);
  else if (g.R == 7 && g.S == 7) launch(dw_bwd_filter_kernel<7, 7, int32_t>, dw_bwd_filter_kernel<7, 7, int64_t>);
  else launch(dw_bwd_filter_kernel<0, 0, int32_t>, dw_bwd_filter_kernel<0, 0, int64_t>);
  DITTO_CHECK_LAUNCH(ctx);
  fold(ctx, dw, partials, parts, g.K * taps, true);
}

void conv_bwd_filter_winograd(Context& ctx, const ConvGeom& g, const float* x, const float* dy, float* dw, void* ws,
                              bool tf32) {
  if (g.K == 0 || g.C == 0) return;
  const own::WinogradPlan p = own::plan_winograd(g);
  const int64_t kc = g.K * g.C;
  if (g.N == 0 || g.HoWo() == 0) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * std::size_t(kc * 9), detail::stream_of(ctx)));
    return;
  }
  float* u = static_cast<float*>(ws);
  float* v = u + p.u_floats;
  float* m = v + p.v_floats;
  float* acc = m + p.m_floats;
  const int64_t P = p.part_positions();
  cudaStream_t st = detail::stream_of(ctx);
  detail::CublasModes modes(detail::cuda_state(ctx).cublas, /*allow_atomics=*/false);
  for (int64_t part0 = 0; part0 < p.parts; part0 += p.parts_per_chunk) {
    const int64_t parts = std::min(p.parts_per_chunk, p.parts - part0);
    winograd_input_kernel<<<blocks_for(parts * g.C * P), kThreads, 0, st>>>(g, p, x, part0, parts, v);
    DITTO_CHECK_LAUNCH(ctx);
    winograd_grad_kernel<<<blocks_for(parts * g.K * P), kThreads, 0, st>>>(g, p, dy, part0, parts, u);
    DITTO_CHECK_LAUNCH(ctx);
    // Batch b = e * parts + part: m_b (C x K column-major, i.e. [k][c]) = v_b^T u_b over the part's
    // positions.
    const Gemm q{CUBLAS_OP_T, CUBLAS_OP_N, g.C, g.K, P, v, P, g.C * P, u, P, g.K * P, m, g.C, kc, 16 * parts};
    run_gemm(ctx, q, tf32);
    winograd_fold_kernel<<<blocks_for(16 * kc), kThreads, 0, st>>>(m, parts, kc, part0 == 0, acc);
    DITTO_CHECK_LAUNCH(ctx);
  }
  winograd_output_kernel<<<blocks_for(kc), kThreads, 0, st>>>(kc, acc, dw);
  DITTO_CHECK_LAUNCH(ctx);
}

void conv_winograd(Context& ctx, const ConvGeom& g, bool bwd_data, const float* in, const float* w, float* out,
                   void* ws, bool tf32) {
  const own::WinogradConv c = own::winograd_conv_of(g, bwd_data);
  if (c.N == 0 || c.Co == 0 || c.Ho == 0 || c.Wo == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  if (c.Ci == 0) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * std::size_t(c.N * c.Co * c.Ho * c.Wo), st));
    return;
  }
  const own::WinogradConvPlan p = own::plan_winograd_conv(c);
  float* u = static_cast<float*>(ws);
  float* v = u + p.u_floats;
  float* m = v + p.v_floats;
  winograd_conv_filter_kernel<<<blocks_for(c.Co * c.Ci), kThreads, 0, st>>>(c, w, u);
  DITTO_CHECK_LAUNCH(ctx);
  const bool narrow = fits32(c.N * c.Ci * c.H * c.W) && fits32(c.N * c.Co * c.Ho * c.Wo) &&
                      fits32(16 * std::max(c.Ci, c.Co) * p.images_per_chunk * c.tiles());
  detail::CublasModes modes(detail::cuda_state(ctx).cublas, /*allow_atomics=*/false);
  for (int64_t n0 = 0; n0 < c.N; n0 += p.images_per_chunk) {
    const int64_t images = std::min(p.images_per_chunk, c.N - n0), P = images * c.tiles();
    if (narrow)
      winograd_conv_input_kernel<int32_t>
          <<<blocks_for(P * c.Ci), kThreads, 0, st>>>(c, in, int32_t(n0), int32_t(images), v);
    else
      winograd_conv_input_kernel<int64_t><<<blocks_for(P * c.Ci), kThreads, 0, st>>>(c, in, n0, images, v);
    DITTO_CHECK_LAUNCH(ctx);
    // Batch e: m_e (P x Co column-major, i.e. [o][q]) = v_e (P x Ci, i.e. [i][q]) . u_e (Ci x Co, i.e. [o][i]).
    const Gemm q{CUBLAS_OP_N, CUBLAS_OP_N, P, c.Co, c.Ci, v, P, c.Ci * P, u, c.Ci, c.Co * c.Ci, m, P, c.Co * P, 16};
    run_gemm(ctx, q, tf32);
    if (narrow)
      winograd_conv_output_kernel<int32_t>
          <<<blocks_for(P * c.Co), kThreads, 0, st>>>(c, m, int32_t(n0), int32_t(images), out);
    else
      winograd_conv_output_kernel<int64_t><<<blocks_for(P * c.Co), kThreads, 0, st>>>(c, m, n0, images, out);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

}  // namespace ditto::cuda
