#include "kernels/activation.h"

#include "kernels/activation_ref.h"
#include "kernels/check.h"
#include "kernels/detail/activation_cuda.h"

namespace ditto {

Var relu(Context& ctx, const Var& x) {
  check_f32_on(ctx, x.value(), "relu", "x");
  Tensor y = ctx.empty(x.shape());
  const int64_t n = y.numel();
  if (ctx.is_cuda())
    cuda::relu_fwd(ctx, x.value().f32(), y.f32(), n);
  else
    ref::relu_fwd(x.value().f32(), y.f32(), n);
  bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("relu", "", {{"x", x}}, out, [x, out](Context& c) {
      if (!out.grad().defined()) return;
      Tensor dx = c.empty(x.shape());
      const int64_t n = dx.numel();
      if (c.is_cuda())
        cuda::relu_bwd(c, out.value().f32(), out.grad().f32(), dx.f32(), n);
      else
        ref::relu_bwd(out.value().f32(), out.grad().f32(), dx.f32(), n);
      accumulate_grad(c, x, std::move(dx));
    });
  }
  return out;
}

}  // namespace ditto
