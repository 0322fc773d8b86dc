#include "kernels/pool.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "engine/operand_check.h"
#include "engine/tensor_ops.h"
#include "kernels/detail/pool_cuda.h"
#include "kernels/detail/tuned.h"
#include "kernels/pool_ref.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

// cuDNN's CUDNN_POOLING_MAX backward scatters with atomics where windows overlap.
DITTO_KNOB(pool_bwd_knob, {op::maxpool2d, "bwd",
                           {{"cudnn", kNot, kLib, "CUDNN_POOLING_MAX"},
                            {"cudnn-deterministic", kRun, kLib, "CUDNN_POOLING_MAX_DETERMINISTIC"},
                            {"atomic-scatter", kNot, kOwn, "atomicAdd from every output"},
                            {"gather", kGpu, kOwn, "one thread per input adds its windows in order"}},
                           "cudnn", false, "max-pool backward",
                           // PyTorch runs its own max-pool kernels, whose backward gathers per input.
                           "gather"})

const char* name_of(PoolBwd p) { return variant_name(pool_bwd_knob(), p); }

namespace {

constexpr const char* kMaxOp = "maxpool2d";

std::string where(const std::string& op, const std::string& layer) {
  return layer.empty() ? op : fmt::format("{} (layer '{}')", op, layer);
}

ref::PoolDims pool_dims(const Shape& x, const PoolParams& p, const std::string& op) {
  if (x.size() != 4) throw ShapeError(fmt::format("{}: x must be NCHW (4 dimensions), has shape {}", op, shape_str(x)));
  auto bad = [&](const std::string& what) {
    return ShapeError(fmt::format("{}: {} (kernel {}x{}, stride {}x{}, pad {}x{}, x {})", op, what, p.kernel_h,
                                  p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, shape_str(x)));
  };
  if (p.kernel_h < 1 || p.kernel_w < 1) throw bad("kernel must be >= 1");
  if (p.stride_h < 1 || p.stride_w < 1) throw bad("stride must be >= 1");
  if (p.pad_h < 0 || p.pad_w < 0 || p.pad_h >= p.kernel_h || p.pad_w >= p.kernel_w)
    throw bad("padding must satisfy 0 <= pad < kernel");
  if (x[2] + 2 * p.pad_h < p.kernel_h || x[3] + 2 * p.pad_w < p.kernel_w)
    throw bad("the padded input is smaller than the kernel");
  if (x[2] * x[3] > INT_MAX || x[0] * x[1] > INT_MAX)
    throw bad("a plane of more than 2^31-1 elements, or more than 2^31-1 planes, is not supported");
  ref::PoolDims d;
  d.n = x[0];
  d.c = x[1];
  d.h = x[2];
  d.w = x[3];
  d.kh = p.kernel_h;
  d.kw = p.kernel_w;
  d.sh = p.stride_h;
  d.sw = p.stride_w;
  d.ph = p.pad_h;
  d.pw = p.pad_w;
  d.oh = (d.h + 2 * d.ph - d.kh) / d.sh + 1;
  d.ow = (d.w + 2 * d.pw - d.kw) / d.sw + 1;
  return d;
}

Shape out_shape(const ref::PoolDims& d) { return {d.n, d.c, d.oh, d.ow}; }

// ---- cuDNN max pooling (RAII descriptors; cudnn.h stays out of the public header) ----------
using TensorDesc = detail::CudnnTensorDesc;

struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  PoolDesc(cudnnPoolingMode_t mode, const ref::PoolDims& g) {
    DITTO_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d));
    // NaN propagates, as in ditto's own kernels.
    DITTO_CUDNN_CHECK(cudnnSetPooling2dDescriptor(d, mode, CUDNN_PROPAGATE_NAN, g.kh, g.kw, g.ph, g.pw, g.sh, g.sw));
  }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(d); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
};

cudnnPoolingMode_t cudnn_mode(PoolBwd v) {
  return v == PoolBwd::CudnnDeterministic ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_MAX;
}

