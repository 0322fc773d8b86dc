// ditto's own batch-norm kernels. Per-channel reductions run on a (P, C) grid: block (p, c) owns
// a fixed contiguous range of the channel's M = N*HW values (range and P depend only on the
// shape, not on the device). The channel's values are walked in vectors of 4 floats when HW is a
// multiple of 4 (each image's plane then starts 16-byte aligned), else one float at a time; each
// thread visits its strided share in increasing order, four vectors in flight at a time.
//
// Forward statistics, one pass: each thread keeps (count, sum, sum of squares) of its values
// shifted by its own first value, and turns them into (count, mean, M2) — the shift keeps the
// cancellation within a thread's few dozen values. Those are merged with Chan et al.'s pairwise
// update (n = na + nb, d = mean_b - mean_a, mean = mean_a + d nb/n, M2 = M2a + M2b + d^2 na nb/n),
// first across the block by cub::BlockReduce (a fixed tree, kernels/detail/reduce.cuh), then over
// the channel's P partials by one block in part order. Robust for any data (no E[x^2] - E[x]^2),
// one read of x, and deterministic on any GPU (CCCL's gpu_to_gpu).
//
// Backward sums sum(dy) and sum(dy * (x - mean)) the same way (one pass over x and dy), then
//   - fixed order: block partials, one block per channel adds the P partials with BlockSum, or
//   - atomic: each warp's sum (cub::WarpReduce) is atomicAdded into the channel's accumulator (NOT
//     deterministic, CCCL's not_guaranteed: the order of the float adds depends on scheduling).
// The elementwise passes (normalize, dx) are one thread per vector: deterministic.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/batchnorm_cuda.h"
#include "kernels/detail/reduce.cuh"

