// Channel-op CUDA kernels (kernels/concat.h). Copies and the elementwise products run one
// thread per element; the ds reduction runs one warp per plane in a fixed order. All
// deterministic; the reasons are given per kernel.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/concat_cuda.h"

namespace ditto::cuda {
namespace {

// One thread per copied element; each element is written once by one thread: deterministic.
__global__ void copy_channels_kernel(const float* __restrict__ src, int64_t src_c, int64_t src_off,
                                     float* __restrict__ dst, int64_t dst_c, int64_t dst_off, int64_t batch,
                                     int64_t block) {  // strides, offsets and block are in elements (channels * hw)
  const int64_t total = batch * block;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / block, r = i - n * block;
    dst[n * dst_c + dst_off + r] = src[n * src_c + src_off + r];
  }
}

// Elementwise: y = x * s[plane] (also dx = dy * s[plane]). Deterministic.
__global__ void channel_mul_kernel(const float* __restrict__ x, const float* __restrict__ s, float* __restrict__ y,
                                   int64_t planes, int64_t hw) {
  const int64_t total = planes * hw;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] * s[i / hw];
}

constexpr int kWarpsPerBlock = 8;

// ds[p] = sum over plane p of dy * x, one warp per plane: lane l sums positions l, l+32, ... in
// ascending order (fma-free: product rounded, then added), then a fixed butterfly of
// __shfl_xor_sync. The order is a function of hw only, so the result is bit-reproducible; no
// atomics.
__global__ void channel_mul_ds_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                      float* __restrict__ ds, int64_t planes, int64_t hw) {
  const int lane = threadIdx.x & 31;
  for (int64_t p = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5); p < planes;
       p += int64_t(gridDim.x) * kWarpsPerBlock) {
    const float* xp = x + p * hw;
    const float* dp = dy + p * hw;
    float acc = 0.f;
    for (int64_t i = lane; i < hw; i += 32) acc = __fadd_rn(acc, __fmul_rn(dp[i], xp[i]));
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) ds[p] = acc;
  }
}

}  // namespace

// Offsets and channel counts are passed pre-multiplied by hw so the kernel indexes flat rows.
void copy_channels(Context& ctx, const float* src, int64_t src_c, int64_t src_off, float* dst, int64_t dst_c,
                   int64_t dst_off, int64_t batch, int64_t c, int64_t hw) {
  const int64_t n = batch * c * hw;
  if (n == 0) return;
  copy_channels_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(
      src, src_c * hw, src_off * hw, dst, dst_c * hw, dst_off * hw, batch, c * hw);
  DITTO_CHECK_LAUNCH(ctx);
}

void channel_mul_fwd(Context& ctx, const float* x, const float* s, float* y, int64_t planes, int64_t hw) {
  const int64_t n = planes * hw;
  if (n == 0) return;
  channel_mul_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, s, y, planes, hw);
  DITTO_CHECK_LAUNCH(ctx);
}

void channel_mul_bwd(Context& ctx, const float* x, const float* s, const float* dy, float* dx, float* ds,
                     int64_t planes, int64_t hw) {
  if (planes * hw == 0) return;
  if (dx) {
    channel_mul_kernel<<<blocks_for(planes * hw), kThreads, 0, detail::stream_of(ctx)>>>(dy, s, dx, planes, hw);
    DITTO_CHECK_LAUNCH(ctx);
  }
  if (ds) {
    const int64_t b = (planes + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const unsigned blocks = static_cast<unsigned>(b < 524280 ? b : 524280);
    channel_mul_ds_kernel<<<blocks, 32 * kWarpsPerBlock, 0, detail::stream_of(ctx)>>>(x, dy, ds, planes, hw);
    DITTO_CHECK_LAUNCH(ctx);
  }
}

}  // namespace ditto::cuda