// A pinned cuDNN variant that cuDNN refuses for this shape is a PolicyError naming the layer,
// the shape and the variants that do run; other failures stay CudnnErrors.
void cudnn_pool_call(cudnnStatus_t s, const char* expr, const std::string& layer, PoolBwd v, const ref::PoolDims& g) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  const int category = int(s) / 1000 * 1000;
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM)
    throw PolicyError(fmt::format(
        "{}: variant bwd={} is not supported by cuDNN for x {} (kernel {}x{}, stride {}x{}, pad {}x{}): {}; "
        "supported variants: atomic-scatter, gather",
        where(kMaxOp, layer), name_of(v), shape_str({g.n, g.c, g.h, g.w}), g.kh, g.kw, g.sh, g.sw, g.ph, g.pw,
        cudnnGetErrorString(s)));
  detail::throw_cudnn(s, expr, __FILE__, __LINE__);
}

// x, y (and dy, dx below) are of dtype t, channels-last where nhwc says.
void cudnn_max_pool_fwd(Context& ctx, const std::string& layer, PoolBwd v, const ref::PoolDims& g, const void* x,
                        void* y, DType t = DType::F32, bool nhwc = false) {
  auto& cs = detail::cuda_state(ctx);
  PoolDesc pd(cudnn_mode(v), g);
  TensorDesc xd, yd;
  xd.set(g.n, g.c, g.h, g.w, t, nhwc);
  yd.set(g.n, g.c, g.oh, g.ow, t, nhwc);
  int on = 0, oc = 0, oh = 0, ow = 0;
  DITTO_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pd.d, xd.d, &on, &oc, &oh, &ow));
  if (oh != g.oh || ow != g.ow)
    throw PolicyError(fmt::format("{}: cuDNN computes a {}x{} output for x {} but ditto's contract is {}x{}; "
                                  "supported variants: atomic-scatter, gather",
                                  where(kMaxOp, layer), oh, ow, shape_str({g.n, g.c, g.h, g.w}), g.oh, g.ow));
  const float one = 1.f, zero = 0.f;
  cudnn_pool_call(cudnnPoolingForward(cs.cudnn, pd.d, &one, xd.d, x, &zero, yd.d, y), "cudnnPoolingForward", layer,
                  v, g);
}

void cudnn_max_pool_bwd(Context& ctx, const std::string& layer, PoolBwd v, const ref::PoolDims& g, const void* x,
                        const void* y, const void* dy, void* dx, DType t = DType::F32, bool nhwc = false) {
  auto& cs = detail::cuda_state(ctx);
  PoolDesc pd(cudnn_mode(v), g);
  TensorDesc xd, yd;
  xd.set(g.n, g.c, g.h, g.w, t, nhwc);
  yd.set(g.n, g.c, g.oh, g.ow, t, nhwc);
  const float one = 1.f, zero = 0.f;
  cudnn_pool_call(cudnnPoolingBackward(cs.cudnn, pd.d, &one, yd.d, y, yd.d, dy, xd.d, x, &zero, xd.d, dx),
                  "cudnnPoolingBackward", layer, v, g);
}

Determinism determinism_of(PoolBwd v) {
  switch (v) {
    case PoolBwd::Cudnn: return Determinism::No;  // cuDNN: CUDNN_POOLING_MAX backward uses atomics
    case PoolBwd::CudnnDeterministic: return Determinism::Yes;
    case PoolBwd::AtomicScatter: return Determinism::No;
    case PoolBwd::Gather: return Determinism::Yes;
  }
  return Determinism::Unknown;
}

void record_max_pool(Context& ctx, const std::string& layer, PoolBwd v, const std::string& requested) {
  if (ctx.is_cuda())
    ctx.manifest().record({layer, kMaxOp, "bwd", name_of(v), requested, determinism_of(v), "", 0, ctx.device().str(), "",
                           guarantee_of(determinism_of(v), v == PoolBwd::Cudnn || v == PoolBwd::CudnnDeterministic
                                                               ? Impl::Library
                                                               : Impl::Ditto)});
  else
    ctx.manifest().record({layer, kMaxOp, "bwd", "cpu-reference", requested, Determinism::Yes, "", 0,
                           ctx.device().str(), "", guarantee_of(Determinism::Yes, Impl::CpuReference)});
}

