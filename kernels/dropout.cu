// Dropout CUDA kernel: one thread per Philox counter (4 consecutive elements), grid-stride. The
// mask is a pure function of (key, index): no state, no reductions, deterministic, and the same
// bits as the CPU reference (same Philox, same float comparison, same single float multiply by a
// scale computed once on the host).
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/philox.h"
#include "kernels/detail/dropout_cuda.h"

namespace ditto::cuda {
namespace {


__global__ void dropout_kernel(const float* x, float* y, int64_t n, float p, float scale, uint64_t key) {
  const int64_t counters = (n + 3) / 4;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < counters; q += int64_t(gridDim.x) * blockDim.x) {
    const Philox4x32 r = philox4x32(static_cast<uint64_t>(q), 0, key);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = q * 4 + k;
      if (i < n) y[i] = philox_uniform(r.v[k]) < p ? 0.f : __fmul_rn(x[i], scale);
    }
  }
}

}  // namespace

void dropout_apply(Context& ctx, const float* x, float* y, int64_t n, float p, float scale, uint64_t key) {
  if (n == 0) return;
  const int64_t counters = (n + 3) / 4;
  int64_t blocks = (counters + kThreads - 1) / kThreads;
  if (blocks > 524280) blocks = 524280;
  dropout_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, detail::stream_of(ctx)>>>(x, y, n, p, scale, key);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
