#include "kernels/bias.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/profiler.h"
#include "kernels/bias_ref.h"
#include "engine/operand_check.h"
#include "kernels/detail/bias_cuda.h"
#include "kernels/detail/tuned.h"
#include "engine/tensor_ops.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
const VariantSpec kAtomic{"atomic", kNot, kOwn, "atomicAdd per element"};
const VariantSpec kFixedTree{"deterministic", kGpu, kOwn, "per-block partial sums added in a fixed order"};
}  // namespace

DITTO_KNOB(conv_bias_bwd_knob,
           {op::conv2d, "bias_bwd",
            {kAtomic, kFixedTree, {"cudnn", kRun, kLib, "cudnnConvolutionBackwardBias"}},
            "cudnn", false, "the bias gradient's reduction",
            // PyTorch sums a convolution's bias gradient with its own reduction (grad.sum over N, H, W).
            "deterministic"})
DITTO_KNOB(linear_bias_bwd_knob, {op::linear, "bias_bwd", {kAtomic, kFixedTree}, "atomic", false,
                                  "the bias gradient's reduction",
                                  // PyTorch's addmm backward sums the bias gradient with its own reduction.
                                  "deterministic"})

const char* name_of(BiasBwd b) { return variant_name(conv_bias_bwd_knob(), b); }

namespace {

struct BiasShape {
  int64_t n, c, s;
};

using TensorDesc = detail::CudnnTensorDesc;

Determinism determinism_of(BiasBwd v) { return v == BiasBwd::Atomic ? Determinism::No : Determinism::Yes; }

// dy in its dtype and layout (checked 4-D and within int range at the forward call), db float.
void cudnn_db(Context& ctx, const std::string& layer, const Tensor& dy, Tensor& db) {
  const Shape& sh = dy.shape();
  TensorDesc dy_desc, db_desc;
  dy_desc.set(sh, dy.dtype(), dy.channels_last());
  db_desc.set(1, sh[1], 1, 1);
  const float alpha = 1.0f, beta = 0.0f;
  const cudnnStatus_t st = cudnnConvolutionBackwardBias(detail::cuda_state(ctx).cudnn, &alpha, dy_desc.get(), dy.raw(),
                                                        &beta, db_desc.get(), db.f32());
  const int category = int(st) / 1000 * 1000;
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM)
    throw PolicyError(fmt::format("bias_add (layer '{}'): bias_bwd=cudnn is not supported by cuDNN for dy {} {}: {}; "
                                  "supported: atomic, deterministic",
                                  layer, dy.type_tag(), shape_str(sh), cudnnGetErrorString(st)));
  DITTO_CUDNN_CHECK(st);
}

