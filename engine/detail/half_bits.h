// Internal: one bf16/f16 value <-> float, on the host, through the CUDA toolkit's own conversions
// (cuda_bf16.h, cuda_fp16.h declare them __host__ __device__). The GPU kernels call the same
// functions, so a CPU reference rounds bit for bit as the GPU does: round to nearest, ties to even,
// overflow to infinity, NaN kept NaN. tests/cpu_precision.cpp pins the edge cases, and the GPU
// test compares both sides over millions of values.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "engine/tensor.h"

namespace ditto::detail {

inline uint16_t float_to_half_bits(DType t, float v) {
  if (t == DType::BF16) return __nv_bfloat16_raw(__float2bfloat16_rn(v)).x;
  return __half_raw(__float2half_rn(v)).x;
}

inline float half_bits_to_float(DType t, uint16_t bits) {
  if (t == DType::BF16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// v rounded to t's precision and widened back: the value a tensor of dtype t would hold.
inline float round_through(DType t, float v) { return half_bits_to_float(t, float_to_half_bits(t, v)); }

}  // namespace ditto::detail
