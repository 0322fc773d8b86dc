// Softmax cross-entropy CUDA kernels.
//
// xent_rows_kernel: one warp per example. The lanes take the row's columns lane, lane+32, ...;
// max and sum are combined by a butterfly (__shfl_xor_sync), which leaves the same bits in every
// lane (a+b == b+a exactly), so the per-example lse and loss are deterministic. Then the batch
// reduction:
//   kAtomic = true:  lane 0 atomicAdds loss_i / N into loss[0]. The order of the N additions is the
//                    order the warps reach the atomic unit: NOT deterministic.
//                    (CCCL's not_guaranteed.)
//   kAtomic = false: lane 0 writes loss_i to row_loss[i]; xent_mean_kernel (one block of 1024)
//                    then adds them: thread t adds rows t, t+1024, ... in order, and the 1024 sums
//                    are combined by cub::BlockReduce (BlockSum, kernels/detail/reduce.cuh, a fixed
//                    order). One block whatever the GPU: the same bits for a given N on any GPU
//                    (CCCL's gpu_to_gpu).
// An out-of-range label makes loss_i NaN (see kernels/loss.h).
// xent_bwd_kernel: one thread per logit, no reduction: deterministic.
#include <cmath>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/loss_cuda.h"
#include "kernels/detail/reduce.cuh"

namespace ditto::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;
constexpr int kMeanThreads = 1024;


template <bool kAtomic>
__global__ void xent_rows_kernel(const float* logits, const int32_t* labels, float* lse_out, float* row_loss,
                                 float* loss, int64_t n, int64_t c) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  if (row >= n) return;  // whole warps leave together: row is uniform across a warp
  const float* x = logits + row * c;
  float m = -INFINITY;
  for (int64_t j = lane; j < c; j += 32) m = fmaxf(m, x[j]);
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float s = 0.f;
  for (int64_t j = lane; j < c; j += 32) s += expf(x[j] - m);
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane != 0) return;
  const float lse = m + logf(s);
  const int32_t label = labels[row];
  const float li = (label >= 0 && label < c) ? lse - x[label] : NAN;
  lse_out[row] = lse;
  if (kAtomic)
    atomicAdd(loss, li / static_cast<float>(n));
  else
    row_loss[row] = li;
}

__global__ void xent_mean_kernel(const float* row_loss, float* loss, int64_t n) {
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kMeanThreads) acc += row_loss[i];
  __shared__ BlockSum<kMeanThreads>::TempStorage tmp;
  const float sum = BlockSum<kMeanThreads>(tmp).Sum(acc);
  if (threadIdx.x == 0) loss[0] = sum / static_cast<float>(n);
}

__global__ void xent_bwd_kernel(const float* logits, const int32_t* labels, const float* lse, const float* dl,
                                float* dlogits, int64_t n, int64_t c) {
  const float scale = dl[0] / static_cast<float>(n);
  const int64_t total = n * c;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / c, j = k % c;
    const int32_t label = labels[i];
    const float p = expf(logits[k] - lse[i]);
    dlogits[k] = (label >= 0 && label < c) ? (p - (j == label ? 1.f : 0.f)) * scale : NAN;
  }
}

}  // namespace

void softmax_xent_fwd(Context& ctx, const float* logits, const int32_t* labels, float* lse, float* row_loss,
                      float* loss, int64_t n, int64_t c, Reduction reduce) {
  cudaStream_t st = detail::stream_of(ctx);
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  if (reduce == Reduction::Atomic) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), st));
    xent_rows_kernel<true><<<blocks, kThreads, 0, st>>>(logits, labels, lse, nullptr, loss, n, c);
    DITTO_CHECK_LAUNCH(ctx);
  } else {
    xent_rows_kernel<false><<<blocks, kThreads, 0, st>>>(logits, labels, lse, row_loss, nullptr, n, c);
    DITTO_CHECK_LAUNCH(ctx);
    xent_mean_kernel<<<1, kMeanThreads, 0, st>>>(row_loss, loss, n);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

void softmax_xent_bwd(Context& ctx, const float* logits, const int32_t* labels, const float* lse, const float* dl,
                      float* dlogits, int64_t n, int64_t c) {
  xent_bwd_kernel<<<blocks_for(n * c), kThreads, 0, detail::stream_of(ctx)>>>(logits, labels, lse, dl, dlogits, n, c);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