void backward_bias(Context& c, const std::string& layer, OpKind kind, BiasBwd variant, const BiasShape& bs,
                   const Tensor& dy, Tensor& db) {
  const char* op = op_kind_name(kind);
  const std::string requested = c.policy().requested(layer, "bias_bwd", kind);
  const bool plain = dy.dtype() == DType::F32 && !dy.channels_last();
  if (!c.is_cuda()) {
    ref::bias_bwd_db((plain ? dy : to_form(c, dy, DType::F32, Layout::Nchw)).f32(), db.f32(), bs.n, bs.c, bs.s);
    c.manifest().record({layer, op, "bias_bwd", "reference", requested, Determinism::Yes, "", 0, c.device().str(), "",
                         guarantee_of(Determinism::Yes, Impl::CpuReference)});
    return;
  }
  std::size_t ws_bytes = 0;
  if (!plain) {  // channels-last (the forward refused other forms on the GPU)
    const int64_t rows = bs.n * bs.s;
    if (variant == BiasBwd::Cudnn) {
      cudnn_db(c, layer, dy, db);
    } else {
      const bool atomic = variant == BiasBwd::Atomic;
      ws_bytes = atomic ? 0 : sizeof(float) * static_cast<std::size_t>(cuda::bias_nhwc_partials(rows) * bs.c);
      detail::Workspace ws(detail::cuda_state(c), ws_bytes);
      if (!ws.ok())
        throw PolicyError(fmt::format("bias_add (layer '{}'): bias_bwd=deterministic needs a workspace of {} bytes "
                                      "for dy {}, which could not be allocated; bias_bwd=atomic needs none",
                                      layer, ws_bytes, shape_str(dy.shape())));
      cuda::bias_bwd_nhwc(c, dy.dtype(), dy.raw(), db.f32(), static_cast<float*>(ws.get()), atomic, rows, bs.c);
    }
  } else {
  switch (variant) {
    case BiasBwd::Atomic:
      cuda::bias_bwd_atomic(c, dy.f32(), db.f32(), bs.n, bs.c, bs.s);
      break;
    case BiasBwd::Deterministic: {
      ws_bytes = sizeof(float) * static_cast<std::size_t>(cuda::bias_bwd_partials(bs.n, bs.s) * bs.c);
      detail::Workspace ws(detail::cuda_state(c), ws_bytes);
      if (!ws.ok())
        throw PolicyError(fmt::format("bias_add (layer '{}'): bias_bwd=deterministic needs a workspace of {} bytes "
                                      "for dy {}, which could not be allocated; bias_bwd=atomic needs none",
                                      layer, ws_bytes, shape_str(dy.shape())));
      cuda::bias_bwd_deterministic(c, dy.f32(), db.f32(), static_cast<float*>(ws.get()), bs.n, bs.c, bs.s);
      break;
    }
    case BiasBwd::Cudnn:
      cudnn_db(c, layer, dy, db);
      break;
  }
  }
  c.manifest().record({layer, op, "bias_bwd", name_of(variant), requested, determinism_of(variant), "", ws_bytes,
                       c.device().str(), "",
                       guarantee_of(determinism_of(variant), variant == BiasBwd::Cudnn ? Impl::Library : Impl::Ditto)});
}

}  // namespace

