#include "engine/operand_check.h"

#include <fmt/format.h>

namespace ditto {
namespace {

void check_dtype_on(const Context& ctx, const Tensor& t, DType want, const std::string& op, const std::string& what,
                    bool any_layout = false) {
  if (!t.defined()) throw ShapeError(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() != want)
    throw ShapeError(fmt::format("{}: {} must be {}, is {}", op, what, dtype_name(want), dtype_name(t.dtype())));
  if (t.device() != ctx.device())
    throw ShapeError(fmt::format("{}: {} is on {} but the context is on {}", op, what, t.device().str(), ctx.device().str()));
  if (!any_layout && t.channels_last())
    throw ShapeError(fmt::format("{}: {} {} is channels-last (nhwc), and this op reads NCHW tensors only; convert it "
                                 "(from_channels_last) or keep the layer before it in NCHW",
                                 op, what, shape_str(t.shape())));
}

}  // namespace

void check_f32_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what) {
  check_dtype_on(ctx, t, DType::F32, op, what);
}

void check_float_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what) {
  check_dtype_on(ctx, t, t.defined() && is_float(t.dtype()) ? t.dtype() : DType::F32, op, what);
}

void check_float_any_layout_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what) {
  check_dtype_on(ctx, t, t.defined() && is_float(t.dtype()) ? t.dtype() : DType::F32, op, what, true);
}

void check_i32_on(const Context& ctx, const Tensor& t, const std::string& op, const std::string& what) {
  check_dtype_on(ctx, t, DType::I32, op, what);
}

void check_ndim(const Tensor& t, int ndim, const std::string& op, const std::string& what) {
  if (t.ndim() != ndim)
    throw ShapeError(fmt::format("{}: {} must have {} dimensions, has shape {}", op, what, ndim, shape_str(t.shape())));
}

void check_shape(const Tensor& t, const Shape& want, const std::string& op, const std::string& what) {
  if (t.shape() != want)
    throw ShapeError(fmt::format("{}: {} has shape {}, expected {}", op, what, shape_str(t.shape()), shape_str(want)));
}

}  // namespace ditto
