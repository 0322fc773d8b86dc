#include "kernels/grid_sample.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/detail/grid_sample_cuda.h"
#include "kernels/detail/op_record.h"
#include "kernels/grid_sample_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

// cuDNN lists cudnnSpatialTfSamplerBackward among its non-reproducible routines;
// cudnnSpatialTfGridGeneratorBackward is not on that list, yet gave 10 different results in 10
// calls on an H100 with cuDNN 9.14 (bench/results/2026-11-24-h100-tasks/).
DITTO_KNOB(grid_sample_bwd_knob,
           {op::grid_sample, "bwd",
            {{"cudnn", kNot, kLib, "cudnnSpatialTfSamplerBackward"},
             {"atomic", kNot, kOwn, "atomicAdd of every tap (PyTorch's native kernel)"},
             {"deterministic", kGpu, kOwn, "sorted records, balanced segmented sums"}},
            "atomic", false, "bilinear sampling's input and grid gradients"})
DITTO_KNOB(affine_grid_bwd_knob,
           {op::affine_grid, "bwd",
            {{"cudnn", kNot, kLib, "cudnnSpatialTfGridGeneratorBackward"},
             {"atomic", kNot, kOwn, "atomicAdd per grid point"},
             {"deterministic", kGpu, kOwn, "fixed-order block reduction (PyTorch's batched GEMM is deterministic)"}},
            "deterministic", false, "the affine grid's theta gradient"})

const char* name_of(GridSampleBwd v) { return variant_name(grid_sample_bwd_knob(), v); }
const char* name_of(AffineGridBwd v) { return variant_name(affine_grid_bwd_knob(), v); }

namespace {

constexpr const char* kSampleOp = "grid_sample";
constexpr const char* kGridOp = "affine_grid";

using detail::op_where;
using TensorDesc = detail::CudnnTensorDesc;

// ---- cuDNN spatial transformer (RAII; cudnn.h stays out of the public header) ---------------
struct SpatialTfDesc {
  cudnnSpatialTransformerDescriptor_t d = nullptr;
  // dims: the OUTPUT's N, C, H, W (the grid's size).
  SpatialTfDesc(int64_t n, int64_t c, int64_t h, int64_t w) {
    DITTO_CUDNN_CHECK(cudnnCreateSpatialTransformerDescriptor(&d));
    const int dims[4] = {int(n), int(c), int(h), int(w)};
    cudnnStatus_t s = cudnnSetSpatialTransformerNdDescriptor(d, CUDNN_SAMPLER_BILINEAR, CUDNN_DATA_FLOAT, 4, dims);
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroySpatialTransformerDescriptor(d);
      detail::throw_cudnn(s, "cudnnSetSpatialTransformerNdDescriptor", __FILE__, __LINE__);
    }
  }
  ~SpatialTfDesc() { cudnnDestroySpatialTransformerDescriptor(d); }
  SpatialTfDesc(const SpatialTfDesc&) = delete;
  SpatialTfDesc& operator=(const SpatialTfDesc&) = delete;
};

bool fits_int(std::initializer_list<int64_t> dims) {
  for (int64_t v : dims)
    if (v > INT_MAX) return false;
  return true;
}

// ---- affine_grid ----------------------------------------------------------------------------

// cuDNN: cudnnSpatialTfGridGeneratorBackward is not on its non-reproducible list, but measured so.
Determinism determinism_of(AffineGridBwd v) {
  return v == AffineGridBwd::Deterministic ? Determinism::Yes : Determinism::No;
}
Impl impl_of(AffineGridBwd v) { return v == AffineGridBwd::Cudnn ? Impl::Library : Impl::Ditto; }

void record_affine(Context& ctx, const std::string& layer, AffineGridBwd v, const std::string& requested,
                   std::size_t ws = 0) {
  detail::record_knob(ctx, layer, kGridOp, "bwd", name_of(v), requested, determinism_of(v), impl_of(v), ws);
}

// ---- grid_sample ----------------------------------------------------------------------------

