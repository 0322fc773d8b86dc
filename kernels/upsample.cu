// Upsampling CUDA kernels; the per-element arithmetic is kernels/upsample_ref.h's, shared with the
// CPU (the gather below is exactly the function tests/cpu_upsample.cpp checks on the host).
//
// upsample_fwd_kernel: one thread per output, no reduction: deterministic.
// upsample_bwd_atomic_kernel: one thread per OUTPUT atomicAdds (wy * wx) * dy into each tap of
//   dx. Outputs share taps, so the float adds land in the order threads arrive: NOT deterministic
//   (CCCL's not_guaranteed).
// upsample_bwd_gather_kernel: one thread per INPUT sums the same contributions in a fixed order
//   (ref::upsample_gather_at): each dx is written by one thread, no atomics, and the order depends
//   on the shapes alone: deterministic on any GPU (CCCL's gpu_to_gpu).
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/upsample_cuda.h"

namespace ditto::cuda {
namespace {

// (plane, row, column) of flat index i of planes of h x w.
__device__ __forceinline__ void split_plane(int64_t i, int64_t h, int64_t w, int64_t& pl, int64_t& y, int64_t& x) {
  const int64_t q = ref::div_nonneg(i, w);
  x = i - q * w;
  pl = ref::div_nonneg(q, h);
  y = q - pl * h;
}

__global__ void upsample_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, ref::UpsampleDims d) {
  const int64_t total = d.planes * d.oh * d.ow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t pl, oh, ow;
    split_plane(i, d.oh, d.ow, pl, oh, ow);
    y[i] = ref::upsample_fwd_at<float>(x + pl * d.h * d.w, oh, ow, d);
  }
}

__global__ void upsample_bwd_atomic_kernel(const float* __restrict__ dy, float* __restrict__ dx, ref::UpsampleDims d) {
  const int64_t total = d.planes * d.oh * d.ow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t pl, oh, ow;
    split_plane(i, d.oh, d.ow, pl, oh, ow);
    float* dxp = dx + pl * d.h * d.w;
    const float g = dy[i];
    if (!d.bilinear) {
      atomicAdd(dxp + ref::nearest_src(oh, d.h, d.oh) * d.w + ref::nearest_src(ow, d.w, d.ow), g);
      continue;
    }
    const ref::LinearTap<float> th = ref::linear_tap<float>(oh, d.h, d.oh, d.align_corners);
    const ref::LinearTap<float> tw = ref::linear_tap<float>(ow, d.w, d.ow, d.align_corners);
    atomicAdd(dxp + th.i0 * d.w + tw.i0, ref::mul_rn(ref::mul_rn(th.l0, tw.l0), g));
    atomicAdd(dxp + th.i0 * d.w + tw.i1, ref::mul_rn(ref::mul_rn(th.l0, tw.l1), g));
    atomicAdd(dxp + th.i1 * d.w + tw.i0, ref::mul_rn(ref::mul_rn(th.l1, tw.l0), g));
    atomicAdd(dxp + th.i1 * d.w + tw.i1, ref::mul_rn(ref::mul_rn(th.l1, tw.l1), g));
  }
}

__global__ void upsample_bwd_gather_kernel(const float* __restrict__ dy, float* __restrict__ dx, ref::UpsampleDims d) {
  const int64_t total = d.planes * d.h * d.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t pl, ih, iw;
    split_plane(i, d.h, d.w, pl, ih, iw);
    dx[i] = ref::upsample_gather_at<float>(dy + pl * d.oh * d.ow, ih, iw, d);
  }
}

}  // namespace

void upsample_fwd(Context& ctx, const float* x, float* y, const ref::UpsampleDims& d) {
  const int64_t n = d.planes * d.oh * d.ow;
  if (n == 0) return;
  upsample_fwd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(x, y, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void upsample_bwd_atomic(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d) {
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t in = d.planes * d.h * d.w, n = d.planes * d.oh * d.ow;
  if (in > 0) DITTO_CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(float) * static_cast<std::size_t>(in), st));
  if (n == 0) return;
  upsample_bwd_atomic_kernel<<<blocks_for(n), kThreads, 0, st>>>(dy, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void upsample_bwd_gather(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d) {
  const int64_t n = d.planes * d.h * d.w;
  if (n == 0) return;
  upsample_bwd_gather_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(dy, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
