// Activations: ReLU, sigmoid, SiLU (x * sigmoid(x), "swish") and ReLU6 (min(max(x, 0), 6)).
// Forward and backward are elementwise (one thread per element, no reductions): deterministic.
// Each element's result depends only on its own inputs, so the launch shape cannot change bits.
//
// Backward inputs: relu and sigmoid differentiate from their OUTPUT (dx = dy * [y > 0],
// dx = dy * y * (1 - y)); silu and relu6 from their INPUT. At the kinks the gradient is 0:
// relu at x = 0, relu6 at x = 0 and x = 6 (as PyTorch's hardtanh backward).
// Backward contributions are fresh tensors handed to accumulate_grad: gradients accumulate.
#pragma once
#include "engine/context.h"
#include "engine/tape.h"

namespace ditto {

Var relu(Context& ctx, const Var& x);
Var sigmoid(Context& ctx, const Var& x);
Var silu(Context& ctx, const Var& x);
Var relu6(Context& ctx, const Var& x);

}  // namespace ditto