// cuDNN: cudnnSpatialTfSamplerBackward is on its list of non-reproducible routines.
Determinism determinism_of(GridSampleBwd v) {
  return v == GridSampleBwd::Deterministic ? Determinism::Yes : Determinism::No;
}
Impl impl_of(GridSampleBwd v) { return v == GridSampleBwd::Cudnn ? Impl::Library : Impl::Ditto; }

void record_sample(Context& ctx, const std::string& layer, GridSampleBwd v, const std::string& requested,
                   std::size_t ws = 0) {
  detail::record_knob(ctx, layer, kSampleOp, "bwd", name_of(v), requested, determinism_of(v), impl_of(v), ws);
}

void cudnn_sampler_fwd(Context& ctx, const std::string& where, const ref::GridSampleDims& d, const float* x,
                       const float* grid, float* y) {
  SpatialTfDesc st(d.n, d.c, d.oh, d.ow);
  TensorDesc xd(d.n, d.c, d.h, d.w), yd(d.n, d.c, d.oh, d.ow);
  const float one = 1.f, zero = 0.f;
  DITTO_CUDNN_VARIANT(cudnnSpatialTfSamplerForward(detail::cuda_state(ctx).cudnn, st.d, &one, xd.d, x, grid, &zero, yd.d, y), where,
                      "bwd=cudnn", "atomic, deterministic");
}

void cudnn_sampler_bwd(Context& ctx, const std::string& where, const ref::GridSampleDims& d, const float* x,
                       const float* grid, const float* dy, float* dx, float* dgrid) {
  SpatialTfDesc st(d.n, d.c, d.oh, d.ow);
  TensorDesc xd(d.n, d.c, d.h, d.w), yd(d.n, d.c, d.oh, d.ow);
  const float one = 1.f, zero = 0.f;
  DITTO_CUDNN_VARIANT(cudnnSpatialTfSamplerBackward(detail::cuda_state(ctx).cudnn, st.d, &one, xd.d, x, &zero, xd.d, dx, &one,
                                                    yd.d, dy, grid, &zero, dgrid),
                      where, "bwd=cudnn", "atomic, deterministic");
}

// dtheta {N, 2, 3} from dgrid {N, H, W, 2} by the layer's variant, recorded with its workspace.
Tensor affine_backward(Context& c, const std::string& layer, const std::string& op, AffineGridBwd variant,
                       const std::string& requested, const Tensor& dgrid, int64_t height, int64_t width,
                       bool align_corners) {
  const int64_t n = dgrid.shape()[0];
  Tensor dtheta = c.empty({n, 2, 3});
  const float* dg = dgrid.f32();
  std::size_t ws_bytes = 0;
  if (!c.is_cuda()) {
    ref::affine_grid_bwd(dg, dtheta.f32(), n, height, width, align_corners);
  } else if (variant == AffineGridBwd::Atomic) {
    cuda::affine_grid_bwd_atomic(c, dg, dtheta.f32(), n, height, width, align_corners);
  } else if (variant == AffineGridBwd::Deterministic) {
    ws_bytes = sizeof(float) * 6 * static_cast<std::size_t>(n * cuda::affine_grid_bwd_partials(height * width));
    detail::Workspace ws(detail::cuda_state(c), ws_bytes);
    detail::require_workspace(ws, op, "bwd=deterministic", "bwd=atomic needs none");
    cuda::affine_grid_bwd_deterministic(c, dg, dtheta.f32(), static_cast<float*>(ws.get()), n, height, width,
                                        align_corners);
  } else if (n > 0) {
    DITTO_CUDNN_VARIANT(cudnnSpatialTfGridGeneratorBackward(detail::cuda_state(c).cudnn,
                                                            SpatialTfDesc(n, 1, height, width).d, dg, dtheta.f32()),
                        op, "bwd=cudnn", "atomic, deterministic");
  }
  record_affine(c, layer, variant, requested, ws_bytes);
  return dtheta;
}

}  // namespace

