#include "kernels/elementwise.h"

#include <fmt/format.h>

#include "engine/operand_check.h"
#include "kernels/detail/elementwise_cuda.h"

namespace ditto {

Var add(Context& ctx, const Var& a, const Var& b) {
  check_float_any_layout_on(ctx, a.value(), "add", "a");
  check_float_any_layout_on(ctx, b.value(), "add", "b");
  if (a.shape() != b.shape())
    throw ShapeError(fmt::format("add: shapes {} and {} differ", shape_str(a.shape()), shape_str(b.shape())));
  if (a.value().dtype() != b.value().dtype() || a.value().layout() != b.value().layout())
    throw ShapeError(fmt::format("add: a is {} and b is {}; both operands need one dtype and layout (a residual "
                                 "branch and its shortcut must hand on the same form)",
                                 a.value().type_tag(), b.value().type_tag()));
  Tensor y = ctx.empty(a.shape(), a.value().dtype(), a.value().layout());
  int64_t n = y.numel();
  if (a.value().dtype() != DType::F32) {
    add_into(ctx, y, a.value(), b.value());
  } else if (ctx.is_cuda()) {
    cuda::add(ctx, y.f32(), a.value().f32(), b.value().f32(), n);
  } else {
    const float* pa = a.value().f32();
    const float* pb = b.value().f32();
    float* py = y.f32();
    for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
  }
  bool grad = needs_grad(ctx, {&a, &b});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("add", "", {{"a", a}, {"b", b}}, out,
                      [ar = a.grad_ref(), br = b.grad_ref(), outr = out.grad_ref()](Context& c) {
      if (!outr.grad().defined()) return;
      // Gradients are moved into variables and must not alias: b gets a copy (taken first, since
      // a and b may be one variable), a the upstream gradient itself.
      if (br.requires_grad()) accumulate_grad(c, br, ar.requires_grad() ? c.to_device(outr.grad()) : pass_grad(c, outr));
      if (ar.requires_grad()) accumulate_grad(c, ar, pass_grad(c, outr));
    });
  }
  return out;
}

Var flatten(Context& ctx, const Var& x) {
  check_float_any_layout_on(ctx, x.value(), "flatten", "x");
  if (x.value().ndim() < 1) throw ShapeError("flatten: x is a scalar (0 dims); need the batch dimension first");
  const Shape& s = x.shape();
  const Shape flat{s[0], shape_numel(Shape(s.begin() + 1, s.end()))};
  // The channels-first order flatten promises needs a channels-last x's values moved first.
  if (x.value().channels_last()) return flatten(ctx, cast(ctx, x, x.value().dtype(), Layout::Nchw));
  Var out(x.value().reshape(flat), needs_grad(ctx, {&x}));
  if (out.requires_grad()) {
    ctx.tape().record("flatten", "", {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref()](Context& c) {
      if (!outr.grad().defined()) return;
      accumulate_grad(c, xr, pass_grad(c, outr).reshape(xr.shape()));
    });
  }
  return out;
}

Var cast(Context& ctx, const Var& x, DType dtype, Layout layout) {
  check_float_any_layout_on(ctx, x.value(), "cast", "x");
  if (x.value().dtype() == dtype && x.value().layout() == layout) return x;
  Var out(to_form(ctx, x.value(), dtype, layout), needs_grad(ctx, {&x}));
  if (out.requires_grad()) {
    ctx.tape().record("cast", "", {{"x", x}}, out,
                      [xr = x.grad_ref(), outr = out.grad_ref(), from = x.value().dtype(),
                       from_layout = x.value().layout()](Context& c) {
      if (!outr.grad().defined()) return;
      accumulate_grad(c, xr, to_form(c, outr.grad(), from, from_layout));
    });
  }
  return out;
}

}  // namespace ditto
