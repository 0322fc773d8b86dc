// ditto's own batch-norm kernels. Per-channel reductions run on a (P, C) grid: block (p, c) owns
// a fixed contiguous range of the channel's M = N*HW values (range and P depend only on the
// shape, not on the device), each thread sums its strided share in order, and the block combines
// its 256 thread sums with cub::BlockReduce (BlockSum, kernels/detail/reduce.cuh: a fixed order).
// Then either
//   - fixed order: the block writes its partial, and one block of 128 threads per channel adds
//     the P <= 128 partials with BlockSum (deterministic, and since the grid is a function of the
//     shape alone, the same bits on any GPU: CCCL's gpu_to_gpu), or
//   - atomic: each warp's sum (cub::WarpReduce) is atomicAdded into the channel's accumulator (NOT
//     deterministic, CCCL's not_guaranteed: the order of the P*8 float adds per channel depends
//     on scheduling).
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/batchnorm_cuda.h"
#include "kernels/detail/reduce.cuh"

namespace ditto::cuda {
namespace {

constexpr int kWarps = kThreads / 32;
constexpr int64_t kElemsPerBlock = 4096;
constexpr int64_t kMaxPartials = 128;


// Blocks per channel: a function of the shape alone, so the reduction tree is the same on any GPU.
inline int64_t partials_per_channel(int64_t m) {
  int64_t p = (m + kElemsPerBlock - 1) / kElemsPerBlock;
  return p < 1 ? 1 : (p > kMaxPartials ? kMaxPartials : p);
}

// The finalize kernels: one block per channel, one thread per partial.
static_assert(kMaxPartials == 128, "finalize blocks have one thread per partial");
constexpr int kFinalThreads = 128;

// The contiguous range [begin, end) of the channel's values that block p owns.
struct Chunk {
  int64_t begin, end;
};
__device__ __forceinline__ Chunk chunk_of(int64_t m, int64_t parts) {
  const int64_t len = (m + parts - 1) / parts;
  const int64_t b = blockIdx.x * len;
  return {b, b + len < m ? b + len : m};
}

// Pass 1 of the statistics: per-block partial sums of x (fixed order; see the file comment).
__global__ void partial_sum_kernel(const float* __restrict__ x, int64_t n, int64_t c, int64_t hw, int64_t parts,
                                   float* __restrict__ partial) {
  const int64_t ch = blockIdx.y;
  const Chunk k = chunk_of(n * hw, parts);
  float s = 0.f;
  ChannelWalk w(k.begin + threadIdx.x, hw, blockDim.x);
  for (int64_t j = k.begin + threadIdx.x; j < k.end; j += blockDim.x, w.next()) s += x[w.offset(ch, c)];
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  s = BlockSum<kThreads>(tmp).Sum(s);
  if (threadIdx.x == 0) partial[ch * parts + blockIdx.x] = s;
}

// The sum of channel blockIdx.x's partials (BlockSum over one partial per thread), in thread 0.
__device__ __forceinline__ float sum_partials(const float* __restrict__ partial, int64_t parts) {
  __shared__ BlockSum<kFinalThreads>::TempStorage tmp;
  const float v = threadIdx.x < parts ? partial[blockIdx.x * parts + threadIdx.x] : 0.f;
  return BlockSum<kFinalThreads>(tmp).Sum(v, static_cast<int>(parts));
}

// One block per channel: mean = sum / M.
__global__ void mean_finalize_kernel(const float* __restrict__ partial, int64_t parts, float m,
                                     float* __restrict__ mean) {
  const float s = sum_partials(partial, parts);
  if (threadIdx.x == 0) mean[blockIdx.x] = s / m;
}

// Pass 2: per-block partial sums of (x - mean)^2 (two-pass variance: no cancellation).
__global__ void partial_sqdev_kernel(const float* __restrict__ x, const float* __restrict__ mean, int64_t n, int64_t c,
                                     int64_t hw, int64_t parts, float* __restrict__ partial) {
  const int64_t ch = blockIdx.y;
  const Chunk k = chunk_of(n * hw, parts);
  const float mu = mean[ch];
  float s = 0.f;
  ChannelWalk w(k.begin + threadIdx.x, hw, blockDim.x);
  for (int64_t j = k.begin + threadIdx.x; j < k.end; j += blockDim.x, w.next()) {
    const float dv = x[w.offset(ch, c)] - mu;
    s += dv * dv;
  }
  __shared__ BlockSum<kThreads>::TempStorage tmp;
  s = BlockSum<kThreads>(tmp).Sum(s);
  if (threadIdx.x == 0) partial[ch * parts + blockIdx.x] = s;
}

// One block per channel: biased variance -> invstd; running stats with the unbiased variance.
__global__ void var_finalize_kernel(const float* __restrict__ partial, int64_t parts, float m, float momentum,
                                    float eps, const float* __restrict__ mean, float* __restrict__ invstd,
                                    float* __restrict__ running_mean, float* __restrict__ running_var) {
  const float q = sum_partials(partial, parts);
  if (threadIdx.x != 0) return;
  const int64_t ch = blockIdx.x;
  invstd[ch] = 1.f / sqrtf(q / m + eps);
  running_mean[ch] = (1.f - momentum) * running_mean[ch] + momentum * mean[ch];
  running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * (q / (m - 1.f));
}

__global__ void running_stats_kernel(const float* __restrict__ rm, const float* __restrict__ rv, int64_t c, float eps,
                                     float* __restrict__ mean, float* __restrict__ invstd) {
  const int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  mean[ch] = rm[ch];
  invstd[ch] = 1.f / sqrtf(rv[ch] + eps);
}

// Elementwise normalization: deterministic.
__global__ void apply_kernel(const float* __restrict__ x, const float* __restrict__ mean,
                             const float* __restrict__ invstd, const float* __restrict__ gamma,
                             const float* __restrict__ beta, float* __restrict__ y, int64_t total, int64_t c,
                             int64_t hw, bool narrow) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = channel_of(i, hw, c, narrow);
    y[i] = (x[i] - mean[ch]) * (invstd[ch] * gamma[ch]) + beta[ch];
  }
}

