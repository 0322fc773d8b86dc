// The engine's own elementwise ops on tensors: fill (Context::full, batch-norm resets), in-place
// add (the tape accumulating gradients), axpy and scale (optimizers, loss sums). CPU loops and
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

}  // namespace ditto