Var affine_grid(Context& ctx, const std::string& layer, const Var& theta, int64_t height, int64_t width,
                bool align_corners) {
  const std::string op = op_where(kGridOp, layer);
  check_f32_on(ctx, theta.value(), op, "theta");
  check_ndim(theta.value(), 3, op, "theta");
  const Shape& ts = theta.shape();
  if (ts[1] != 2 || ts[2] != 3)
    throw ShapeError(fmt::format("{}: theta must be {{N, 2, 3}}, has shape {}", op, shape_str(ts)));
  if (height < 1 || width < 1)
    throw ShapeError(fmt::format("{}: the grid size {}x{} must be at least 1x1", op, height, width));
  const int64_t n = ts[0];
  const AffineGridBwd variant = ctx.policy().variant<AffineGridBwd>(layer, op::affine_grid);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::affine_grid);
  const bool use_cudnn = ctx.is_cuda() && variant == AffineGridBwd::Cudnn;
  if (use_cudnn && !align_corners)
    throw PolicyError(fmt::format("{}: bwd=cudnn needs align_corners=true (cuDNN's base grid puts -1 and +1 on the "
                                  "corner pixels' centres); supported variants for align_corners=false: atomic, "
                                  "deterministic",
                                  op));
  if (use_cudnn && !fits_int({n, height, width}))
    throw PolicyError(fmt::format("{}: bwd=cudnn takes int-sized dimensions, the grid is {}x{}x{}; supported "
                                  "variants: atomic, deterministic",
                                  op, n, height, width));

  Tensor grid = ctx.empty({n, height, width, 2});
  if (!ctx.is_cuda())
    ref::affine_grid_fwd(theta.value().f32(), grid.f32(), n, height, width, align_corners);
  else if (use_cudnn && n > 0)
    DITTO_CUDNN_VARIANT(cudnnSpatialTfGridGeneratorForward(detail::cuda_state(ctx).cudnn, SpatialTfDesc(n, 1, height, width).d,
                                                           theta.value().f32(), grid.f32()),
                        op, "bwd=cudnn", "atomic, deterministic");
  else
    cuda::affine_grid_fwd(ctx, theta.value().f32(), grid.f32(), n, height, width, align_corners);
  record_affine(ctx, layer, variant, requested);

  const bool grad = needs_grad(ctx, {&theta});
  Var out(std::move(grid), grad);
  if (grad) {
    ctx.tape().record(kGridOp, layer, {{"theta", theta}}, out,
                      [theta, out, height, width, align_corners, variant, requested, layer, op](Context& c) {
                        if (!out.grad().defined()) return;
                        accumulate_grad(c, theta,
                                        affine_backward(c, layer, op, variant, requested, out.grad(), height, width,
                                                        align_corners));
                      });
  }
  return out;
}

