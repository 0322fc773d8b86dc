// Internal (CUDA only): the two-level fixed-order sum of kernels/reduction.cu and
// kernels/pixel_xent.cu, and the one-warp-atomics alternative they offer beside it.
//
// Geometry: `parts` blocks of kSumBlock threads, parts = fixed_sum_parts(n, per_thread), a function
// of n alone (never of the GPU). Thread t of block b takes the elements i = b * kSumBlock + t + k *
// parts * kSumBlock in increasing k and adds them from 0.0f. Then
//   fixed order: the block's sums are combined by BlockSum (kernels/detail/reduce.cuh, an order set
//                by the block size) into partials[b]; fixed_sum_final_kernel, one block of
//                kSumMaxParts threads, adds the partials with BlockSum. The same bits for a given n
//                on any GPU (CCCL's gpu_to_gpu).
//   atomic:      each warp's 32 sums are combined by WarpSum and lane 0 atomicAdds the result into
//                the output, in the order warps arrive: NOT deterministic (not_guaranteed).
#pragma once
#include <cstdint>

#include "kernels/detail/reduce.cuh"

namespace ditto::cuda {

constexpr int kSumBlock = 256;
constexpr int kSumMaxParts = 1024;

// Blocks (and partial sums) for n elements at about per_thread elements a thread.
inline int64_t fixed_sum_parts(int64_t n, int64_t per_thread) {
  const int64_t p = (n + kSumBlock * per_thread - 1) / (kSumBlock * per_thread);
  return p < 1 ? 1 : (p > kSumMaxParts ? kSumMaxParts : p);
}

// Combines each thread's sum `v` of its elements: into partials[blockIdx.x] in a fixed order, or
// by atomics into *out. Every thread of the block must call it.
template <bool kAtomic>
__device__ __forceinline__ void fixed_sum_block(float v, float* out) {
  if constexpr (kAtomic) {
    __shared__ WarpSum::TempStorage warp_tmp[kSumBlock / 32];
    const float w = WarpSum(warp_tmp[threadIdx.x >> 5]).Sum(v);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, w);
  } else {
    __shared__ typename BlockSum<kSumBlock>::TempStorage tmp;
    const float s = BlockSum<kSumBlock>(tmp).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
  }
}

// out[0] = (sum of partials[0 .. parts)) / divisor, divisor = float(*count) when count is set, else
// denom. One block of kSumMaxParts threads, thread t holding partial t.
template <int kUnused = 0>
__global__ void __launch_bounds__(kSumMaxParts)
    fixed_sum_final_kernel(const float* partials, int64_t parts, const int32_t* count, float denom, float* out) {
  __shared__ typename BlockSum<kSumMaxParts>::TempStorage tmp;
  const float v = threadIdx.x < parts ? partials[threadIdx.x] : 0.f;
  const float s = BlockSum<kSumMaxParts>(tmp).Sum(v);
  if (threadIdx.x == 0) out[0] = s / (count ? static_cast<float>(*count) : denom);
}

// out[0] /= divisor (as above): how the atomic variants finish a mean.
template <int kUnused = 0>
__global__ void divide_scalar_kernel(float* out, const int32_t* count, float denom) {
  out[0] = out[0] / (count ? static_cast<float>(*count) : denom);
}

}  // namespace ditto::cuda
