// ReLU CUDA kernels: one thread per element, no reductions, so bit-reproducible.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/activation_cuda.h"

namespace ditto::cuda {
namespace {
__global__ void relu_fwd_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] > 0.f ? x[i] : 0.f;
}
__global__ void relu_bwd_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}
}  // namespace

void relu_fwd(Context& ctx, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  relu_fwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, y, n);
  DITTO_CHECK_LAUNCH(ctx);
}
void relu_bwd(Context& ctx, const float* y, const float* dy, float* dx, int64_t n) {
  if (n == 0) return;
  relu_bwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(y, dy, dx, n);
  DITTO_CHECK_LAUNCH(ctx);
}
}  // namespace ditto::cuda
