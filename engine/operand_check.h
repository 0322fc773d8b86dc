// Operand checks shared by every op (the engine's elementwise ops and the kernels' families):
// each names the op and the operand. The dtype checks also refuse a channels-last (Layout::Nhwc)
// tensor, except check_float_any_layout_on: an op reads channels-last memory only where it says so.
#pragma once
#include <string>

#include "engine/context.h"
#include "engine/error.h"

namespace ditto {

// t is a defined f32 tensor on ctx's device; throws ShapeError naming op and operand.
void check_f32_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what);
// t is a defined f32, bf16 or f16 tensor on ctx's device (the inputs of reduced-precision ops).
void check_float_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what);
// The same in either layout: for the ops that read channels-last tensors as they are (conv2d, batch
// norm, activations, add, pooling; each says so in its header).
void check_float_any_layout_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what);
// t is a defined i32 tensor (indices, labels) on ctx's device; throws ShapeError naming op and operand.
void check_i32_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what);
// t has exactly `ndim` dimensions.
void check_ndim(const Tensor& t, int ndim, const std::string& op, const std::string& what);
// t has exactly the shape `want` (an upstream gradient against its op's output, ...).
void check_shape(const Tensor& t, const Shape& want, const std::string& op, const std::string& what);

}  // namespace ditto