namespace {

ref::GridSampleDims check_sample_operands(const Context& ctx, const std::string& op, const Var& x, const Var& grid,
                                          bool align_corners) {
  check_f32_on(ctx, x.value(), op, "x");
  check_f32_on(ctx, grid.value(), op, "grid");
  check_ndim(x.value(), 4, op, "x");
  check_ndim(grid.value(), 4, op, "grid");
  const Shape &xs = x.shape(), &gs = grid.shape();
  if (gs[3] != 2 || gs[0] != xs[0])
    throw ShapeError(fmt::format("{}: grid must be {{N, OH, OW, 2}} with x's batch size {}; x has shape {}, grid {}",
                                 op, xs[0], shape_str(xs), shape_str(gs)));
  ref::GridSampleDims d;
  d.n = xs[0], d.c = xs[1], d.h = xs[2], d.w = xs[3], d.oh = gs[1], d.ow = gs[2];
  d.align_corners = align_corners;
  if (d.h * d.w > INT_MAX || d.oh * d.ow > INT_MAX)
    throw ShapeError(fmt::format("{}: planes of more than 2^31-1 elements are not supported (x {}, grid {})", op,
                                 shape_str(xs), shape_str(gs)));
  return d;
}

// What each backward variant cannot take, as PolicyErrors listing what can.
void check_sample_variant(const Context& ctx, const std::string& op, GridSampleBwd variant,
                          const ref::GridSampleDims& d, const Shape& xs, const Shape& gs) {
  const bool use_cudnn = ctx.is_cuda() && variant == GridSampleBwd::Cudnn;
  if (use_cudnn && !d.align_corners)
    throw PolicyError(fmt::format("{}: bwd=cudnn needs align_corners=true (cuDNN's sampler maps -1 and +1 to the "
                                  "corner pixels' centres); supported variants for align_corners=false: atomic, "
                                  "deterministic",
                                  op));
  if (use_cudnn && !fits_int({d.n, d.c, d.h, d.w, d.oh, d.ow, d.n * d.c * d.h * d.w, d.n * d.c * d.oh * d.ow}))
    throw PolicyError(fmt::format("{}: bwd=cudnn takes int-sized tensors (x {}, grid {}); supported variants: atomic, "
                                  "deterministic",
                                  op, shape_str(xs), shape_str(gs)));
  if (ctx.is_cuda() && variant == GridSampleBwd::Deterministic &&
      (d.n * d.oh * d.ow * 4 > INT_MAX || d.n * d.h * d.w >= int64_t(UINT32_MAX)))
    throw PolicyError(fmt::format("{}: bwd=deterministic sorts one record per (output position, corner) with 32-bit "
                                  "indices, and x {} with grid {} needs more; supported variants: atomic",
                                  op, shape_str(xs), shape_str(gs)));
}

// The input and grid gradients by the layer's variant; returns the workspace it took.
std::size_t sample_backward(Context& c, const std::string& op, GridSampleBwd variant, const ref::GridSampleDims& d,
                            const Var& x, const Var& grid, const Tensor& dy_t, Tensor& dx, Tensor& dg) {
  const bool want_dx = x.requires_grad(), want_dg = grid.requires_grad();
  const float *xv = x.value().f32(), *gv = grid.value().f32(), *dy = dy_t.f32();
  if (!c.is_cuda()) {
    if (want_dx) dx = c.empty(x.shape());
    if (want_dg) dg = c.empty(grid.shape());
    ref::grid_sample_bwd(xv, gv, dy, want_dx ? dx.f32() : nullptr, want_dg ? dg.f32() : nullptr, d);
    return 0;
  }
  if (variant == GridSampleBwd::Atomic) {
    if (want_dx) dx = c.zeros(x.shape());
    if (want_dg) dg = c.empty(grid.shape());
    cuda::grid_sample_bwd_atomic(c, xv, gv, dy, want_dx ? dx.f32() : nullptr, want_dg ? dg.f32() : nullptr, d);
    return 0;
  }
  if (variant == GridSampleBwd::Deterministic) {
    if (want_dx) dx = c.empty(x.shape());
    if (want_dg) dg = c.empty(grid.shape());
    const std::size_t ws_bytes = cuda::grid_sample_bwd_deterministic_workspace(d, want_dx);
    detail::Workspace ws(detail::cuda_state(c), ws_bytes);
    detail::require_workspace(ws, op, "bwd=deterministic", "bwd=atomic needs none");
    cuda::grid_sample_bwd_deterministic(c, xv, gv, dy, want_dx ? dx.f32() : nullptr, want_dg ? dg.f32() : nullptr,
                                        ws.get(), d);
    return ws_bytes;
  }
  // cuDNN computes both gradients in one call.
  dx = c.empty(x.shape());
  dg = c.empty(grid.shape());
  if (dy_t.numel() > 0) {
    cudnn_sampler_bwd(c, op, d, xv, gv, dy, dx.f32(), dg.f32());
  } else {
    DITTO_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.nbytes(), detail::stream_of(c)));
    DITTO_CUDA_CHECK(cudaMemsetAsync(dg.raw(), 0, dg.nbytes(), detail::stream_of(c)));
  }
  return 0;
}

}  // namespace

