// Internal: elementwise kernels over tensors of any float dtype (f32, bf16, f16). Each element is
// read widened to float, the functor computes in float, and the result is rounded once to the
// output's dtype (round to nearest even, the toolkit's conversions): the CPU reference that widens,
// computes the same float expression and narrows gets the same bits. One thread per vector of
// elements, no reductions, so deterministic whatever the launch shape. Vectors are 16 bytes (4
// floats or 8 halves) when every operand's element count is a multiple of the vector, else single
// elements; the arena's allocations are 256-byte aligned.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/error.h"
#include "engine/tensor.h"

namespace ditto::cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// out = f(a) (one input) over n elements.
template <class T, int V, class F>
__global__ void map1_kernel(const T* __restrict__ a, T* __restrict__ out, int64_t vectors, F f) {
  DITTO_GRID_STRIDE(i, vectors) {
    const Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[i];
    Pack<T, V> po;
#pragma unroll
    for (int k = 0; k < V; ++k) po.v[k] = from_f<T>(f(to_f(pa.v[k])));
    reinterpret_cast<Pack<T, V>*>(out)[i] = po;
  }
}

// out = f(a, b) over n elements (out may be a: in-place).
template <class T, int V, class F>
__global__ void map2_kernel(const T* a, const T* __restrict__ b, T* out, int64_t vectors, F f) {
  DITTO_GRID_STRIDE(i, vectors) {
    const Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[i];
    const Pack<T, V> pb = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> po;
#pragma unroll
    for (int k = 0; k < V; ++k) po.v[k] = from_f<T>(f(to_f(pa.v[k]), to_f(pb.v[k])));
    reinterpret_cast<Pack<T, V>*>(out)[i] = po;
  }
}

template <class T, class F>
void launch_map1(cudaStream_t s, const void* a, void* out, int64_t n, F f) {
  constexpr int V = 16 / sizeof(T);
  if (n % V == 0)
    map1_kernel<T, V><<<blocks_for(n / V), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<T*>(out), n / V, f);
  else
    map1_kernel<T, 1><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<T*>(out), n, f);
}
template <class T, class F>
void launch_map2(cudaStream_t s, const void* a, const void* b, void* out, int64_t n, F f) {
  constexpr int V = 16 / sizeof(T);
  if (n % V == 0)
    map2_kernel<T, V><<<blocks_for(n / V), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                              static_cast<T*>(out), n / V, f);
  else
    map2_kernel<T, 1><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                          static_cast<T*>(out), n, f);
}

// Calls fn(T{}) with T the storage type of float dtype t (float, __nv_bfloat16, __half); I32 is a
// programming error of the caller.
template <class Fn>
void with_float_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(float{});
    case DType::BF16: return fn(__nv_bfloat16{});
    case DType::F16: return fn(__half{});
    default: throw Error("float_map: an i32 tensor reached a float kernel");
  }
}

// out[i] = f(x[i], channel of i) over a channels-last tensor of C channels (its memory an M x C
// matrix), one thread per vector of V elements (V divides C), rounded once to T.
template <class T, int V, class F>
__global__ void channel_map_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t vectors, int64_t c, F f) {
  DITTO_GRID_STRIDE(i, vectors) {
    const int64_t c0 = (i * V) % c;
    const Pack<T, V> px = reinterpret_cast<const Pack<T, V>*>(x)[i];
    Pack<T, V> po;
#pragma unroll
    for (int k = 0; k < V; ++k) po.v[k] = from_f<T>(f(to_f(px.v[k]), c0 + k));
    reinterpret_cast<Pack<T, V>*>(out)[i] = po;
  }
}
// The launch: 16-byte vectors when C allows, else single elements.
template <class T, class F>
void launch_channel_map(cudaStream_t s, const void* x, void* out, int64_t total, int64_t c, F f) {
  constexpr int V = 16 / sizeof(T);
  if (c % V == 0)
    channel_map_kernel<T, V><<<blocks_for(total / V), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(out),
                                                                       total / V, c, f);
  else
    channel_map_kernel<T, 1><<<blocks_for(total), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(out),
                                                                   total, c, f);
}

// Column sums of a block of 32 x Lanes threads (threadIdx.x a column, threadIdx.y a lane): each
// thread's v, and the Lanes values of a column added in lane order, a fixed order. Every thread of
// the block must call it (it synchronizes, before and after); the sum is valid where threadIdx.y == 0.
template <int Lanes>
__device__ __forceinline__ float column_sum(float v) {
  __shared__ float lane[Lanes][32];
  lane[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  float t = lane[0][threadIdx.x];
  if (threadIdx.y == 0)
#pragma unroll
    for (int k = 1; k < Lanes; ++k) t += lane[k][threadIdx.x];
  __syncthreads();
  return t;
}

// The launches for a float dtype (F32, BF16, F16).
template <class F>
void map1(cudaStream_t s, DType t, const void* a, void* out, int64_t n, F f) {
  if (n == 0) return;
  with_float_type(t, [&](auto tag) { launch_map1<decltype(tag)>(s, a, out, n, f); });
}
template <class F>
void map2(cudaStream_t s, DType t, const void* a, const void* b, void* out, int64_t n, F f) {
  if (n == 0) return;
  with_float_type(t, [&](auto tag) { launch_map2<decltype(tag)>(s, a, b, out, n, f); });
}

// One launch over n elements for the storage type of t: fn(T{}, blocks, stream) launches the kernel
// (blocks_for(n) blocks of kThreads); nothing when n == 0; the launch is checked.
template <class Fn>
void launch_for_float_type(Context& ctx, DType t, int64_t n, Fn&& fn) {
  if (n == 0) return;
  with_float_type(t, [&](auto tag) { fn(tag, blocks_for(n), detail::stream_of(ctx)); });
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