Var bias_add(Context& ctx, const std::string& layer, OpKind kind, const Var& x, const Var& b) {
  const std::string op = fmt::format("bias_add (layer '{}')", layer);
  if (kind != op::conv2d && kind != op::linear)
    throw Error(fmt::format("{}: the owning layer's kind must be conv2d or linear, not {}", op, op_kind_name(kind)));
  check_float_any_layout_on(ctx, x.value(), op, "x");
  check_f32_on(ctx, b.value(), op, "b");
  const Tensor& xv = x.value();
  const bool plain = xv.dtype() == DType::F32 && !xv.channels_last();
  if (ctx.is_cuda() && !plain && !xv.channels_last())
    throw ShapeError(fmt::format("{}: x is {} {}; on the GPU the bias reads f32, or channels-last tensors of any float "
                                 "dtype (conv2d.layout=nhwc with conv2d.output=native)",
                                 op, xv.type_tag(), shape_str(xv.shape())));
  if (x.value().ndim() != 2 && x.value().ndim() != 4)
    throw ShapeError(fmt::format("{}: x must be {{N, C}} or {{N, C, H, W}}, has shape {}", op, shape_str(x.shape())));
  check_ndim(b.value(), 1, op, "b");
  const Shape& xs = x.shape();
  if (b.shape()[0] != xs[1])
    throw ShapeError(fmt::format("{}: b has shape {} but x has shape {}: b must have x's channel count {}", op,
                                 shape_str(b.shape()), shape_str(xs), xs[1]));
  const BiasShape bs{xs[0], xs[1], xs.size() == 4 ? xs[2] * xs[3] : 1};

  // Resolved here so a misconfigured layer fails at its first forward call, not in backward.
  BiasBwd variant = ctx.policy().variant<BiasBwd>(layer, kind);
  bool cudnn_ok = xs.size() == 4;  // cuDNN's reduction takes 4-D NCHW with int-sized dimensions
  for (int64_t d : xs) cudnn_ok = cudnn_ok && d <= INT_MAX;
  // cuDNN's bias gradient takes no bf16/f16 channels-last dy (CUDNN_STATUS_NOT_SUPPORTED on the
  // H100, cuDNN 9.14; PyTorch sums the gradient with its own reduction there): pinned, that is an
  // error; a mode's cudnn runs ditto's fixed-order reduction and the manifest says so.
  if (ctx.is_cuda() && variant == BiasBwd::Cudnn && !plain && xv.dtype() != DType::F32) {
    if (ctx.policy().requested(layer, "bias_bwd", kind) == "pinned")
      throw PolicyError(fmt::format("{}: bias_bwd=cudnn is pinned, but cuDNN's bias gradient does not take {} x {}; "
                                    "supported there: atomic, deterministic",
                                    op, xv.type_tag(), shape_str(xs)));
    variant = BiasBwd::Deterministic;
  }
  if (variant == BiasBwd::Cudnn && !cudnn_ok)
    throw PolicyError(fmt::format("{}: bias_bwd=cudnn needs a 4-D NCHW x with int-sized dimensions, x has shape "
                                  "{}; supported for this shape: atomic, deterministic",
                                  op, shape_str(xs)));
  if (ctx.is_cuda() && ctx.tuning() && cudnn_ok && plain && ctx.policy().requested(layer, "bias_bwd", kind) == "deterministic") {
    // Both deterministic reductions, timed on a scratch gradient of x's shape.
    TuningEntry e;
    e.op = "bias_add";
    e.direction = "bias_bwd";
    e.x = xs;
    e.layer = layer;
    Tensor dy = ctx.zeros(xs), db = ctx.empty({xs[1]});
    variant = detail::tuned_choice<BiasBwd>(
        ctx, e, {BiasBwd::Deterministic, BiasBwd::Cudnn}, [&](BiasBwd v) { backward_bias(ctx, layer, kind, v, bs, dy, db); },
        op);
  }

  Tensor y = ctx.empty(xs, xv.dtype(), xv.layout());
  {
    ProfileScope timed(ctx, ProfileKind::BiasFwd);
    if (ctx.is_cuda() && plain) {
      cuda::bias_fwd(ctx, xv.f32(), b.value().f32(), y.f32(), bs.n, bs.c, bs.s);
    } else if (ctx.is_cuda()) {
      cuda::bias_fwd_nhwc(ctx, xv.dtype(), xv.raw(), b.value().f32(), y.raw(), bs.n * bs.s, bs.c);
    } else if (plain) {
      ref::bias_fwd(xv.f32(), b.value().f32(), y.f32(), bs.n, bs.c, bs.s);
    } else {  // the reference in f32 NCHW, y rounded once to x's dtype in x's layout
      Tensor yf = ctx.empty(xs);
      ref::bias_fwd(to_form(ctx, xv, DType::F32, Layout::Nchw).f32(), b.value().f32(), yf.f32(), bs.n, bs.c, bs.s);
      y = to_form(ctx, yf, xv.dtype(), xv.layout());
    }
  }

  bool grad = needs_grad(ctx, {&x, &b});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("bias_add", layer, {{"x", x}, {"b", b}}, out, [xr = x.grad_ref(), br = b.grad_ref(), outr = out.grad_ref(), layer, kind, variant, bs](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx, db;
      {
        ProfileScope timed(c, ProfileKind::BiasBwd, c.is_cuda() ? name_of(variant) : "cpu-reference");
        if (br.requires_grad()) {
          db = c.empty({bs.c});
          backward_bias(c, layer, kind, variant, bs, outr.grad(), db);
        }
        if (xr.requires_grad()) dx = pass_grad(c, outr);  // dx = dy: handed on, not copied
      }
      accumulate_grad(c, xr, std::move(dx));
      accumulate_grad(c, br, std::move(db));
    });
  }
  return out;
}

}  // namespace ditto