namespace ditto::cuda {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int64_t kElemsPerBlock = 8192;
constexpr int64_t kMaxPartials = 128;
constexpr int kUnroll = 4;  // vectors in flight per thread

// Blocks per channel: a function of the shape alone, so the reduction tree is the same on any GPU.
inline int64_t partials_per_channel(int64_t m) {
  int64_t p = (m + kElemsPerBlock - 1) / kElemsPerBlock;
  return p < 1 ? 1 : (p > kMaxPartials ? kMaxPartials : p);
}

// The finalize kernels: one block per channel, one thread per partial.
static_assert(kMaxPartials == 128, "finalize blocks have one thread per partial");
constexpr int kFinalThreads = 128;

// Vectors of V floats (4 when HW % 4 == 0, else 1).
template <int V>
struct Vec;
template <>
struct Vec<4> {
  using T = float4;
  __device__ __forceinline__ static float at(const T& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
};
template <>
struct Vec<1> {
  using T = float;
  __device__ __forceinline__ static float at(const T& v, int) { return v; }
};

// The contiguous range [begin, end) of a channel's vectors (there are m / V) that block p owns.
struct Chunk {
  int64_t begin, end;
};
__device__ __forceinline__ Chunk chunk_of(int64_t vectors, int64_t parts) {
  const int64_t len = (vectors + parts - 1) / parts;
  const int64_t b = blockIdx.x * len;
  return {b, b + len < vectors ? b + len : vectors};
}

// Visits the block's vectors of channel ch in the thread's order: fn(offset in vectors) for j =
// begin + t, begin + t + 256, ..., kUnroll offsets computed before any is used so their loads
// overlap. Order of the calls: increasing j.
template <class Fn>
__device__ __forceinline__ void walk_channel(int64_t ch, int64_t c, int64_t plane_vectors, const Chunk& k, Fn&& fn) {
  ChannelWalk w(k.begin + threadIdx.x, plane_vectors, kThreads);
  int64_t j = k.begin + threadIdx.x;
  for (; j + (kUnroll - 1) * kThreads < k.end; j += kUnroll * kThreads) {
    int64_t o[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      o[u] = w.offset(ch, c);
      w.next();
    }
    fn.template visit<kUnroll>(o);
  }
  for (; j < k.end; j += kThreads, w.next()) {
    int64_t o[1] = {w.offset(ch, c)};
    fn.template visit<1>(o);
  }
}

// ---- forward statistics -------------------------------------------------------------------------

struct Moments {
  float n, mean, m2;
};
struct MergeMoments {
  __device__ __forceinline__ Moments operator()(const Moments& a, const Moments& b) const {
    if (a.n == 0.f) return b;
    if (b.n == 0.f) return a;
    const float n = a.n + b.n, d = b.mean - a.mean, f = b.n / n;
    return {n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
  }
};

template <int V>
struct ShiftedSums {
  const typename Vec<V>::T* x;
  float n = 0.f, shift = 0.f, s1 = 0.f, s2 = 0.f;
  template <int U>
  __device__ __forceinline__ void visit(const int64_t (&o)[U]) {
    typename Vec<V>::T v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = x[o[u]];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float a = Vec<V>::at(v[u], i);
        if (n == 0.f) shift = a;
        const float d = a - shift;
        n += 1.f;
        s1 += d;
        s2 += d * d;
      }
  }
  __device__ __forceinline__ Moments moments() const {
    if (n == 0.f) return {0.f, 0.f, 0.f};
    const float m2 = s2 - s1 * (s1 / n);
    return {n, shift + s1 / n, m2 > 0.f ? m2 : 0.f};
  }
};

template <int V>
__global__ void __launch_bounds__(kThreads) moments_kernel(const float* __restrict__ x, int64_t n, int64_t c,
                                                           int64_t hw, int64_t parts, float* __restrict__ partial) {
  const int64_t ch = blockIdx.y, plane = hw / V, vectors = n * plane;
  ShiftedSums<V> acc{reinterpret_cast<const typename Vec<V>::T*>(x)};
  walk_channel(ch, c, plane, chunk_of(vectors, parts), acc);
  __shared__ typename cub::BlockReduce<Moments, kThreads, cub::BLOCK_REDUCE_WARP_REDUCTIONS>::TempStorage tmp;
  const Moments m =
      cub::BlockReduce<Moments, kThreads, cub::BLOCK_REDUCE_WARP_REDUCTIONS>(tmp).Reduce(acc.moments(), MergeMoments{});
  if (threadIdx.x == 0) {
    float* p = partial + 3 * (ch * parts + blockIdx.x);
    p[0] = m.n, p[1] = m.mean, p[2] = m.m2;
  }
}

// One block per channel: merges the P partials in part order (thread i holds partial i; the
// BlockReduce tree is fixed), then the saved mean / inverse std and the running statistics.
__global__ void moments_finalize_kernel(const float* __restrict__ partial, int64_t parts, float m, float momentum,
                                        float eps, float* __restrict__ mean, float* __restrict__ invstd,
                                        float* __restrict__ running_mean, float* __restrict__ running_var) {
  const int64_t ch = blockIdx.x;
  Moments v{0.f, 0.f, 0.f};
  if (threadIdx.x < parts) {
    const float* p = partial + 3 * (ch * parts + threadIdx.x);
    v = {p[0], p[1], p[2]};
  }
  __shared__ typename cub::BlockReduce<Moments, kFinalThreads, cub::BLOCK_REDUCE_WARP_REDUCTIONS>::TempStorage tmp;
  const Moments t =
      cub::BlockReduce<Moments, kFinalThreads, cub::BLOCK_REDUCE_WARP_REDUCTIONS>(tmp).Reduce(v, MergeMoments{});
  if (threadIdx.x != 0) return;
  mean[ch] = t.mean;
  invstd[ch] = 1.f / sqrtf(t.m2 / m + eps);
  running_mean[ch] = (1.f - momentum) * running_mean[ch] + momentum * t.mean;
  running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * (t.m2 / (m - 1.f));
}

__global__ void running_stats_kernel(const float* __restrict__ rm, const float* __restrict__ rv, int64_t c, float eps,
                                     float* __restrict__ mean, float* __restrict__ invstd) {
  const int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  mean[ch] = rm[ch];
  invstd[ch] = 1.f / sqrtf(rv[ch] + eps);
}

// ---- elementwise passes ---------------------------------------------------------------------------

// One thread per vector; a vector never straddles two channels (V divides HW).
template <int V>
__global__ void apply_kernel(const float* __restrict__ x, const float* __restrict__ mean,
                             const float* __restrict__ invstd, const float* __restrict__ gamma,
                             const float* __restrict__ beta, float* __restrict__ y, int64_t vectors, int64_t c,
                             int64_t plane, bool narrow) {
  using T = typename Vec<V>::T;
  const T* xv = reinterpret_cast<const T*>(x);
  T* yv = reinterpret_cast<T*>(y);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = channel_of(i, plane, c, narrow);
    const float mu = mean[ch], sc = invstd[ch] * gamma[ch], b = beta[ch];
    T v = xv[i];
    float* f = reinterpret_cast<float*>(&v);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = (f[k] - mu) * sc + b;
    yv[i] = v;
  }
}

template <int V>
__global__ void bwd_dx_kernel(const float* __restrict__ x, const float* __restrict__ dy, const float* __restrict__ mean,
                              const float* __restrict__ invstd, const float* __restrict__ gamma,
                              const float* __restrict__ dgamma, const float* __restrict__ dbeta, bool training,
                              float* __restrict__ dx, int64_t vectors, int64_t c, int64_t plane, float m, bool narrow) {
  using T = typename Vec<V>::T;
  const T* xv = reinterpret_cast<const T*>(x);
  const T* gv = reinterpret_cast<const T*>(dy);
  T* dv = reinterpret_cast<T*>(dx);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = channel_of(i, plane, c, narrow);
    const float is = invstd[ch], g = gamma[ch] * is;
    T gy = gv[i];
    float* fg = reinterpret_cast<float*>(&gy);
    if (training) {
      const float mu = mean[ch], mb = dbeta[ch] / m, mg = dgamma[ch] / m;
      T xx = xv[i];
      const float* fx = reinterpret_cast<const float*>(&xx);
#pragma unroll
      for (int k = 0; k < V; ++k) fg[k] = g * (fg[k] - mb - ((fx[k] - mu) * is) * mg);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) fg[k] = g * fg[k];
    }
    dv[i] = gy;
  }
}

