// The engine's elementwise CUDA kernels (engine/tensor_ops.h). Deterministic: one thread per
// element (grid-stride), no atomics, the CPU loop's expression per element.
#include "engine/detail/cuda_state.h"
#include "engine/detail/tensor_ops_cuda.h"
#include "engine/detail/launch.cuh"

namespace ditto::cuda {
namespace {

__global__ void fill_kernel(float* p, int64_t n, float v) { DITTO_GRID_STRIDE(i, n) p[i] = v; }
__global__ void axpy_kernel(float* dst, float alpha, const float* x, int64_t n) {
  DITTO_GRID_STRIDE(i, n) dst[i] += alpha * x[i];
}
__global__ void scale_kernel(float* p, float alpha, int64_t n) { DITTO_GRID_STRIDE(i, n) p[i] *= alpha; }

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

}  // namespace ditto::cuda
