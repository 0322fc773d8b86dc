#include "kernels/elementwise.h"

#include <fmt/format.h>

#include "engine/error.h"
#include "kernels/detail/elementwise_cuda.h"

namespace ditto {
namespace {
void check_on_ctx(const Context& ctx, const Tensor& t, const char* op) {
  if (!t.defined()) throw ShapeError(fmt::format("{}: undefined tensor", op));
  if (t.dtype() != DType::F32) throw ShapeError(fmt::format("{}: f32 tensor expected", op));
  if (t.device() != ctx.device())
    throw ShapeError(fmt::format("{}: tensor on {} but context on {}", op, t.device().str(), ctx.device().str()));
}
void check_same(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() != b.shape())
    throw ShapeError(fmt::format("{}: shapes {} and {} differ", op, shape_str(a.shape()), shape_str(b.shape())));
}
}  // namespace

void fill(Context& ctx, Tensor& t, float value) {
  check_on_ctx(ctx, t, "fill");
  if (ctx.is_cuda()) return cuda::fill(ctx, t.f32(), t.numel(), value);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
}

void add_inplace(Context& ctx, Tensor& dst, const Tensor& src) { axpy_inplace(ctx, dst, 1.0f, src); }

void axpy_inplace(Context& ctx, Tensor& dst, float alpha, const Tensor& x) {
  check_on_ctx(ctx, dst, "axpy");
  check_on_ctx(ctx, x, "axpy");
  check_same(dst, x, "axpy");
  if (ctx.is_cuda()) return cuda::axpy(ctx, dst.f32(), alpha, x.f32(), dst.numel());
  float* d = dst.f32();
  const float* s = x.f32();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += alpha * s[i];
}

void scale_inplace(Context& ctx, Tensor& t, float alpha) {
  check_on_ctx(ctx, t, "scale");
  if (ctx.is_cuda()) return cuda::scale(ctx, t.f32(), alpha, t.numel());
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= alpha;
}

Var add(Context& ctx, const Var& a, const Var& b) {
  check_on_ctx(ctx, a.value(), "add");
  check_on_ctx(ctx, b.value(), "add");
  check_same(a.value(), b.value(), "add");
  Tensor y = ctx.empty(a.shape());
  int64_t n = y.numel();
  if (ctx.is_cuda()) {
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
  check_on_ctx(ctx, x.value(), "flatten");
  if (x.value().ndim() < 1) throw ShapeError("flatten: x is a scalar (0 dims); need the batch dimension first");
  const Shape& s = x.shape();
  Var out(x.value().reshape({s[0], shape_numel(Shape(s.begin() + 1, s.end()))}), needs_grad(ctx, {&x}));
  if (out.requires_grad()) {
    ctx.tape().record("flatten", "", {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref()](Context& c) {
      if (!outr.grad().defined()) return;
      accumulate_grad(c, xr, pass_grad(c, outr).reshape(xr.shape()));
    });
  }
  return out;
}

}  // namespace ditto
