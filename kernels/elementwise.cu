// The CUDA kernel of kernels/elementwise.h's add. Deterministic: one thread per element
// (grid-stride), no atomics.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/elementwise_cuda.h"

namespace ditto::cuda {
namespace {

__global__ void add_kernel(float* y, const float* a, const float* b, int64_t n) {
  DITTO_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

}  // namespace

void add(Context& ctx, float* y, const float* a, const float* b, int64_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(y, a, b, n);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
