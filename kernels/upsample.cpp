#include "kernels/upsample.h"

#include <fmt/format.h>

#include <climits>
#include <cmath>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/detail/own_knob.h"
#include "kernels/detail/upsample_cuda.h"
#include "kernels/upsample_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

DITTO_KNOB(upsample_bwd_knob, {op::upsample, "bwd",
                               {{"atomic", kNot, kOwn, "atomicAdd from every output gradient (PyTorch's bilinear)"},
                                {"gather", kGpu, kOwn, "one thread per input pixel adds its taps in order"}},
                               "atomic", false, "upsampling backward"})

const char* name_of(UpsampleBwd u) { return variant_name(upsample_bwd_knob(), u); }

namespace {

constexpr const char* kOp = "upsample";

std::string where(const std::string& layer) { return fmt::format("upsample2d (layer '{}')", layer); }

ref::UpsampleDims dims_of(const Shape& x, const UpsampleParams& p, const std::string& op) {
  if (x.size() != 4) throw ShapeError(fmt::format("{}: x must be NCHW (4 dimensions), has shape {}", op, shape_str(x)));
  if (p.out_h < 1 || p.out_w < 1)
    throw ShapeError(fmt::format("{}: output size {}x{} must be at least 1x1", op, p.out_h, p.out_w));
  if (x[2] < 1 || x[3] < 1) throw ShapeError(fmt::format("{}: x has an empty plane, shape {}", op, shape_str(x)));
  if (x[2] > INT_MAX || x[3] > INT_MAX || p.out_h > INT_MAX || p.out_w > INT_MAX)
    throw ShapeError(fmt::format("{}: sides above 2^31-1 are not supported (x {}, output {}x{})", op, shape_str(x),
                                 p.out_h, p.out_w));
  if (p.align_corners && p.mode != UpsampleMode::Bilinear)
    throw ShapeError(fmt::format("{}: align_corners applies to bilinear upsampling only, not {}", op,
                                 upsample_mode_name(p.mode)));
  ref::UpsampleDims d;
  d.planes = x[0] * x[1];
  d.h = x[2];
  d.w = x[3];
  d.oh = p.out_h;
  d.ow = p.out_w;
  d.bilinear = p.mode == UpsampleMode::Bilinear;
  d.align_corners = p.align_corners;
  return d;
}

}  // namespace

const char* upsample_mode_name(UpsampleMode m) { return m == UpsampleMode::Nearest ? "nearest" : "bilinear"; }

int64_t upsample_size(int64_t in, double scale) {
  if (!(scale > 0) || !std::isfinite(scale))
    throw ShapeError(fmt::format("upsample_size: scale factor {} must be positive and finite", scale));
  const double out = std::floor(double(in) * scale);
  if (out < 1 || out > double(INT_MAX))
    throw ShapeError(fmt::format("upsample_size: {} * {} gives an output side of {}; 1 .. 2^31-1 is supported", in,
                                 scale, out));
  return static_cast<int64_t>(out);
}

Var upsample2d(Context& ctx, const std::string& layer, const Var& x, const UpsampleParams& p) {
  const std::string op = where(layer);
  check_f32_on(ctx, x.value(), op, "x");
  const ref::UpsampleDims d = dims_of(x.shape(), p, op);
  // Resolved now so a misconfigured layer fails at its forward call.
  const UpsampleBwd variant = ctx.policy().variant<UpsampleBwd>(layer, op::upsample);
  detail::record_own_knob(ctx, layer, kOp, "bwd", name_of(variant), ctx.policy().requested(layer, "bwd", op::upsample),
                          variant == UpsampleBwd::Gather);
  Tensor y = ctx.empty({x.shape()[0], x.shape()[1], p.out_h, p.out_w});
  if (ctx.is_cuda())
    cuda::upsample_fwd(ctx, x.value().f32(), y.f32(), d);
  else
    ref::upsample_fwd(x.value().f32(), y.f32(), d);

  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record(kOp, layer, {{"x", x}}, out, [x, out, layer, p](Context& c) {
      if (!out.grad().defined()) return;
      accumulate_grad(c, x, upsample2d_backward(c, layer, out.grad(), x.shape(), p));
    });
  }
  return out;
}

Tensor upsample2d_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Shape& x_shape,
                           const UpsampleParams& p) {
  const std::string op = where(layer) + " backward";
  check_f32_on(ctx, dy, op, "dy");
  const ref::UpsampleDims d = dims_of(x_shape, p, op);
  check_shape(dy, {x_shape[0], x_shape[1], p.out_h, p.out_w}, op, "dy");
  const UpsampleBwd variant = ctx.policy().variant<UpsampleBwd>(layer, op::upsample);
  Tensor dx = ctx.empty(x_shape);
  std::size_t ws_bytes = 0;
  if (!ctx.is_cuda()) {
    ref::upsample_bwd(dy.f32(), dx.f32(), d);
  } else if (variant == UpsampleBwd::Atomic) {
    cuda::upsample_bwd_atomic(ctx, dy.f32(), dx.f32(), d);
  } else {
    ws_bytes = cuda::upsample_gather_workspace(d);
    detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
    if (!ws.ok())
      throw PolicyError(fmt::format("{}: bwd=gather needs a workspace of {} bytes for its tap tables, which could not "
                                    "be allocated; bwd=atomic needs none",
                                    op, ws_bytes));
    cuda::upsample_bwd_gather(ctx, dy.f32(), dx.f32(), d, ws.get());
  }
  detail::record_own_knob(ctx, layer, kOp, "bwd", name_of(variant), ctx.policy().requested(layer, "bwd", op::upsample),
                          variant == UpsampleBwd::Gather, ws_bytes);
  return dx;
}

}  // namespace ditto
