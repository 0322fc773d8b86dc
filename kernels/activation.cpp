#include "kernels/activation.h"

#include <fmt/format.h>

#include "engine/profiler.h"
#include "kernels/activation_ref.h"
#include "engine/operand_check.h"
#include "kernels/detail/activation_cuda.h"
#include "engine/tensor_ops.h"

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
  cuda::Act act;
  CudaFwd cuda_fwd;
  CudaBwd cuda_bwd;
  RefFwd ref_fwd;
  RefBwd ref_bwd;
  bool bwd_from_output;
};

// y = f(x) in x's dtype and layout. f32 runs the float kernels; bf16/f16 the same formulas read
// widened and rounded once (the CPU widens, runs the float reference and narrows: the same bits
// where the float formula agrees).
Tensor unary_fwd(Context& ctx, const Unary& op, const Tensor& x) {
  Tensor y = ctx.empty(x.shape(), x.dtype(), x.layout());
  const int64_t n = y.numel();
  ProfileScope timed(ctx, ProfileKind::ActivationFwd, op.name);
  if (x.dtype() == DType::F32) {
    if (ctx.is_cuda()) op.cuda_fwd(ctx, x.f32(), y.f32(), n);
    else op.ref_fwd(x.f32(), y.f32(), n);
  } else if (ctx.is_cuda()) {
    cuda::act_fwd_half(ctx, op.act, x.dtype(), x.raw(), y.raw(), n);
  } else {
    Tensor yf = ctx.empty(x.shape(), DType::F32, x.layout());  // elementwise: memory order as x's
    op.ref_fwd(to_dtype(ctx, x, DType::F32).f32(), yf.f32(), n);
    y = to_dtype(ctx, yf, x.dtype());
  }
  return y;
}

Tensor unary_bwd(Context& c, const Unary& op, const Tensor& saved, const Tensor& dy) {
  Tensor dx = c.empty(saved.shape(), saved.dtype(), saved.layout());
  const int64_t n = dx.numel();
  ProfileScope timed(c, ProfileKind::ActivationBwd, op.name);
  if (saved.dtype() == DType::F32) {
    if (c.is_cuda()) op.cuda_bwd(c, saved.f32(), dy.f32(), dx.f32(), n);
    else op.ref_bwd(saved.f32(), dy.f32(), dx.f32(), n);
  } else if (c.is_cuda()) {
    cuda::act_bwd_half(c, op.act, saved.dtype(), saved.raw(), dy.raw(), dx.raw(), n);
  } else {
    Tensor df = c.empty(saved.shape(), DType::F32, saved.layout());
    op.ref_bwd(to_dtype(c, saved, DType::F32).f32(), to_dtype(c, dy, DType::F32).f32(), df.f32(), n);
    dx = to_dtype(c, df, saved.dtype());
  }
  return dx;
}

Var unary(Context& ctx, const Var& x, const Unary& op) {
  check_float_any_layout_on(ctx, x.value(), op.name, "x");
  Tensor y = unary_fwd(ctx, op, x.value());
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    // The backward reads the output (ReLU, ReLU6, sigmoid: a function of y) or the input (SiLU),
    // never both: only that one is kept.
    Tensor saved = op.bwd_from_output ? out.value() : x.value();
    ctx.tape().record(op.name, "", {{"x", x}}, out,
                      [saved, xr = x.grad_ref(), outr = out.grad_ref(), op](Context& c) {
      if (!outr.grad().defined()) return;
      const Tensor& dy = outr.grad();
      accumulate_grad(c, xr, unary_bwd(c, op, saved, dy));
    });
  }
  return out;
}

}  // namespace

Var relu(Context& ctx, const Var& x) {
  return unary(ctx, x, {"relu", cuda::Act::Relu, cuda::relu_fwd, cuda::relu_bwd, ref::relu_fwd<float>, ref::relu_bwd<float>, true});
}

Var sigmoid(Context& ctx, const Var& x) {
  return unary(ctx, x,
               {"sigmoid", cuda::Act::Sigmoid, cuda::sigmoid_fwd, cuda::sigmoid_bwd, ref::sigmoid_fwd<float>, ref::sigmoid_bwd<float>, true});
}

Var silu(Context& ctx, const Var& x) {
  return unary(ctx, x, {"silu", cuda::Act::Silu, cuda::silu_fwd, cuda::silu_bwd, ref::silu_fwd<float>, ref::silu_bwd<float>, false});
}

Var relu6(Context& ctx, const Var& x) {
  return unary(ctx, x, {"relu6", cuda::Act::Relu6, cuda::relu6_fwd, cuda::relu6_bwd, ref::relu6_fwd<float>, ref::relu6_bwd<float>, false});
}

}  // namespace ditto