bool uses_own_argmax(const Context& ctx, PoolBwd v) {
  return !ctx.is_cuda() || v == PoolBwd::AtomicScatter || v == PoolBwd::Gather;
}

// Max pooling of x in any float dtype and either layout but f32 NCHW (a native bf16 channels-last
// result): y and dx in x's form. The CPU reference reads x widened to f32 NCHW (the max is one of
// x's values, so exact) and its dx sums in output order, as the gather does, rounded once.
Var max_pool_any(Context& ctx, const std::string& layer, const Var& x, const ref::PoolDims& d, PoolBwd variant,
                 const std::string& requested) {
  const Tensor& xv = x.value();
  const DType t = xv.dtype();
  const Layout lay = xv.layout();
  const bool nhwc = xv.channels_last();
  const bool grad = needs_grad(ctx, {&x});
  const bool own = uses_own_argmax(ctx, variant);
  Tensor y = ctx.empty(out_shape(d), t, lay);
  Tensor argmax;  // in y's memory order (NCHW order on the CPU, whose reference runs there)
  if (own && grad) argmax = ctx.empty(out_shape(d), DType::I32);
  int32_t* am = argmax.defined() ? argmax.i32() : nullptr;
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, ctx.is_cuda() ? name_of(variant) : "cpu-reference");
    if (!ctx.is_cuda()) {
      Tensor yf = ctx.empty(out_shape(d));
      ref::max_pool_fwd(to_form(ctx, xv, DType::F32, Layout::Nchw).f32(), yf.f32(), am, d);
      y = to_form(ctx, yf, t, lay);
    } else if (own) {
      cuda::max_pool_fwd_argmax_any(ctx, t, nhwc, xv.raw(), y.raw(), am, d);
    } else {
      cudnn_max_pool_fwd(ctx, layer, variant, d, xv.raw(), y.raw(), t, nhwc);
    }
  }
  record_max_pool(ctx, layer, variant, requested);
  Var out(std::move(y), grad);
  if (grad) {
    const bool cudnn_bwd = ctx.is_cuda() && !own;
    Tensor saved_x = cudnn_bwd ? xv : Tensor(), saved_y = cudnn_bwd ? out.value() : Tensor();
    ctx.tape().record(kMaxOp, layer, {{"x", x}}, out,
                      [saved_x, saved_y, xr = x.grad_ref(), outr = out.grad_ref(), argmax, d, variant, requested,
                       layer, t, lay, nhwc](Context& c) {
      if (!outr.grad().defined()) return;
      const Tensor& dy = outr.grad();
      record_max_pool(c, layer, variant, requested);
      Tensor dx;
      ProfileScope timed(c, ProfileKind::PoolBwd, c.is_cuda() ? name_of(variant) : "cpu-reference");
      if (!c.is_cuda()) {
        Tensor dxf = c.empty(xr.shape());
        ref::max_pool_bwd(to_form(c, dy, DType::F32, Layout::Nchw).f32(), argmax.i32(), dxf.f32(), d);
        dx = to_form(c, dxf, t, lay);
      } else if (variant == PoolBwd::AtomicScatter) {
        Tensor dx32 = c.zeros(xr.shape(), DType::F32, lay);
        cuda::max_pool_bwd_atomic_scatter_any(c, t, nhwc, dy.raw(), argmax.i32(), dx32.f32(), d);
        dx = to_dtype(c, dx32, t);
      } else if (variant == PoolBwd::Gather) {
        dx = c.empty(xr.shape(), t, lay);
        cuda::max_pool_bwd_gather_any(c, t, nhwc, dy.raw(), argmax.i32(), dx.raw(), d);
      } else {
        dx = c.empty(xr.shape(), t, lay);
        cudnn_max_pool_bwd(c, layer, variant, d, saved_x.raw(), saved_y.raw(), dy.raw(), dx.raw(), t, nhwc);
      }
      timed.end();
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

}  // namespace

Shape pool_output_shape(const Shape& x, const PoolParams& p, const std::string& op) {
  return out_shape(pool_dims(x, p, op));
}

Var max_pool2d(Context& ctx, const std::string& layer, const Var& x, const PoolParams& p) {
  const std::string op = where(kMaxOp, layer);
  check_float_any_layout_on(ctx, x.value(), op, "x");
  const ref::PoolDims d = pool_dims(x.shape(), p, op);
  PoolBwd variant = ctx.policy().variant<PoolBwd>(layer, op::maxpool2d);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::maxpool2d);
  // Any form but f32 NCHW: its own path (the tuning file times f32 NCHW pooling only; other forms
  // take the mode's pick, which is deterministic under the deterministic mode either way).
  if (x.value().dtype() != DType::F32 || x.value().channels_last())
    return max_pool_any(ctx, layer, x, d, variant, requested);
  if (ctx.is_cuda() && ctx.tuning() && requested == "deterministic") {
    // Both deterministic variants, timed forward and backward (the variant picks the forward too).
    TuningEntry e;
    e.op = kMaxOp;
    e.direction = "bwd";
    e.x = x.shape();
    e.w = {d.kh, d.kw};
    e.stride_h = int(d.sh), e.stride_w = int(d.sw), e.pad_h = int(d.ph), e.pad_w = int(d.pw);
    e.layer = layer;
    Tensor y = ctx.empty(out_shape(d)), dy = ctx.zeros(out_shape(d)), dx = ctx.empty(x.shape());
    Tensor am = ctx.empty(out_shape(d), DType::I32);
    variant = detail::tuned_choice<PoolBwd>(
        ctx, e, {PoolBwd::CudnnDeterministic, PoolBwd::Gather},
        [&](PoolBwd v) {
          if (v == PoolBwd::Gather) {
            cuda::max_pool_fwd_argmax(ctx, x.value().f32(), y.f32(), am.i32(), d);
            cuda::max_pool_bwd_gather(ctx, dy.f32(), am.i32(), dx.f32(), d);
          } else {
            cudnn_max_pool_fwd(ctx, layer, v, d, x.value().f32(), y.f32());
            cudnn_max_pool_bwd(ctx, layer, v, d, x.value().f32(), y.f32(), dy.f32(), dx.f32());
          }
        },
        op);
  }
  const bool grad = needs_grad(ctx, {&x});
  const bool own = uses_own_argmax(ctx, variant);

  Tensor y = ctx.empty(out_shape(d));
  Tensor argmax;  // own kernels' winners, kept for backward
  if (own && grad) argmax = ctx.empty(out_shape(d), DType::I32);
  int32_t* am = argmax.defined() ? argmax.i32() : nullptr;
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, ctx.is_cuda() ? name_of(variant) : "cpu-reference");
    if (!ctx.is_cuda())
      ref::max_pool_fwd(x.value().f32(), y.f32(), am, d);
    else if (own)
      cuda::max_pool_fwd_argmax(ctx, x.value().f32(), y.f32(), am, d);
    else
      cudnn_max_pool_fwd(ctx, layer, variant, d, x.value().f32(), y.f32());
  }
  record_max_pool(ctx, layer, variant, requested);

  Var out(std::move(y), grad);
  if (grad) {
    // cuDNN's backward reads x and y; ditto's own kernels only the argmax.
    const bool cudnn_bwd = ctx.is_cuda() && !own;
    Tensor saved_x = cudnn_bwd ? x.value() : Tensor(), saved_y = cudnn_bwd ? out.value() : Tensor();
    ctx.tape().record(kMaxOp, layer, {{"x", x}}, out,
                      [saved_x, saved_y, xr = x.grad_ref(), outr = out.grad_ref(), argmax, d, variant, requested,
                       layer](Context& c) {
      if (!outr.grad().defined()) return;
      record_max_pool(c, layer, variant, requested);
      Tensor dx;
      ProfileScope timed(c, ProfileKind::PoolBwd, c.is_cuda() ? name_of(variant) : "cpu-reference");
      if (!c.is_cuda()) {
        dx = c.empty(xr.shape());
        ref::max_pool_bwd(outr.grad().f32(), argmax.i32(), dx.f32(), d);
      } else if (variant == PoolBwd::AtomicScatter) {
        dx = c.zeros(xr.shape());
        cuda::max_pool_bwd_atomic_scatter(c, outr.grad().f32(), argmax.i32(), dx.f32(), d);
      } else if (variant == PoolBwd::Gather) {
        dx = c.empty(xr.shape());
        cuda::max_pool_bwd_gather(c, outr.grad().f32(), argmax.i32(), dx.f32(), d);
      } else {
        dx = c.empty(xr.shape());
        cudnn_max_pool_bwd(c, layer, variant, d, saved_x.f32(), saved_y.f32(), outr.grad().f32(), dx.f32());
      }
      timed.end();
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

Var avg_pool2d(Context& ctx, const Var& x, const PoolParams& p) {
  check_float_any_layout_on(ctx, x.value(), "avg_pool2d", "x");
  const ref::PoolDims d = pool_dims(x.shape(), p, "avg_pool2d");
  // f32 NCHW runs the float kernels; any other form (a native bf16 channels-last result) the
  // kernels that read it as it is, in the same window orders, y and dx rounded once to x's dtype
  // in x's layout. The CPU reference reads x widened to f32 NCHW.
  const Tensor& xv = x.value();
  const DType t = xv.dtype();
  const Layout lay = xv.layout();
  const bool plain = t == DType::F32 && !xv.channels_last();
  Tensor y = ctx.empty(out_shape(d), t, lay);
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, "avg");
    if (ctx.is_cuda() && plain) {
      cuda::avg_pool_fwd(ctx, xv.f32(), y.f32(), d);
    } else if (ctx.is_cuda()) {
      cuda::avg_pool_fwd_any(ctx, t, xv.channels_last(), xv.raw(), y.raw(), d);
    } else if (plain) {
      ref::avg_pool_fwd(xv.f32(), y.f32(), d);
    } else {
      Tensor yf = ctx.empty(out_shape(d));
      ref::avg_pool_fwd(to_form(ctx, xv, DType::F32, Layout::Nchw).f32(), yf.f32(), d);
      y = to_form(ctx, yf, t, lay);
    }
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("avg_pool2d", "", {{"x", x}}, out,
                      [xr = x.grad_ref(), outr = out.grad_ref(), d, plain, t, lay](Context& c) {
      if (!outr.grad().defined()) return;
      const Tensor& dy = outr.grad();
      Tensor dx = c.empty(xr.shape(), t, lay);
      {
        ProfileScope timed(c, ProfileKind::PoolBwd, "avg");
        if (c.is_cuda() && plain) {
          cuda::avg_pool_bwd(c, dy.f32(), dx.f32(), d);
        } else if (c.is_cuda()) {
          cuda::avg_pool_bwd_any(c, t, lay == Layout::Nhwc, dy.raw(), dx.raw(), d);
        } else if (plain) {
          ref::avg_pool_bwd(dy.f32(), dx.f32(), d);
        } else {
          Tensor df = c.empty(xr.shape());
          ref::avg_pool_bwd(to_form(c, dy, DType::F32, Layout::Nchw).f32(), df.f32(), d);
          dx = to_form(c, df, t, lay);
        }
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

Var global_avg_pool(Context& ctx, const Var& x) {
  check_float_any_layout_on(ctx, x.value(), "global_avg_pool", "x");
  check_ndim(x.value(), 4, "global_avg_pool", "x");
  const Shape& s = x.shape();
  if (s[2] < 1 || s[3] < 1)
    throw ShapeError(fmt::format("global_avg_pool: x has an empty plane, shape {}", shape_str(s)));
  const int64_t planes = s[0] * s[1], hw = s[2] * s[3];
  // x in any float dtype and layout (a native bf16 channels-last result as it is); the CPU widens
  // it to f32 NCHW (exact) for the reference, a no-op for f32 NCHW.
  Tensor y = ctx.empty({s[0], s[1]});
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, "global-avg");
    if (ctx.is_cuda())
      cuda::global_avg_pool_fwd_any(ctx, x.value().dtype(), x.value().channels_last(), x.value().raw(), y.f32(), s[0],
                                    s[1], hw);
    else
      ref::global_avg_pool_fwd(to_form(ctx, x.value(), DType::F32, Layout::Nchw).f32(), y.f32(), planes, hw);
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("global_avg_pool", "", {{"x", x}}, out,
                      [xr = x.grad_ref(), outr = out.grad_ref(), s, planes, hw, dtype = x.value().dtype(),
                       layout = x.value().layout()](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape(), dtype, layout);
      {
        ProfileScope timed(c, ProfileKind::PoolBwd, "global-avg");
        if (c.is_cuda()) {
          cuda::global_avg_pool_bwd_any(c, dtype, layout == Layout::Nhwc, outr.grad().f32(), dx.raw(), s[0], s[1], hw);
        } else {
          Tensor df = c.empty(xr.shape());
          ref::global_avg_pool_bwd(outr.grad().f32(), df.f32(), planes, hw);
          dx = to_form(c, df, dtype, layout);
        }
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

Var adaptive_avg_pool2d(Context& ctx, const Var& x, int64_t out_h, int64_t out_w) {
  check_float_any_layout_on(ctx, x.value(), "adaptive_avg_pool2d", "x");
  check_ndim(x.value(), 4, "adaptive_avg_pool2d", "x");
  const Shape& s = x.shape();
  if (out_h < 1 || out_w < 1)
    throw ShapeError(fmt::format("adaptive_avg_pool2d: output size {}x{} must be at least 1x1", out_h, out_w));
  if (s[2] < 1 || s[3] < 1)
    throw ShapeError(fmt::format("adaptive_avg_pool2d: x has an empty plane, shape {}", shape_str(s)));
  // Any form but f32 NCHW (a native bf16 channels-last result): y is f32 NCHW, dx in x's form. The
  // GPU reads it for the 1x1 output (squeeze-and-excitation) with the global average pool's
  // kernels, whose windows are the same; the CPU widens x for the reference.
  const Tensor& xv = x.value();
  const bool plain = xv.dtype() == DType::F32 && !xv.channels_last();
  const bool global = out_h == 1 && out_w == 1;
  if (!plain && ctx.is_cuda() && !global)
    throw ShapeError(fmt::format("adaptive_avg_pool2d: x is {} {}; on the GPU an output of {}x{} needs f32 NCHW x "
                                 "(1x1 reads any float dtype and layout)",
                                 xv.type_tag(), shape_str(s), out_h, out_w));
  ref::AdaptivePoolDims d;
  d.planes = s[0] * s[1];
  d.h = s[2];
  d.w = s[3];
  d.oh = out_h;
  d.ow = out_w;
  Tensor y = ctx.empty({s[0], s[1], out_h, out_w});
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, "adaptive-avg");
    if (ctx.is_cuda() && plain)
      cuda::adaptive_avg_pool_fwd(ctx, xv.f32(), y.f32(), d);
    else if (ctx.is_cuda())
      cuda::global_avg_pool_fwd_any(ctx, xv.dtype(), xv.channels_last(), xv.raw(), y.f32(), s[0], s[1], s[2] * s[3]);
    else
      ref::adaptive_avg_pool_fwd((plain ? xv : to_form(ctx, xv, DType::F32, Layout::Nchw)).f32(), y.f32(), d);
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("adaptive_avg_pool2d", "", {{"x", x}}, out,
                      [xr = x.grad_ref(), outr = out.grad_ref(), d, s, plain, dtype = xv.dtype(),
                       layout = xv.layout()](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape(), dtype, layout);
      {
        ProfileScope timed(c, ProfileKind::PoolBwd, "adaptive-avg");
        if (c.is_cuda() && plain) {
          cuda::adaptive_avg_pool_bwd(c, outr.grad().f32(), dx.f32(), d);
        } else if (c.is_cuda()) {
          cuda::global_avg_pool_bwd_any(c, dtype, layout == Layout::Nhwc, outr.grad().f32(), dx.raw(), s[0], s[1],
                                        s[2] * s[3]);
        } else if (plain) {
          ref::adaptive_avg_pool_bwd(outr.grad().f32(), dx.f32(), d);
        } else {
          Tensor df = c.empty(xr.shape());
          ref::adaptive_avg_pool_bwd(outr.grad().f32(), df.f32(), d);
          dx = to_form(c, df, dtype, layout);
        }
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

}  // namespace ditto
