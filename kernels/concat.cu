// Channel-op CUDA kernels (kernels/concat.h). Copies and the elementwise products run one
// thread per element; the ds reduction runs one warp per plane in a fixed order. All
// deterministic; the reasons are given per kernel.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/detail/float_map.cuh"
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

// Segments of copy_channels_many per launch (their table travels in the kernel's parameters).
constexpr int kSegments = 32;
struct Segments {
  ChannelCopy seg[kSegments];
};

__device__ __forceinline__ float added(float d, float s) { return __fadd_rn(d, s); }
__device__ __forceinline__ float4 added(float4 d, float4 s) {
  return make_float4(__fadd_rn(d.x, s.x), __fadd_rn(d.y, s.y), __fadd_rn(d.z, s.z), __fadd_rn(d.w, s.w));
}

// Block row blockIdx.y copies (or adds) segment blockIdx.y, V floats per thread step (V = 4 when
// hw is a multiple of 4, so every image's slice starts 16-byte aligned). One writer per element;
// a segment's mode is uniform over its blocks.
template <int V, class I>
__global__ void copy_segments_kernel(Segments s, I batch, I hw) {
  using T = typename std::conditional<V == 4, float4, float>::type;
  const ChannelCopy& g = s.seg[blockIdx.y];
  const I row = I(g.c) * hw / V, total = batch * row;  // vectors per image, in all
  const I src_stride = I(g.src_c) * hw / V, dst_stride = I(g.dst_c) * hw / V;
  const T* src = reinterpret_cast<const T*>(g.src) + I(g.src_off) * hw / V;
  T* dst = reinterpret_cast<T*>(g.dst) + I(g.dst_off) * hw / V;
  const bool accumulate = g.accumulate;
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * I(blockDim.x)) {
    const I n = i / row, r = i - n * row;
    const T v = src[n * src_stride + r];
    T& d = dst[n * dst_stride + r];
    d = accumulate ? added(d, v) : v;
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

void copy_channels_many(Context& ctx, const ChannelCopy* copies, int64_t count, int64_t batch, int64_t hw) {
  for (int64_t first = 0; first < count; first += kSegments) {
    Segments s{};
    const int64_t k = std::min<int64_t>(kSegments, count - first);
    int64_t largest = 0, widest = 0;
    for (int64_t i = 0; i < k; ++i) {
      s.seg[i] = copies[first + i];
      largest = std::max(largest, batch * s.seg[i].c * hw);
      widest = std::max({widest, batch * s.seg[i].src_c * hw, batch * s.seg[i].dst_c * hw});
    }
    if (largest == 0) continue;
    const bool v4 = hw % 4 == 0;
    const dim3 grid(blocks_for(v4 ? largest / 4 : largest), static_cast<unsigned>(k));
    cudaStream_t st = detail::stream_of(ctx);
    if (widest < int64_t(INT32_MAX)) {
      if (v4) copy_segments_kernel<4, int32_t><<<grid, kThreads, 0, st>>>(s, int32_t(batch), int32_t(hw));
      else copy_segments_kernel<1, int32_t><<<grid, kThreads, 0, st>>>(s, int32_t(batch), int32_t(hw));
    } else {
      if (v4) copy_segments_kernel<4, int64_t><<<grid, kThreads, 0, st>>>(s, batch, hw);
      else copy_segments_kernel<1, int64_t><<<grid, kThreads, 0, st>>>(s, batch, hw);
    }
    DITTO_CHECK_LAUNCH(ctx);
  }
}

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

namespace {
template <class T>
__device__ __forceinline__ float load_any(const void* p, DType t, int64_t i) {
  return t == DType::F32 ? static_cast<const float*>(p)[i]
         : t == DType::BF16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                            : __half2float(static_cast<const __half*>(p)[i]);
}
// The plane (n*C + c) of memory offset i.
__device__ __forceinline__ int64_t plane_of(int64_t i, int64_t c, int64_t hw, bool nhwc) {
  return nhwc ? (i / (hw * c)) * c + i % c : i / hw;
}
// out = a * s[plane] (a, out of type T), one thread per element.
template <class T>
__global__ void scale_planes_kernel(const T* __restrict__ a, DType ts, const void* __restrict__ s, T* __restrict__ out,
                                    int64_t n, int64_t c, int64_t hw, bool nhwc) {
  DITTO_GRID_STRIDE(i, n * c * hw) out[i] = from_f<T>(to_f(a[i]) * load_any<T>(s, ts, plane_of(i, c, hw, nhwc)));
}
// ds32[plane] = sum over the plane's (h, w) of dy * x. Block (t, n) owns planes (n, 32t..32t+31),
// one per thread column; the 16 threads of a column take pixels k, k+16, ... in increasing order
// and their sums are added in lane order: the same order for a shape on any GPU.
constexpr int kDotCols = 32, kDotLanes = 16;
template <class T>
__global__ void __launch_bounds__(kDotCols* kDotLanes) plane_dot_kernel(const T* __restrict__ x,
                                                                        const T* __restrict__ dy,
                                                                        float* __restrict__ ds, int64_t c, int64_t hw,
                                                                        bool nhwc) {
  const int64_t img = blockIdx.y, ch = int64_t(blockIdx.x) * kDotCols + threadIdx.x;
  float acc = 0.f;
  if (ch < c) {
    const int64_t base = nhwc ? img * hw * c + ch : (img * c + ch) * hw, step = nhwc ? c : 1;
    for (int64_t k = threadIdx.y; k < hw; k += kDotLanes) acc += to_f(dy[base + k * step]) * to_f(x[base + k * step]);
  }
  const float t = column_sum<kDotLanes>(acc);
  if (threadIdx.y == 0 && ch < c) ds[img * c + ch] = t;
}
}  // namespace

void channel_mul_fwd_any(Context& ctx, DType tx, bool nhwc, const void* x, DType ts, const void* s, void* y,
                         int64_t n, int64_t c, int64_t hw) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  with_float_type(tx, [&](auto tag) {
    using T = decltype(tag);
    scale_planes_kernel<T><<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<const T*>(x), ts, s, static_cast<T*>(y), n, c, hw, nhwc);
  });
  DITTO_CHECK_LAUNCH(ctx);
}

void channel_mul_bwd_any(Context& ctx, DType tx, bool nhwc, const void* x, DType ts, const void* s, const void* dy,
                         void* dx, float* ds32, int64_t n, int64_t c, int64_t hw) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  with_float_type(tx, [&](auto tag) {
    using T = decltype(tag);
    if (dx)
      scale_planes_kernel<T><<<blocks_for(total), kThreads, 0, st>>>(static_cast<const T*>(dy), ts, s,
                                                                     static_cast<T*>(dx), n, c, hw, nhwc);
    if (ds32)
      plane_dot_kernel<T><<<dim3(static_cast<unsigned>((c + kDotCols - 1) / kDotCols), static_cast<unsigned>(n)),
                            dim3(kDotCols, kDotLanes), 0, st>>>(static_cast<const T*>(x), static_cast<const T*>(dy),
                                                                ds32, c, hw, nhwc);
  });
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
