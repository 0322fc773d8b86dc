// The engine's own elementwise ops on tensors: fill (Context::full, batch-norm resets), in-place
// add (the tape accumulating gradients), axpy and scale (optimizers, loss sums), and the dtype
// conversions of reduced-precision layers (kernels/precision.h). CPU loops and
// CUDA kernels (engine/tensor_ops.cu) compute the same expression per element. All deterministic:
// one thread per element, no reductions. Differentiable ops on variables (add, flatten) are in
// kernels/elementwise.h.
#pragma once
#include "engine/context.h"

namespace ditto {

void fill(Context& ctx, Tensor& t, float value);
void add_inplace(Context& ctx, Tensor& dst, const Tensor& src);             // dst += src
void axpy_inplace(Context& ctx, Tensor& dst, float alpha, const Tensor& x); // dst += alpha * x
void scale_inplace(Context& ctx, Tensor& t, float alpha);                   // t *= alpha

// t in dtype (float dtypes only): f32 -> bf16/f16 rounds each value to nearest, ties to even
// (overflow to infinity, as the toolkit's __float2bfloat16_rn / __float2half_rn do on both CPU and
// GPU); bf16/f16 -> f32 is exact; bf16 <-> f16 goes through f32. The same dtype returns t itself.
Tensor to_dtype(Context& ctx, const Tensor& t, DType dtype);

// Channels-last copies for the tensor-core convolutions (kernels/conv2d.h's layout knob), each one
// pass that also converts to `dtype` (rounding as to_dtype does): a 4-D {N,C,H,W} tensor becomes
// {N,H,W,C} (a filter {K,C,R,S} becomes {K,R,S,C}), and back. Float dtypes only; pure data
// movement besides the rounding, so deterministic.
Tensor to_channels_last(Context& ctx, const Tensor& nchw, DType dtype);
Tensor from_channels_last(Context& ctx, const Tensor& nhwc, DType dtype);

}  // namespace ditto
