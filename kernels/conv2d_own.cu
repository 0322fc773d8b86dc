// ditto's own convolution kernels (see kernels/detail/conv2d_own.h for the variants and why each
// is deterministic).
//
// conv_fwd_direct: the fixed-order GEMM of kernels/detail/fixed_gemm.cuh over an implicit im2col
// (rows: output positions n*Ho*Wo + p, columns: the group's output channels, reduction: c*r*s in
// ascending order), one launch per convolution group. Batch-invariant.
// im2col_kernel / dy_rearrange_kernel: copies, one thread per output element: deterministic.
// col2im_gather_kernel: one thread per dX element adds its (r, s) taps in r-major order.
// fold_kernel: one thread per element adds `count` partial arrays left to right onto acc.
// dw_bwd_data_kernel: one thread per dX element adds (multiplier, r, s) taps in that order.
// dw_bwd_filter_kernel: grid (K, parts); each thread sums its positions in increasing order, then
// cub::BlockReduce (fixed tree, kernels/detail/reduce.cuh) per tap; the parts are folded in part
// order. Grid and part count depend on the shape alone.
// The GEMMs are cuBLAS's (atomics mode off, FMA or TF32 compute as the layer's math says).
#include <cublas_v2.h>

#include <climits>

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

template <class I>
__global__ void im2col_kernel(ConvGeom g, const float* __restrict__ x, float* __restrict__ cols, I n0, I images, I grp,
                              I total) {
  const I cols_per_row = images * I(g.Ho * g.Wo), howo = I(g.Ho * g.Wo), crsg = I(g.CRSg());
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    // cols is [item][crs][b*HoWo + pos] with `images` images per item.
    const I row = i / cols_per_row, j = i - row * cols_per_row;
    const I item = row / crsg, crs = row - item * crsg;
    const I b = j / howo, pos = j - b * howo;
    const I src = own::im2col_source<I>(g, n0 + item * images + b, grp, crs, pos);
    cols[i] = src < 0 ? 0.f : __ldg(x + src);
  }
}

template <class I>
__global__ void dy_rearrange_kernel(ConvGeom g, const float* __restrict__ dy, float* __restrict__ out, I n0, I images,
                                    I grp, I total) {
  const I howo = I(g.Ho * g.Wo), per_row = images * howo, kg = I(g.Kg());
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    // out is [item][k][b*HoWo + pos].
    const I row = i / per_row, j = i - row * per_row;
    const I item = row / kg, k = row - item * kg;
    const I b = j / howo, pos = j - b * howo;
    const I n = n0 + item * images + b;
    out[i] = __ldg(dy + ((n * I(g.K) + grp * kg + k) * howo + pos));
  }
}

template <class I>
__global__ void col2im_gather_kernel(ConvGeom g, const float* __restrict__ cols, float* __restrict__ dx, I n0,
                                     I images, I grp, I total) {
  const I H = I(g.H), W = I(g.W), cg = I(g.Cg()), R = I(g.R), S = I(g.S), howo = I(g.Ho * g.Wo);
  const I per_row = images * howo;
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    // i runs over the chunk's images x the group's channels x H x W.
    I t = i;
    const I w = t % W;
    t /= W;
    const I h = t % H;
    t /= H;
    const I c = t % cg;
    const I nl = t / cg;
    const I item = nl / images, b = nl - item * images;
    const float* base = cols + (item * cg + c) * R * S * per_row + b * howo;
    float acc = 0.f;
    for (I r = 0; r < R; ++r)
      for (I s = 0; s < S; ++s) {
        const I pos = own::tap_target<I>(g, h, w, r, s);
        if (pos >= 0) acc += __ldg(base + (r * S + s) * per_row + pos);
      }
    dx[(((n0 + nl) * I(g.C) + grp * cg + c) * H + h) * W + w] = acc;
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
        const int64_t total = items * crs * positions;
        if (narrow) launch_flat<int32_t>(ctx, im2col_kernel<int32_t>, total, g, x, cols, int32_t(n0), int32_t(images), int32_t(grp));
        else launch_flat<int64_t>(ctx, im2col_kernel<int64_t>, total, g, x, cols, n0, images, grp);
        q.a = cols, q.lda = positions, q.stride_a = crs * positions;
      }
      if (images > 1) {
        const int64_t total = items * kg * positions;
        if (narrow) launch_flat<int32_t>(ctx, dy_rearrange_kernel<int32_t>, total, g, dy, dyt, int32_t(n0), int32_t(images), int32_t(grp));
        else launch_flat<int64_t>(ctx, dy_rearrange_kernel<int64_t>, total, g, dy, dyt, n0, images, grp);
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
        const int64_t total = items * kg * positions;
        if (narrow) launch_flat<int32_t>(ctx, dy_rearrange_kernel<int32_t>, total, g, dy, dyt, int32_t(n0), int32_t(images), int32_t(grp));
        else launch_flat<int64_t>(ctx, dy_rearrange_kernel<int64_t>, total, g, dy, dyt, n0, images, grp);
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
      const int64_t total = items * images * g.Cg() * g.HW();
      if (narrow) launch_flat<int32_t>(ctx, col2im_gather_kernel<int32_t>, total, g, static_cast<const float*>(cols), dx, int32_t(n0), int32_t(images), int32_t(grp));
      else launch_flat<int64_t>(ctx, col2im_gather_kernel<int64_t>, total, g, static_cast<const float*>(cols), dx, n0, images, grp);
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

}  // namespace ditto::cuda