// ---- backward sums ----------------------------------------------------------------------------------

template <int V>
struct BwdSums {
  const typename Vec<V>::T* x;
  const typename Vec<V>::T* dy;
  float mu;
  float sdy = 0.f, sdyx = 0.f;
  template <int U>
  __device__ __forceinline__ void visit(const int64_t (&o)[U]) {
    typename Vec<V>::T a[U], g[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      a[u] = x[o[u]];
      g[u] = dy[o[u]];
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float gi = Vec<V>::at(g[u], i);
        sdy += gi;
        sdyx += gi * (Vec<V>::at(a[u], i) - mu);
      }
  }
};

// Sums sum(dy) and sum(dy * (x - mean)) over the block's range; dgamma = invstd * the second
// (applied in the finalize, or by the atomic variant's caller kernel below).
template <int V, bool kAtomic>
__global__ void __launch_bounds__(kThreads) bwd_reduce_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                                              const float* __restrict__ mean,
                                                              const float* __restrict__ invstd, int64_t n, int64_t c,
                                                              int64_t hw, int64_t parts, float* __restrict__ out_dy,
                                                              float* __restrict__ out_dyx) {
  const int64_t ch = blockIdx.y, plane = hw / V, vectors = n * plane;
  BwdSums<V> acc{reinterpret_cast<const typename Vec<V>::T*>(x), reinterpret_cast<const typename Vec<V>::T*>(dy),
                 mean[ch]};
  walk_channel(ch, c, plane, chunk_of(vectors, parts), acc);
  const float is = invstd[ch];
  if (kAtomic) {
    __shared__ WarpSum::TempStorage warp_tmp[kWarps];
    const float sdy = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(acc.sdy);
    __syncwarp();  // the warp's temp storage is reused
    const float sdyx = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(acc.sdyx * is);
    if ((threadIdx.x & 31) == 0) {
      atomicAdd(out_dy + ch, sdy);
      atomicAdd(out_dyx + ch, sdyx);
    }
  } else {
    __shared__ BlockSum<kThreads>::TempStorage tmp_dy, tmp_dyx;
    const float sdy = BlockSum<kThreads>(tmp_dy).Sum(acc.sdy);
    const float sdyx = BlockSum<kThreads>(tmp_dyx).Sum(acc.sdyx);
    if (threadIdx.x == 0) {
      out_dy[ch * parts + blockIdx.x] = sdy;
      out_dyx[ch * parts + blockIdx.x] = sdyx;
    }
  }
}

// The sum of channel blockIdx.x's partials (BlockSum over one partial per thread), in thread 0.
__device__ __forceinline__ float sum_partials(const float* __restrict__ partial, int64_t parts) {
  __shared__ BlockSum<kFinalThreads>::TempStorage tmp;
  const float v = threadIdx.x < parts ? partial[blockIdx.x * parts + threadIdx.x] : 0.f;
  return BlockSum<kFinalThreads>(tmp).Sum(v, static_cast<int>(parts));
}

// One block per channel.
__global__ void bwd_finalize_kernel(const float* __restrict__ partial_dy, const float* __restrict__ partial_dyx,
                                    int64_t parts, const float* __restrict__ invstd, float* __restrict__ dbeta,
                                    float* __restrict__ dgamma) {
  const float a = sum_partials(partial_dy, parts);
  __syncthreads();  // sum_partials' temp storage is reused
  const float b = sum_partials(partial_dyx, parts);
  if (threadIdx.x == 0) {
    dbeta[blockIdx.x] = a;
    dgamma[blockIdx.x] = b * invstd[blockIdx.x];
  }
}

inline unsigned channel_blocks(int64_t c) { return static_cast<unsigned>((c + kThreads - 1) / kThreads); }

// The (P, C) grid of the reduction kernels.
dim3 reduce_grid(const BnDims& d, int64_t parts) {
  return dim3(static_cast<unsigned>(parts), static_cast<unsigned>(d.c));
}

}  // namespace

