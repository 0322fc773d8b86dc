// The engine's elementwise CUDA kernels (engine/tensor_ops.h). Deterministic: one thread per
// element (grid-stride), no atomics, the CPU loop's expression per element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/tensor_ops_cuda.h"
#include "engine/detail/launch.cuh"
#include "engine/detail/float_map.cuh"
#include "engine/detail/int64_words.h"

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
// A pair's int64 value saturated to int32: the low word where it fits, else the limit on the high
// word's side.
__global__ void narrow_int64_words_kernel(const int2* __restrict__ words, int32_t* __restrict__ out, int64_t n) {
  DITTO_GRID_STRIDE(i, n) {
    const int2 w = words[i];
    out[i] = detail::int64_words_fit_int32(w.x, w.y)
                 ? w.x
                 : (w.y < 0 ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int32_t>::max());
  }
}

// One 32x32 tile of a batched transpose through shared memory, so that both the reads and the
// writes of a warp are contiguous; the conversion happens on the way through (float in between).
constexpr int kTile = 32;

__device__ float load_as_float(const void* p, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  if (t == DType::BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ void store_from_float(void* p, DType t, int64_t i, float v) {
  if (t == DType::F32) static_cast<float*>(p)[i] = v;
  else if (t == DType::BF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}

// grid: (col tiles, row tiles, batch); block: 32 x 8 threads, each thread 4 rows of the tile.
__global__ void transpose_convert_kernel(const void* src, DType from, void* dst, DType to, int64_t rows,
                                         int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t b = blockIdx.z, r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int64_t base = b * rows * cols;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = load_as_float(src, from, base + r * cols + c);
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) store_from_float(dst, to, base + c * rows + r, tile[threadIdx.x][k]);
  }
}

// The same move for matrices with a side shorter than a tile (a filter's R*S = 9 positions), where
// the tiles would be mostly empty: one thread per destination element, writes contiguous, reads
// gathered (the matrices are small and stay in cache).
__global__ void transpose_convert_narrow_kernel(const void* src, DType from, void* dst, DType to, int64_t batch,
                                                int64_t rows, int64_t cols) {
  DITTO_GRID_STRIDE(i, batch * rows * cols) {
    const int64_t b = i / (rows * cols), rem = i - b * rows * cols, c = rem / rows, r = rem - c * rows;
    store_from_float(dst, to, i, load_as_float(src, from, (b * rows + r) * cols + c));
  }
}

}  // namespace

void transpose_convert(Context& ctx, const void* src, DType from, void* dst, DType to, int64_t batch, int64_t rows,
                       int64_t cols) {
  if (batch == 0 || rows == 0 || cols == 0) return;
  if (rows < kTile || cols < kTile) {
    const int64_t n = batch * rows * cols;
    transpose_convert_narrow_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(src, from, dst, to, batch,
                                                                                            rows, cols);
  } else {
    const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile), unsigned(batch));
    transpose_convert_kernel<<<grid, dim3(kTile, 8), 0, detail::stream_of(ctx)>>>(src, from, dst, to, rows, cols);
  }
  DITTO_CHECK_LAUNCH(ctx);
}

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
void narrow_int64_words(Context& ctx, const int32_t* words, int32_t* out, int64_t n) {
  if (n == 0) return;
  narrow_int64_words_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(
      reinterpret_cast<const int2*>(words), out, n);
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

namespace {
struct Plus {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
}  // namespace

void add_any(Context& ctx, DType t, const void* a, const void* b, void* out, int64_t n) {
  map2(detail::stream_of(ctx), t, a, b, out, n, Plus{});
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
