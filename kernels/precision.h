// The precision knob of the layers whose products can run on tensor cores (conv2d.precision in
// kernels/conv2d.cpp, linear.precision in kernels/linear.cpp). It decides where the op rounds,
// not the order it sums in: what the op's algorithm promises holds under every precision, and no
// mode word changes precision (every mode picks fp32; a run asks with `--precision` or a pin).
//
// The autocast rules, written once:
//   fp32  reads and writes fp32; products on FMA units (no tensor cores).
//   tf32  reads fp32 and rounds inputs to TF32 inside the library (10-bit mantissa), tensor cores,
//         fp32 accumulation and output. The CPU reference does not emulate TF32's rounding.
//   bf16, fp16
//         the op reads its inputs rounded to bf16/fp16 (round to nearest, ties to even: to_dtype in
//         engine/tensor_ops.h), multiplies on tensor cores, accumulates in fp32, and rounds its
//         output (forward: y; backward: dx and dw) to bf16/fp16, which the next op reads widened
//         to fp32 — or, under conv2d.output=native (kernels/conv2d.h), reads as it is: batch norm,
//         activations, adds and pooling then read bf16/fp16 (channels-last with layout=nhwc),
//         compute in fp32 and round their own results once, as PyTorch's autocast does. Weights
//         stay fp32 masters: each step reads them rounded, and their gradients arrive rounded to
//         the precision, then accumulate and update in fp32. Everything else (batch-norm
//         statistics, softmax, losses, reductions, the optimizer) computes in fp32.
//         The CPU reference rounds at exactly these points (the same conversions), accumulating
//         in double in between; fp16 training scales its loss so small gradients survive
//         (engine/loss_scale.h).
#pragma once
#include <functional>
#include <vector>

#include "engine/context.h"
#include "engine/knob.h"

namespace ditto {

enum class Precision { Fp32, Tf32, Bf16, Fp16 };
const char* name_of(Precision p);
inline const char* knob_name(Precision) { return "precision"; }
// The knob's variants, in Precision's order, for every family that registers a precision knob.
std::vector<VariantSpec> precision_variants();
// The dtype the op's inputs and outputs are rounded to: F32 for fp32 and tf32.
DType precision_dtype(Precision p);
bool is_reduced(Precision p);  // bf16 or fp16
// "fp32", "tf32", "bf16", "fp16" -> the Precision; anything else throws PolicyError listing them.
Precision parse_precision(const std::string& name);

// A CPU reference product in a precision: `reference` writes its float result (having read its
// operands widened to float), which is then rounded to dtype, where the GPU library rounds its
// output. The result is in dtype.
Tensor rounded_reference(Context& ctx, DType dtype, const Shape& shape, const std::function<void(float*)>& reference);

}  // namespace ditto
