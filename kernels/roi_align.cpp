#include "kernels/roi_align.h"

#include <fmt/format.h>

#include <climits>
#include <cmath>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/detail/op_record.h"
#include "kernels/detail/roi_align_cuda.h"
#include "kernels/roi_align_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

DITTO_KNOB(roi_align_bwd_knob, {op::roi_align, "bwd",
                                {{"atomic", kNot, kOwn, "atomicAdd of every sample (torchvision's)"},
                                 {"deterministic", kGpu, kOwn, "gather per pixel tile: each roi's bins in a fixed order"}},
                                "atomic", false, "ROI align's image gradient"})

const char* name_of(RoiAlignBwd v) { return variant_name(roi_align_bwd_knob(), v); }

namespace {

constexpr const char* kOp = "roi_align";

Determinism determinism_of(RoiAlignBwd v) { return v == RoiAlignBwd::Deterministic ? Determinism::Yes : Determinism::No; }

void record(Context& ctx, const std::string& layer, RoiAlignBwd v, const std::string& requested, std::size_t ws = 0) {
  detail::record_knob(ctx, layer, kOp, "bwd", name_of(v), requested, determinism_of(v), Impl::Ditto, ws);
}

// The CPU can read the rois: a bad one is a DataError naming it, not a NaN.
void check_rois_on_cpu(const float* rois, const ref::RoiAlignDims& d, const std::string& op) {
  for (int64_t k = 0; k < d.rois; ++k) {
    const float* r = rois + k * 5;
    if (!ref::roi_geometry<double>(r, d).ok)
      throw DataError(fmt::format("{}: roi {} = ({}, {}, {}, {}, {}) has a batch index outside [0, {}) or a "
                                  "coordinate that is not finite or beyond 2^24 after scaling",
                                  op, k, r[0], r[1], r[2], r[3], r[4], d.n));
  }
}

// The checks and dimensions shared by the forward and backward passes.
ref::RoiAlignDims roi_dims(const Context& ctx, const std::string& op, const Shape& xs, const Tensor& rois,
                           const RoiAlignParams& p) {
  if (xs.size() != 4) throw ShapeError(fmt::format("{}: x must be {{N, C, H, W}}, has shape {}", op, shape_str(xs)));
  check_f32_on(ctx, rois, op, "rois");
  if (rois.ndim() != 2 || rois.shape()[1] != 5)
    throw ShapeError(fmt::format("{}: rois must be {{K, 5}} (batch index, x1, y1, x2, y2), has shape {}", op,
                                 shape_str(rois.shape())));
  if (p.out_h < 1 || p.out_w < 1)
    throw ShapeError(fmt::format("{}: output size {}x{} must be at least 1x1", op, p.out_h, p.out_w));
  if (!(p.spatial_scale > 0.f) || !std::isfinite(p.spatial_scale))
    throw ShapeError(fmt::format("{}: spatial_scale must be positive and finite, is {}", op, p.spatial_scale));
  ref::RoiAlignDims d;
  d.n = xs[0], d.c = xs[1], d.h = xs[2], d.w = xs[3], d.rois = rois.shape()[0], d.ph = p.out_h, d.pw = p.out_w;
  d.spatial_scale = p.spatial_scale, d.sampling_ratio = p.sampling_ratio, d.aligned = p.aligned;
  if (d.h * d.w > INT_MAX || d.n > INT_MAX)
    throw ShapeError(fmt::format("{}: x {} has planes of more than 2^31-1 elements or more than 2^31-1 images", op,
                                 shape_str(xs)));
  if (!ctx.is_cuda()) check_rois_on_cpu(rois.f32(), d, op);
  return d;
}

// The GPU's deterministic gather holds out_h + out_w weights per tile pixel in shared memory.
void check_gather_limit(const Context& c, RoiAlignBwd variant, const std::string& op, const ref::RoiAlignDims& d) {
  if (c.is_cuda() && variant == RoiAlignBwd::Deterministic && d.ph + d.pw > cuda::kRoiGatherMaxPooledSum)
    throw ShapeError(fmt::format("{}: bwd=deterministic takes output sizes with out_h + out_w <= {}, not {}x{} "
                                 "(bwd=atomic has no such limit)",
                                 op, cuda::kRoiGatherMaxPooledSum, d.ph, d.pw));
}

// dx of shape d's input from dy {K, C, out_h, out_w} by the layer's variant, recorded with its
// workspace.
Tensor roi_backward(Context& c, const std::string& layer, const std::string& op, RoiAlignBwd variant,
                    const std::string& requested, const Tensor& dy, const Tensor& rois, const ref::RoiAlignDims& d) {
  check_gather_limit(c, variant, op, d);
  const Shape xs{d.n, d.c, d.h, d.w};
  Tensor dx;
  std::size_t ws_bytes = 0;
  if (!c.is_cuda()) {
    dx = c.empty(xs);
    ref::roi_align_bwd(rois.f32(), dy.f32(), dx.f32(), d);
  } else if (variant == RoiAlignBwd::Atomic) {
    dx = c.zeros(xs);
    cuda::roi_align_bwd_atomic(c, rois.f32(), dy.f32(), dx.f32(), d);
  } else {
    dx = c.empty(xs);
    ws_bytes = cuda::roi_align_bwd_deterministic_workspace(d);
    detail::Workspace ws(detail::cuda_state(c), ws_bytes);
    detail::require_workspace(ws, op, "bwd=deterministic", "bwd=atomic needs none");
    cuda::roi_align_bwd_deterministic(c, rois.f32(), dy.f32(), dx.f32(), ws.get(), d);
  }
  record(c, layer, variant, requested, ws_bytes);
  return dx;
}

}  // namespace

Var roi_align(Context& ctx, const std::string& layer, const Var& x, const Tensor& rois, const RoiAlignParams& p) {
  const std::string op = detail::op_where(kOp, layer);
  check_f32_on(ctx, x.value(), op, "x");
  const ref::RoiAlignDims d = roi_dims(ctx, op, x.shape(), rois, p);

  const RoiAlignBwd variant = ctx.policy().variant<RoiAlignBwd>(layer, op::roi_align);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::roi_align);
  Tensor y = ctx.empty({d.rois, d.c, d.ph, d.pw});
  if (ctx.is_cuda())
    cuda::roi_align_fwd(ctx, x.value().f32(), rois.f32(), y.f32(), d);
  else
    ref::roi_align_fwd(x.value().f32(), rois.f32(), y.f32(), d);
  record(ctx, layer, variant, requested);

  const bool grad = needs_grad(ctx, {&x});
  if (grad) check_gather_limit(ctx, variant, op, d);  // before training on, not at the first backward
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record(kOp, layer, {{"x", x}, {"rois", Var(rois)}}, out,
                      [x, rois, out, d, variant, requested, layer, op](Context& c) {
                        if (!out.grad().defined()) return;
                        accumulate_grad(c, x, roi_backward(c, layer, op, variant, requested, out.grad(), rois, d));
                      });
  }
  return out;
}

Tensor roi_align_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Shape& x_shape,
                          const Tensor& rois, const RoiAlignParams& p) {
  const std::string op = detail::op_where(kOp, layer);
  const ref::RoiAlignDims d = roi_dims(ctx, op, x_shape, rois, p);
  check_f32_on(ctx, dy, op, "dy");
  check_shape(dy, {d.rois, d.c, d.ph, d.pw}, op, "dy");
  const RoiAlignBwd variant = ctx.policy().variant<RoiAlignBwd>(layer, op::roi_align);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::roi_align);
  return roi_backward(ctx, layer, op, variant, requested, dy, rois, d);
}

}  // namespace ditto
