// Differentiable elementwise ops on variables: add of two variables (residual connections) and
// flatten. Deterministic: one thread per element, no reductions (flatten runs no kernel at all).
// The tensor ops fill, add_inplace, axpy_inplace and scale_inplace are the engine's
// (engine/tensor_ops.h, included here).
#pragma once
#include "engine/context.h"
#include "engine/tensor_ops.h"
#include "engine/tape.h"

namespace ditto {

// y = a + b (same shape, float dtype and layout: bf16/f16 add in float and round once, as
// engine/tensor_ops.h's add_into; channels-last operands as they are); backward passes the
// gradient to both.
Var add(Context& ctx, const Var& a, const Var& b);

// y = x viewed as {N, product of x's other dims} (N = x's dim 0; a 1-D x becomes {N, 1}): the
// same storage, only the shape changes, so no kernel runs and CPU and CUDA share the code. The
// bytes are unchanged because ditto tensors are dense row-major NCHW: element (n, c, h, w) of x is
// element (n, (c*H + h)*W + w) of y, Keras's and PyTorch's channels-first flatten order.
// Backward gives x a copy of dy in x's shape: a copy rather than a second view because
// accumulate_grad takes a tensor its caller gives up, and dy still belongs to y. Any float dtype;
// a channels-last x is first moved into NCHW order (one pass, the same dtype), and its gradient
// moved back, so the order is channels-first whatever the layout.
Var flatten(Context& ctx, const Var& x);
// x in another dtype and layout (engine/tensor_ops.h's to_form: narrowing rounds to nearest even,
// widening is exact), differentiably: the gradient comes back converted to x's dtype and layout.
// No pass when x is already in that form. Where an op computes in fp32 on a native bf16 tensor
// (the loss on bf16 logits) this is autocast's cast.
Var cast(Context& ctx, const Var& x, DType dtype, Layout layout = Layout::Nchw);

}  // namespace ditto
