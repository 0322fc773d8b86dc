// Synchronized batch norm's own kernels (kernels/sync_batchnorm.h). Deterministic: the channel
// sums are a fixed strided walk per thread and a CUB block reduction (order set by the block
// size), on a grid of one block per channel; the merge over ranks is the binary-counter tree over
// the rank index; everything else is elementwise. No atomics.
#include <cub/block/block_reduce.cuh>

#include "engine/detail/counter_tree.cuh"
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/reduce.cuh"
#include "kernels/detail/sync_batchnorm_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int kSumsBlock = 256;
using BlockSumDouble = cub::BlockReduce<double, kSumsBlock, cub::BLOCK_REDUCE_WARP_REDUCTIONS>;

__global__ void __launch_bounds__(kSumsBlock) sums_kernel(const float* x, int64_t n, int64_t c, int64_t hw, double* sums) {
  __shared__ BlockSumDouble::TempStorage tmp;
  const int64_t ch = blockIdx.x, m = n * hw;
  double s1 = 0, s2 = 0;
  ChannelWalk w(threadIdx.x, hw, kSumsBlock);
  for (int64_t j = threadIdx.x; j < m; j += kSumsBlock, w.next()) {
    const double v = double(x[w.offset(ch, c)]);
    s1 += v;
    s2 += v * v;
  }
  const double t1 = BlockSumDouble(tmp).Sum(s1);
  __syncthreads();
  const double t2 = BlockSumDouble(tmp).Sum(s2);
  if (threadIdx.x == 0) {
    sums[ch] = t1;
    sums[c + ch] = t2;
    if (ch == 0) sums[2 * c] = double(m);
  }
}

__global__ void merge_kernel(const double* records, int ranks, int64_t per, double* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < per; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = counter_tree<double>(ranks, [&](int r) { return records[r * per + i]; });
  }
}

__global__ void stats_kernel(const double* sums, int64_t c, float momentum, float eps, float* mean, float* invstd,
                             float* running_mean, float* running_var) {
  const int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  const double m = sums[2 * c];
  const double mu = sums[ch] / m;
  const double var = fmax(0.0, sums[c + ch] / m - mu * mu);
  mean[ch] = float(mu);
  invstd[ch] = float(1.0 / sqrt(var + double(eps)));
  const double mo = double(momentum);
  running_mean[ch] = float((1 - mo) * double(running_mean[ch]) + mo * mu);
  running_var[ch] = float((1 - mo) * double(running_var[ch]) + mo * var * m / (m - 1));
}

__global__ void dx_kernel(const float* x, const float* dy, const float* mean, const float* invstd, const float* gamma,
                          const float* dbeta, const float* dgamma, const double* count, float* dx, int64_t total,
                          int64_t c, int64_t hw, bool narrow) {
  const double m = *count;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < total; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = channel_of(j, hw, c, narrow);
    const double is = double(invstd[ch]);
    const double xhat = (double(x[j]) - double(mean[ch])) * is;
    dx[j] = float(double(gamma[ch]) * is * (double(dy[j]) - double(dbeta[ch]) / m - xhat * double(dgamma[ch]) / m));
  }
}

}  // namespace

void sbn_local_sums(Context& ctx, const float* x, const BnDims& d, double* sums) {
  if (d.c == 0) return;
  sums_kernel<<<static_cast<unsigned>(d.c), kSumsBlock, 0, detail::stream_of(ctx)>>>(x, d.n, d.c, d.hw, sums);
  DITTO_CHECK_LAUNCH(ctx);
}

void sbn_merge(Context& ctx, const double* records, int ranks, int64_t per, double* out) {
  if (per == 0) return;
  merge_kernel<<<blocks_for(per), kThreads, 0, detail::stream_of(ctx)>>>(records, ranks, per, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void sbn_stats(Context& ctx, const double* sums, int64_t c, float momentum, float eps, float* mean, float* invstd,
               float* running_mean, float* running_var) {
  if (c == 0) return;
  stats_kernel<<<blocks_for(c), kThreads, 0, detail::stream_of(ctx)>>>(sums, c, momentum, eps, mean, invstd,
                                                                        running_mean, running_var);
  DITTO_CHECK_LAUNCH(ctx);
}

void sbn_bwd_dx(Context& ctx, const float* x, const float* dy, const float* mean, const float* invstd,
                const float* gamma, const float* dbeta, const float* dgamma, const double* count, float* dx,
                const BnDims& d) {
  const int64_t total = d.n * d.c * d.hw;
  if (total == 0) return;
  dx_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(x, dy, mean, invstd, gamma, dbeta, dgamma,
                                                                         count, dx, total, d.c, d.hw,
                                                                         narrow_index(total));
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
