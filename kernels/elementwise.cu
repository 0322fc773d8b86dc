// Elementwise CUDA kernels. Deterministic: one thread per element (grid-stride), no atomics.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/elementwise_cuda.h"

namespace ditto::cuda {
namespace {


__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}
__global__ void axpy_kernel(float* dst, float alpha, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += alpha * x[i];
}
__global__ void scale_kernel(float* p, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] *= alpha;
}
__global__ void add_kernel(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

}  // namespace

void fill(Context& ctx, float* p, int64_t n, float v) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(p, n, v);
  DITTO_CHECK_LAUNCH(ctx);
}
void axpy(Context& ctx, float* dst, float alpha, const float* x, int64_t n) {
  if (n == 0) return;
  axpy_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dst, alpha, x, n);
  DITTO_CHECK_LAUNCH(ctx);
}
void scale(Context& ctx, float* p, float alpha, int64_t n) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(p, alpha, n);
  DITTO_CHECK_LAUNCH(ctx);
}
void add(Context& ctx, float* y, const float* a, const float* b, int64_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(y, a, b, n);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