int64_t bn_scratch_floats(const BnDims& d) { return 3 * d.c * partials_per_channel(d.m()); }

void bn_batch_stats(Context& ctx, const float* x, const BnDims& d, float momentum, float eps, float* saved_mean,
                    float* saved_invstd, float* running_mean, float* running_var, float* scratch) {
  if (d.c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = partials_per_channel(d.m());
  if (d.hw % 4 == 0)
    moments_kernel<4><<<reduce_grid(d, parts), kThreads, 0, s>>>(x, d.n, d.c, d.hw, parts, scratch);
  else
    moments_kernel<1><<<reduce_grid(d, parts), kThreads, 0, s>>>(x, d.n, d.c, d.hw, parts, scratch);
  DITTO_CHECK_LAUNCH(ctx);
  moments_finalize_kernel<<<static_cast<unsigned>(d.c), kFinalThreads, 0, s>>>(
      scratch, parts, float(d.m()), momentum, eps, saved_mean, saved_invstd, running_mean, running_var);
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_running_stats(Context& ctx, const float* running_mean, const float* running_var, int64_t c, float eps,
                      float* mean, float* invstd) {
  if (c == 0) return;
  running_stats_kernel<<<channel_blocks(c), kThreads, 0, detail::stream_of(ctx)>>>(running_mean, running_var, c, eps,
                                                                                   mean, invstd);
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_apply(Context& ctx, const float* x, const float* mean, const float* invstd, const float* gamma,
              const float* beta, float* y, const BnDims& d) {
  const int64_t total = d.n * d.c * d.hw;
  if (total == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  if (d.hw % 4 == 0) {
    const int64_t vectors = total / 4;
    apply_kernel<4><<<blocks_for(vectors), kThreads, 0, s>>>(x, mean, invstd, gamma, beta, y, vectors, d.c, d.hw / 4,
                                                             narrow_index(vectors));
  } else {
    apply_kernel<1><<<blocks_for(total), kThreads, 0, s>>>(x, mean, invstd, gamma, beta, y, total, d.c, d.hw,
                                                           narrow_index(total));
  }
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_bwd_reduce(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
                   const BnDims& d, bool atomic, float* dgamma, float* dbeta, float* scratch) {
  if (d.c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = partials_per_channel(d.m());
  const dim3 grid = reduce_grid(d, parts);
  const bool v4 = d.hw % 4 == 0;
  if (atomic) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(dbeta, 0, sizeof(float) * d.c, s));
    DITTO_CUDA_CHECK(cudaMemsetAsync(dgamma, 0, sizeof(float) * d.c, s));
    if (v4) bwd_reduce_kernel<4, true><<<grid, kThreads, 0, s>>>(x, dy, mean, invstd, d.n, d.c, d.hw, parts, dbeta, dgamma);
    else bwd_reduce_kernel<1, true><<<grid, kThreads, 0, s>>>(x, dy, mean, invstd, d.n, d.c, d.hw, parts, dbeta, dgamma);
    DITTO_CHECK_LAUNCH(ctx);
  } else {
    float* pdy = scratch;
    float* pdyx = scratch + d.c * parts;
    if (v4) bwd_reduce_kernel<4, false><<<grid, kThreads, 0, s>>>(x, dy, mean, invstd, d.n, d.c, d.hw, parts, pdy, pdyx);
    else bwd_reduce_kernel<1, false><<<grid, kThreads, 0, s>>>(x, dy, mean, invstd, d.n, d.c, d.hw, parts, pdy, pdyx);
    DITTO_CHECK_LAUNCH(ctx);
    bwd_finalize_kernel<<<static_cast<unsigned>(d.c), kFinalThreads, 0, s>>>(pdy, pdyx, parts, invstd, dbeta, dgamma);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

void bn_bwd_dx(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
               const float* gamma, const float* dgamma, const float* dbeta, bool training, float* dx, const BnDims& d) {
  const int64_t total = d.n * d.c * d.hw;
  if (total == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  if (d.hw % 4 == 0) {
    const int64_t vectors = total / 4;
    bwd_dx_kernel<4><<<blocks_for(vectors), kThreads, 0, s>>>(x, dy, mean, invstd, gamma, dgamma, dbeta, training, dx,
                                                              vectors, d.c, d.hw / 4, float(d.m()),
                                                              narrow_index(vectors));
  } else {
    bwd_dx_kernel<1><<<blocks_for(total), kThreads, 0, s>>>(x, dy, mean, invstd, gamma, dgamma, dbeta, training, dx,
                                                            total, d.c, d.hw, float(d.m()), narrow_index(total));
  }
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
