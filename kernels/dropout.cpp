#include "kernels/dropout.h"

#include <fmt/format.h>

#include "engine/operand_check.h"
#include "kernels/detail/dropout_cuda.h"
#include "kernels/dropout_ref.h"
#include "kernels/elementwise.h"

namespace ditto {

Var dropout(Context& ctx, const std::string& layer, const Var& x, float p, uint64_t seed, uint64_t step,
            bool training) {
  const std::string op = fmt::format("dropout (layer '{}')", layer);
  if (!(p >= 0.0f && p < 1.0f)) throw Error(fmt::format("{}: p = {} is outside [0, 1)", op, p));
  check_float_any_layout_on(ctx, x.value(), op, "x");
  if (!training || p == 0.0f) return x;
  // A bf16/f16 or channels-last x (a native activation): the mask is drawn over the NCHW element
  // order whatever the layout, and the product computed in float and rounded once to x's dtype:
  // the op on x widened to f32 NCHW (exact), cast back, each a differentiable cast.
  if (x.value().dtype() != DType::F32 || x.value().channels_last())
    return cast(ctx, dropout(ctx, layer, cast(ctx, x, DType::F32, Layout::Nchw), p, seed, step, training),
                x.value().dtype(), x.value().layout());

  const uint64_t key = dropout_key(seed, step, layer);
  const float scale = 1.0f / (1.0f - p);  // the one scale both devices use
  Tensor y = ctx.empty(x.shape());
  const int64_t n = y.numel();
  if (ctx.is_cuda())
    cuda::dropout_apply(ctx, x.value().f32(), y.f32(), n, p, scale, key);
  else
    ref::dropout_fwd(x.value().f32(), y.f32(), n, p, key);

  bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("dropout", layer, {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref(), p, scale, key](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape());
      const int64_t n = dx.numel();
      if (c.is_cuda())
        cuda::dropout_apply(c, outr.grad().f32(), dx.f32(), n, p, scale, key);
      else
        ref::dropout_bwd(outr.grad().f32(), dx.f32(), n, p, key);
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

}  // namespace ditto
