#include "kernels/activation.h"

#include "engine/profiler.h"
#include "kernels/activation_ref.h"
#include "engine/operand_check.h"
#include "kernels/detail/activation_cuda.h"

namespace ditto {
namespace {

using CudaFwd = void (*)(Context&, const float*, float*, int64_t);
using CudaBwd = void (*)(Context&, const float*, const float*, float*, int64_t);
using RefFwd = void (*)(const float*, float*, int64_t);
using RefBwd = void (*)(const float*, const float*, float*, int64_t);

// One elementwise activation: forward y = f(x); backward dx = g(a, dy) where a is y when
// `bwd_from_output`, else x.
struct Unary {
  const char* name;
  CudaFwd cuda_fwd;
  CudaBwd cuda_bwd;
  RefFwd ref_fwd;
  RefBwd ref_bwd;
  bool bwd_from_output;
};

Var unary(Context& ctx, const Var& x, const Unary& op) {
  check_f32_on(ctx, x.value(), op.name, "x");
  Tensor y = ctx.empty(x.shape());
  const int64_t n = y.numel();
  {
    ProfileScope timed(ctx, ProfileKind::ActivationFwd, op.name);
    if (ctx.is_cuda())
      op.cuda_fwd(ctx, x.value().f32(), y.f32(), n);
    else
      op.ref_fwd(x.value().f32(), y.f32(), n);
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    // The backward reads the output (ReLU, ReLU6, sigmoid: a function of y) or the input (SiLU),
    // never both: only that one is kept.
    Tensor saved = op.bwd_from_output ? out.value() : x.value();
    ctx.tape().record(op.name, "", {{"x", x}}, out,
                      [saved, xr = x.grad_ref(), outr = out.grad_ref(), op](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape());
      const int64_t n = dx.numel();
      {
        ProfileScope timed(c, ProfileKind::ActivationBwd, op.name);
        if (c.is_cuda())
          op.cuda_bwd(c, saved.f32(), outr.grad().f32(), dx.f32(), n);
        else
          op.ref_bwd(saved.f32(), outr.grad().f32(), dx.f32(), n);
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

}  // namespace

Var relu(Context& ctx, const Var& x) {
  return unary(ctx, x, {"relu", cuda::relu_fwd, cuda::relu_bwd, ref::relu_fwd<float>, ref::relu_bwd<float>, true});
}

Var sigmoid(Context& ctx, const Var& x) {
  return unary(ctx, x,
               {"sigmoid", cuda::sigmoid_fwd, cuda::sigmoid_bwd, ref::sigmoid_fwd<float>, ref::sigmoid_bwd<float>, true});
}

Var silu(Context& ctx, const Var& x) {
  return unary(ctx, x, {"silu", cuda::silu_fwd, cuda::silu_bwd, ref::silu_fwd<float>, ref::silu_bwd<float>, false});
}

Var relu6(Context& ctx, const Var& x) {
  return unary(ctx, x, {"relu6", cuda::relu6_fwd, cuda::relu6_bwd, ref::relu6_fwd<float>, ref::relu6_bwd<float>, false});
}

}  // namespace ditto
