// The engine's elementwise CUDA kernels (engine/tensor_ops.h). Deterministic: one thread per
// element (grid-stride), no atomics, the CPU loop's expression per element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
// The toolkit's conversions, as engine/detail/half_bits.h calls them on the host.
__global__ void narrow_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  DITTO_GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}
__global__ void narrow_f16_kernel(const float* src, __half* dst, int64_t n) {
  DITTO_GRID_STRIDE(i, n) dst[i] = __float2half_rn(src[i]);
}
__global__ void widen_bf16_kernel(const __nv_bfloat16* src, float* dst, int64_t n) {
  DITTO_GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}
__global__ void widen_f16_kernel(const __half* src, float* dst, int64_t n) {
  DITTO_GRID_STRIDE(i, n) dst[i] = __half2float(src[i]);
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

void narrow(Context& ctx, const float* src, uint16_t* dst, int64_t n, bool bf16) {
  if (n == 0) return;
  if (bf16)
    narrow_bf16_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(src, reinterpret_cast<__nv_bfloat16*>(dst), n);
  else
    narrow_f16_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(src, reinterpret_cast<__half*>(dst), n);
  DITTO_CHECK_LAUNCH(ctx);
}
void widen(Context& ctx, const uint16_t* src, float* dst, int64_t n, bool bf16) {
  if (n == 0) return;
  if (bf16)
    widen_bf16_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(reinterpret_cast<const __nv_bfloat16*>(src), dst, n);
  else
    widen_f16_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(reinterpret_cast<const __half*>(src), dst, n);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
