// Whole-tensor sum / mean kernels: the two variants of kernels/detail/fixed_sum.cuh (fixed order:
// gpu_to_gpu; atomic: not_guaranteed), and CUB's cub::DeviceReduce::Sum (two passes with no
// atomics, its grid sized by the SM count: the same bits on one GPU model, run_to_run). The
// backward broadcast is one thread per element: deterministic.
#include <cub/device/device_reduce.cuh>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/fixed_sum.cuh"
#include "kernels/detail/reduction_cuda.h"

namespace ditto::cuda {
namespace {

constexpr int64_t kPerThread = 8;

template <bool kAtomic>
__global__ void __launch_bounds__(kSumBlock) sum_partials_kernel(const float* __restrict__ x, int64_t n, float* out) {
  const int64_t stride = int64_t(gridDim.x) * kSumBlock;
  float acc = 0.f;
  for (int64_t i = blockIdx.x * int64_t(kSumBlock) + threadIdx.x; i < n; i += stride) acc += x[i];
  fixed_sum_block<kAtomic>(acc, out);
}

__global__ void broadcast_kernel(const float* __restrict__ dy, float* __restrict__ dx, int64_t n, float denom) {
  const float g = dy[0] / denom;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = g;
}

}  // namespace

std::size_t reduce_workspace_floats(int64_t n, Reduction r) {
  if (r == Reduction::Cub) {
    std::size_t bytes = 0;  // a size query: no device work
    DITTO_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, bytes, static_cast<const float*>(nullptr),
                                            static_cast<float*>(nullptr), n));
    return (bytes + sizeof(float) - 1) / sizeof(float);
  }
  return r == Reduction::Deterministic ? static_cast<std::size_t>(fixed_sum_parts(n, kPerThread)) : 0;
}

void reduce_all(Context& ctx, const float* x, int64_t n, bool mean, Reduction r, float* partials, float* out) {
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t parts = fixed_sum_parts(n, kPerThread);
  const float denom = mean ? static_cast<float>(n) : 1.f;
  if (r == Reduction::Cub) {
    std::size_t bytes = sizeof(float) * reduce_workspace_floats(n, r);
    DITTO_CUDA_CHECK(cub::DeviceReduce::Sum(partials, bytes, x, out, n, st));
    if (mean) {
      divide_scalar_kernel<<<1, 1, 0, st>>>(out, nullptr, denom);
      DITTO_CHECK_LAUNCH(ctx);
    }
    return;
  }
  if (r == Reduction::Atomic) {
    DITTO_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), st));
    sum_partials_kernel<true><<<static_cast<unsigned>(parts), kSumBlock, 0, st>>>(x, n, out);
    DITTO_CHECK_LAUNCH(ctx);
    if (mean) {
      divide_scalar_kernel<<<1, 1, 0, st>>>(out, nullptr, denom);
      DITTO_CHECK_LAUNCH(ctx);
    }
    return;
  }
  sum_partials_kernel<false><<<static_cast<unsigned>(parts), kSumBlock, 0, st>>>(x, n, partials);
  DITTO_CHECK_LAUNCH(ctx);
  fixed_sum_final_kernel<<<1, kSumMaxParts, 0, st>>>(partials, parts, nullptr, denom, out);
  DITTO_CHECK_LAUNCH(ctx);
}

void reduce_all_bwd(Context& ctx, const float* dy, float* dx, int64_t n, bool mean) {
  if (n == 0) return;
  broadcast_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, dx, n,
                                                                          mean ? static_cast<float>(n) : 1.f);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
