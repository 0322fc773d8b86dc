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
// dst += src: f32 (axpy), or any float dtype and either layout, dst and src alike (the sum in
// float, rounded once to the dtype: the tape accumulating bf16 gradients).
void add_inplace(Context& ctx, Tensor& dst, const Tensor& src);
// out = a + b, all three of one shape, float dtype and layout (out may be a); rounded as add_inplace.
void add_into(Context& ctx, Tensor& out, const Tensor& a, const Tensor& b);
void axpy_inplace(Context& ctx, Tensor& dst, float alpha, const Tensor& x); // dst += alpha * x
void scale_inplace(Context& ctx, Tensor& t, float alpha);                   // t *= alpha

// t in dtype, in t's layout (float dtypes only): f32 -> bf16/f16 rounds each value to nearest, ties to even
// (overflow to infinity, as the toolkit's __float2bfloat16_rn / __float2half_rn do on both CPU and
// GPU); bf16/f16 -> f32 is exact; bf16 <-> f16 goes through f32. The same dtype returns t itself.
Tensor to_dtype(Context& ctx, const Tensor& t, DType dtype);

// Channels-last copies for the tensor-core convolutions (kernels/conv2d.h's layout knob), each one
// pass that also converts to `dtype` (rounding as to_dtype does): a 4-D NCHW tensor becomes a
// Layout::Nhwc tensor of the same (logical) shape, whose memory is N, H, W, C (a filter's K, R, S,
// C), and back. A tensor already in the asked layout is only converted (to_dtype). Float dtypes
// only; pure data movement besides the rounding, so deterministic.
Tensor to_channels_last(Context& ctx, const Tensor& t, DType dtype);
Tensor from_channels_last(Context& ctx, const Tensor& t, DType dtype);
// t in dtype and layout: whichever of the three above applies (none when t already is).
Tensor to_form(Context& ctx, const Tensor& t, DType dtype, Layout layout);

// int64 values held as (low, high) pairs of i32 words, how another framework's int64 indices and
// labels cross into ditto without a conversion pass of their own, as an i32 tensor of `shape`
// (words holds 2 * numel(shape) i32 elements on the context's device). A value outside int32 is
// never wrapped (2^32 + 3 would become 3, a valid row): the CPU raises a DataError naming the
// element and its value; the GPU, which cannot raise, saturates it to int32's limits, out of range
// for every table, class count and length the ops take, so the ops' own device checks meet it like
// any other bad value. One thread per element; a map, deterministic.
Tensor narrow_int64_words(Context& ctx, const Tensor& words, const Shape& shape);

}  // namespace ditto
