#include "kernels/pool.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "engine/operand_check.h"
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
                           "cudnn", false, "max-pool backward"})

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

void cudnn_max_pool_fwd(Context& ctx, const std::string& layer, PoolBwd v, const ref::PoolDims& g, const float* x,
                        float* y) {
  auto& cs = detail::cuda_state(ctx);
  PoolDesc pd(cudnn_mode(v), g);
  TensorDesc xd(g.n, g.c, g.h, g.w), yd(g.n, g.c, g.oh, g.ow);
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

void cudnn_max_pool_bwd(Context& ctx, const std::string& layer, PoolBwd v, const ref::PoolDims& g, const float* x,
                        const float* y, const float* dy, float* dx) {
  auto& cs = detail::cuda_state(ctx);
  PoolDesc pd(cudnn_mode(v), g);
  TensorDesc xd(g.n, g.c, g.h, g.w), yd(g.n, g.c, g.oh, g.ow);
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

}  // namespace

Shape pool_output_shape(const Shape& x, const PoolParams& p, const std::string& op) {
  return out_shape(pool_dims(x, p, op));
}

Var max_pool2d(Context& ctx, const std::string& layer, const Var& x, const PoolParams& p) {
  const std::string op = where(kMaxOp, layer);
  check_f32_on(ctx, x.value(), op, "x");
  const ref::PoolDims d = pool_dims(x.shape(), p, op);
  PoolBwd variant = ctx.policy().variant<PoolBwd>(layer, op::maxpool2d);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::maxpool2d);
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
  check_f32_on(ctx, x.value(), "avg_pool2d", "x");
  const ref::PoolDims d = pool_dims(x.shape(), p, "avg_pool2d");
  Tensor y = ctx.empty(out_shape(d));
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, "avg");
    if (ctx.is_cuda())
      cuda::avg_pool_fwd(ctx, x.value().f32(), y.f32(), d);
    else
      ref::avg_pool_fwd(x.value().f32(), y.f32(), d);
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("avg_pool2d", "", {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref(), d](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape());
      {
        ProfileScope timed(c, ProfileKind::PoolBwd, "avg");
        if (c.is_cuda())
          cuda::avg_pool_bwd(c, outr.grad().f32(), dx.f32(), d);
        else
          ref::avg_pool_bwd(outr.grad().f32(), dx.f32(), d);
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

Var global_avg_pool(Context& ctx, const Var& x) {
  check_f32_on(ctx, x.value(), "global_avg_pool", "x");
  check_ndim(x.value(), 4, "global_avg_pool", "x");
  const Shape& s = x.shape();
  if (s[2] < 1 || s[3] < 1)
    throw ShapeError(fmt::format("global_avg_pool: x has an empty plane, shape {}", shape_str(s)));
  const int64_t planes = s[0] * s[1], hw = s[2] * s[3];
  Tensor y = ctx.empty({s[0], s[1]});
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, "global-avg");
    if (ctx.is_cuda())
      cuda::global_avg_pool_fwd(ctx, x.value().f32(), y.f32(), planes, hw);
    else
      ref::global_avg_pool_fwd(x.value().f32(), y.f32(), planes, hw);
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("global_avg_pool", "", {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref(), planes, hw](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape());
      {
        ProfileScope timed(c, ProfileKind::PoolBwd, "global-avg");
        if (c.is_cuda())
          cuda::global_avg_pool_bwd(c, outr.grad().f32(), dx.f32(), planes, hw);
        else
          ref::global_avg_pool_bwd(outr.grad().f32(), dx.f32(), planes, hw);
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

Var adaptive_avg_pool2d(Context& ctx, const Var& x, int64_t out_h, int64_t out_w) {
  check_f32_on(ctx, x.value(), "adaptive_avg_pool2d", "x");
  check_ndim(x.value(), 4, "adaptive_avg_pool2d", "x");
  const Shape& s = x.shape();
  if (out_h < 1 || out_w < 1)
    throw ShapeError(fmt::format("adaptive_avg_pool2d: output size {}x{} must be at least 1x1", out_h, out_w));
  if (s[2] < 1 || s[3] < 1)
    throw ShapeError(fmt::format("adaptive_avg_pool2d: x has an empty plane, shape {}", shape_str(s)));
  ref::AdaptivePoolDims d;
  d.planes = s[0] * s[1];
  d.h = s[2];
  d.w = s[3];
  d.oh = out_h;
  d.ow = out_w;
  Tensor y = ctx.empty({s[0], s[1], out_h, out_w});
  {
    ProfileScope timed(ctx, ProfileKind::PoolFwd, "adaptive-avg");
    if (ctx.is_cuda())
      cuda::adaptive_avg_pool_fwd(ctx, x.value().f32(), y.f32(), d);
    else
      ref::adaptive_avg_pool_fwd(x.value().f32(), y.f32(), d);
  }
  const bool grad = needs_grad(ctx, {&x});
  Var out(std::move(y), grad);
  if (grad) {
    ctx.tape().record("adaptive_avg_pool2d", "", {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref(), d](Context& c) {
      if (!outr.grad().defined()) return;
      Tensor dx = c.empty(xr.shape());
      {
        ProfileScope timed(c, ProfileKind::PoolBwd, "adaptive-avg");
        if (c.is_cuda())
          cuda::adaptive_avg_pool_bwd(c, outr.grad().f32(), dx.f32(), d);
        else
          ref::adaptive_avg_pool_bwd(outr.grad().f32(), dx.f32(), d);
      }
      accumulate_grad(c, xr, std::move(dx));
    });
  }
  return out;
}

}  // namespace ditto