// Backward sums sum(dy) and sum(dy * xhat) over the block's range. Fixed order: block partials
// into `partial_dy` / `partial_dyx` (finalized by bwd_finalize_kernel). Atomic: one atomicAdd
// per warp into dbeta / dgamma — NOT deterministic.
template <bool kAtomic>
__global__ void bwd_reduce_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                  const float* __restrict__ mean, const float* __restrict__ invstd, int64_t n, int64_t c,
                                  int64_t hw, int64_t parts, float* __restrict__ out_dy, float* __restrict__ out_dyx) {
  const int64_t ch = blockIdx.y;
  const Chunk k = chunk_of(n * hw, parts);
  const float mu = mean[ch], is = invstd[ch];
  float sdy = 0.f, sdyx = 0.f;
  ChannelWalk w(k.begin + threadIdx.x, hw, blockDim.x);
  for (int64_t j = k.begin + threadIdx.x; j < k.end; j += blockDim.x, w.next()) {
    const int64_t o = w.offset(ch, c);
    const float g = dy[o];
    sdy += g;
    sdyx += g * ((x[o] - mu) * is);
  }
  if (kAtomic) {
    __shared__ WarpSum::TempStorage warp_tmp[kWarps];
    sdy = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(sdy);
    __syncwarp();  // the warp's temp storage is reused
    sdyx = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(sdyx);
    if ((threadIdx.x & 31) == 0) {
      atomicAdd(out_dy + ch, sdy);
      atomicAdd(out_dyx + ch, sdyx);
    }
  } else {
    __shared__ BlockSum<kThreads>::TempStorage tmp_dy, tmp_dyx;
    sdy = BlockSum<kThreads>(tmp_dy).Sum(sdy);
    sdyx = BlockSum<kThreads>(tmp_dyx).Sum(sdyx);
    if (threadIdx.x == 0) {
      out_dy[ch * parts + blockIdx.x] = sdy;
      out_dyx[ch * parts + blockIdx.x] = sdyx;
    }
  }
}

// One block per channel.
__global__ void bwd_finalize_kernel(const float* __restrict__ partial_dy, const float* __restrict__ partial_dyx,
                                    int64_t parts, float* __restrict__ dbeta, float* __restrict__ dgamma) {
  const float a = sum_partials(partial_dy, parts);
  __syncthreads();  // sum_partials' temp storage is reused
  const float b = sum_partials(partial_dyx, parts);
  if (threadIdx.x == 0) {
    dbeta[blockIdx.x] = a;
    dgamma[blockIdx.x] = b;
  }
}

