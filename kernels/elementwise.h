// Elementwise ops: fill, in-place add and scale (used by the tape and optimizers), the
// differentiable add of two variables (residual connections) and flatten. All deterministic: one
// thread per element, no reductions (flatten runs no kernel at all).
#pragma once
#include "engine/context.h"
#include "engine/tape.h"

namespace ditto {

void fill(Context& ctx, Tensor& t, float value);
void add_inplace(Context& ctx, Tensor& dst, const Tensor& src);             // dst += src
void axpy_inplace(Context& ctx, Tensor& dst, float alpha, const Tensor& x); // dst += alpha * x
void scale_inplace(Context& ctx, Tensor& t, float alpha);                   // t *= alpha

// y = a + b (same shape); backward passes the gradient to both.
Var add(Context& ctx, const Var& a, const Var& b);

// y = x viewed as {N, product of x's other dims} (N = x's dim 0; a 1-D x becomes {N, 1}): the
// same storage, only the shape changes, so no kernel runs and CPU and CUDA share the code. The
// bytes are unchanged because ditto tensors are dense row-major NCHW: element (n, c, h, w) of x is
// element (n, (c*H + h)*W + w) of y, Keras's and PyTorch's channels-first flatten order.
// Backward gives x a copy of dy in x's shape: a copy rather than a second view because
// accumulate_grad takes a tensor its caller gives up, and dy still belongs to y.
Var flatten(Context& ctx, const Var& x);

}  // namespace ditto
