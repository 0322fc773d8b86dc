// Internal: CUDA launchers of engine/tensor_ops.cu.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ditto { class Context; }

namespace ditto::cuda {
void fill(Context& ctx, float* p, int64_t n, float v);
void axpy(Context& ctx, float* dst, float alpha, const float* x, int64_t n);
void scale(Context& ctx, float* p, float alpha, int64_t n);
// float -> bf16/f16 bits (round to nearest even) and back (exact); bf16 picks the format (else f16).
void narrow(Context& ctx, const float* src, uint16_t* dst, int64_t n, bool bf16);
void widen(Context& ctx, const uint16_t* src, float* dst, int64_t n, bool bf16);
// dst[n][j][i] = src[n][i][j] for each of `batch` rows x cols matrices, converted between float
// dtypes (DType's values: F32, BF16, F16).
void transpose_convert(Context& ctx, const void* src, DType from, void* dst, DType to, int64_t batch, int64_t rows,
                       int64_t cols);
// out[i] = words' i-th (low, high) pair as int64, saturated to int32 (engine/tensor_ops.h).
void narrow_int64_words(Context& ctx, const int32_t* words, int32_t* out, int64_t n);
// out = a + b over n elements of float dtype t (out may be a).
void add_any(Context& ctx, DType t, const void* a, const void* b, void* out, int64_t n);
}  // namespace ditto::cuda