// Elementwise dx from the per-channel sums: deterministic given the sums.
__global__ void bwd_dx_kernel(const float* __restrict__ x, const float* __restrict__ dy, const float* __restrict__ mean,
                              const float* __restrict__ invstd, const float* __restrict__ gamma,
                              const float* __restrict__ dgamma, const float* __restrict__ dbeta, bool training,
                              float* __restrict__ dx, int64_t total, int64_t c, int64_t hw, float m, bool narrow) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = channel_of(i, hw, c, narrow);
    const float is = invstd[ch], g = gamma[ch] * is;
    if (training) {
      const float xhat = (x[i] - mean[ch]) * is;
      dx[i] = g * (dy[i] - dbeta[ch] / m - xhat * (dgamma[ch] / m));
    } else {
      dx[i] = g * dy[i];
    }
  }
}

inline unsigned channel_blocks(int64_t c) { return static_cast<unsigned>((c + kThreads - 1) / kThreads); }

}  // namespace

int64_t bn_scratch_floats(const BnDims& d) { return 2 * d.c * partials_per_channel(d.m()); }

void bn_batch_stats(Context& ctx, const float* x, const BnDims& d, float momentum, float eps, float* saved_mean,
                    float* saved_invstd, float* running_mean, float* running_var, float* scratch) {
  if (d.c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = partials_per_channel(d.m());
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(d.c));
  const float m = float(d.m());
  partial_sum_kernel<<<grid, kThreads, 0, s>>>(x, d.n, d.c, d.hw, parts, scratch);
  DITTO_CHECK_LAUNCH(ctx);
  mean_finalize_kernel<<<static_cast<unsigned>(d.c), kFinalThreads, 0, s>>>(scratch, parts, m, saved_mean);
  DITTO_CHECK_LAUNCH(ctx);
  partial_sqdev_kernel<<<grid, kThreads, 0, s>>>(x, saved_mean, d.n, d.c, d.hw, parts, scratch);
  DITTO_CHECK_LAUNCH(ctx);
  var_finalize_kernel<<<static_cast<unsigned>(d.c), kFinalThreads, 0, s>>>(scratch, parts, m, momentum, eps, saved_mean,
                                                                           saved_invstd, running_mean, running_var);
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
  apply_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, mean, invstd, gamma, beta, y, total, d.c,
                                                                          d.hw, narrow_index(total));
  DITTO_CHECK_LAUNCH(ctx);
}

void bn_bwd_reduce(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
                   const BnDims& d, bool atomic, float* dgamma, float* dbeta, float* scratch) {
  if (d.c == 0) return;
  cudaStream_t s = detail::stream_of(ctx);
  const int64_t parts = partials_per_channel(d.m());
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(d.c));
  if (atomic) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(dbeta, 0, sizeof(float) * d.c, s));
    DITTO_CUDA_CHECK(cudaMemsetAsync(dgamma, 0, sizeof(float) * d.c, s));
    bwd_reduce_kernel<true><<<grid, kThreads, 0, s>>>(x, dy, mean, invstd, d.n, d.c, d.hw, parts, dbeta, dgamma);
    DITTO_CHECK_LAUNCH(ctx);
  } else {
    float* pdy = scratch;
    float* pdyx = scratch + d.c * parts;
    bwd_reduce_kernel<false><<<grid, kThreads, 0, s>>>(x, dy, mean, invstd, d.n, d.c, d.hw, parts, pdy, pdyx);
    DITTO_CHECK_LAUNCH(ctx);
    bwd_finalize_kernel<<<static_cast<unsigned>(d.c), kFinalThreads, 0, s>>>(pdy, pdyx, parts, dbeta, dgamma);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

void bn_bwd_dx(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
               const float* gamma, const float* dgamma, const float* dbeta, bool training, float* dx, const BnDims& d) {
  const int64_t total = d.n * d.c * d.hw;
  if (total == 0) return;
  bwd_dx_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, dy, mean, invstd, gamma, dgamma, dbeta,
                                                                           training, dx, total, d.c, d.hw,
                                                                           float(d.m()), narrow_index(total));
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