Var grid_sample(Context& ctx, const std::string& layer, const Var& x, const Var& grid, bool align_corners) {
  const std::string op = op_where(kSampleOp, layer);
  const ref::GridSampleDims d = check_sample_operands(ctx, op, x, grid, align_corners);
  const GridSampleBwd variant = ctx.policy().variant<GridSampleBwd>(layer, op::grid_sample);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::grid_sample);
  check_sample_variant(ctx, op, variant, d, x.shape(), grid.shape());

  Tensor y = ctx.empty({d.n, d.c, d.oh, d.ow});
  if (!ctx.is_cuda())
    ref::grid_sample_fwd(x.value().f32(), grid.value().f32(), y.f32(), d);
  else if (variant == GridSampleBwd::Cudnn && y.numel() > 0)
    cudnn_sampler_fwd(ctx, op, d, x.value().f32(), grid.value().f32(), y.f32());
  else
    cuda::grid_sample_fwd(ctx, x.value().f32(), grid.value().f32(), y.f32(), d);
  record_sample(ctx, layer, variant, requested);

  const bool grad = needs_grad(ctx, {&x, &grid});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record(kSampleOp, layer, {{"x", x}, {"grid", grid}}, out,
                      [x, grid, out, d, variant, requested, layer, op](Context& c) {
                        if (!out.grad().defined()) return;
                        Tensor dx, dg;
                        const std::size_t ws_bytes = sample_backward(c, op, variant, d, x, grid, out.grad(), dx, dg);
                        record_sample(c, layer, variant, requested, ws_bytes);
                        accumulate_grad(c, x, std::move(dx));
                        accumulate_grad(c, grid, std::move(dg));
                      });
  }
  return out;
}

Tensor affine_grid_backward(Context& ctx, const std::string& layer, const Tensor& dgrid, bool align_corners) {
  const std::string op = op_where(kGridOp, layer);
  check_f32_on(ctx, dgrid, op, "dgrid");
  check_ndim(dgrid, 4, op, "dgrid");
  if (dgrid.shape()[3] != 2)
    throw ShapeError(fmt::format("{}: dgrid must be {{N, H, W, 2}}, has shape {}", op, shape_str(dgrid.shape())));
  const AffineGridBwd variant = ctx.policy().variant<AffineGridBwd>(layer, op::affine_grid);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::affine_grid);
  if (ctx.is_cuda() && variant == AffineGridBwd::Cudnn && !align_corners)
    throw PolicyError(fmt::format("{}: bwd=cudnn needs align_corners=true; supported variants for "
                                  "align_corners=false: atomic, deterministic",
                                  op));
  return affine_backward(ctx, layer, op, variant, requested, dgrid, dgrid.shape()[1], dgrid.shape()[2], align_corners);
}

GridSampleGrads grid_sample_backward(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& x,
                                     const Tensor& grid, bool align_corners, bool want_dx, bool want_dgrid) {
  const std::string op = op_where(kSampleOp, layer);
  const Var xv(x, want_dx), gv(grid, want_dgrid);
  const ref::GridSampleDims d = check_sample_operands(ctx, op, xv, gv, align_corners);
  check_f32_on(ctx, dy, op, "dy");
  check_shape(dy, {d.n, d.c, d.oh, d.ow}, op, "dy");
  const GridSampleBwd variant = ctx.policy().variant<GridSampleBwd>(layer, op::grid_sample);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::grid_sample);
  check_sample_variant(ctx, op, variant, d, x.shape(), grid.shape());
  GridSampleGrads g;
  if (!want_dx && !want_dgrid) return g;
  const std::size_t ws_bytes = sample_backward(ctx, op, variant, d, xv, gv, dy, g.dx, g.dgrid);
  record_sample(ctx, layer, variant, requested, ws_bytes);
  if (!want_dx) g.dx = Tensor();
  if (!want_dgrid) g.dgrid = Tensor();
  return g;
}

}  // namespace ditto
