// Elementwise ops: fill, in-place add and scale (used by the tape and optimizers), and the
// differentiable add of two variables (residual connections). All deterministic: one thread
// per element, no reductions.
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

}  // namespace ditto
