#include "kernels/batchnorm.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "kernels/batchnorm_ref.h"
#include "engine/operand_check.h"
#include "kernels/detail/batchnorm_cuda.h"
#include "kernels/sync_batchnorm.h"
#include "engine/tensor_ops.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

// cuDNN documents its batch-norm backward neither way.
DITTO_KNOB(bn_bwd_knob, {op::batchnorm, "bwd",
                         {{"cudnn", Guarantee::Unknown, kLib, "cudnnBatchNormalizationBackward"},
                          {"atomic", kNot, kOwn, "per-channel sums by atomicAdd"},
                          {"deterministic", kGpu, kOwn, "per-channel sums by a fixed-order tree"}},
                         "cudnn", false, "batch-norm backward's per-channel sums"})

DITTO_KNOB(bn_stats_knob, {op::batchnorm, "stats",
                           {{"local", kGpu, kOwn, "the statistics of the examples this call sees", true},
                            {"sync", kGpu, kOwn, "every rank's statistics merged in rank order", true}},
                           "local", false, "whose batch statistics normalize in training"})

const char* name_of(BnBwd b) { return variant_name(bn_bwd_knob(), b); }
const char* name_of(BnStats s) { return variant_name(bn_stats_knob(), s); }

namespace {

constexpr const char* kOp = "batchnorm";

// ---- cuDNN (RAII descriptors; cudnn.h stays out of the public header) ----------------------
using TensorDesc = detail::CudnnTensorDesc;

// x/y descriptor (N, C, HW, 1) in x's dtype and layout, and the derived per-channel descriptor
// (1, C, 1, 1; float for every x dtype).
struct BnDescs {
  TensorDesc x, bn;
  BnDescs(const cuda::BnDims& d, const Tensor& xt) {
    const cudnnDataType_t t = xt.dtype() == DType::BF16 ? CUDNN_DATA_BFLOAT16
                              : xt.dtype() == DType::F16 ? CUDNN_DATA_HALF
                                                         : CUDNN_DATA_FLOAT;
    DITTO_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.d, xt.channels_last() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, t,
                                                 int(d.n), int(d.c), int(d.hw), 1));
    DITTO_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn.d, x.d, CUDNN_BATCHNORM_SPATIAL));
  }
};

// A cuDNN refusal for this shape is a PolicyError naming the layer, the shape and the variants
// that do run; other failures stay CudnnErrors.
void cudnn_bn_call(cudnnStatus_t s, const char* expr, const std::string& layer, const Shape& x) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  const int category = int(s) / 1000 * 1000;
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM)
    throw PolicyError(fmt::format("{} (layer '{}'): variant bwd=cudnn is not supported by cuDNN for x {}: {} ({}); "
                                  "supported variants: atomic, deterministic",
                                  kOp, layer, shape_str(x), cudnnGetErrorString(s), expr));
  detail::throw_cudnn(s, expr, __FILE__, __LINE__);
}

Determinism determinism_of(BnBwd v) {
  switch (v) {
    case BnBwd::Cudnn: return Determinism::Unknown;  // not documented either way (see batchnorm.h)
    case BnBwd::Atomic: return Determinism::No;
    case BnBwd::Deterministic: return Determinism::Yes;
  }
  return Determinism::Unknown;
}

void record_bn(Context& ctx, const std::string& layer, BnBwd v, const std::string& requested) {
  if (ctx.is_cuda())
    ctx.manifest().record({layer, kOp, "bwd", name_of(v), requested, determinism_of(v), "", 0, ctx.device().str(), "",
                           guarantee_of(determinism_of(v), v == BnBwd::Cudnn ? Impl::Library : Impl::Ditto)});
  else
    ctx.manifest().record({layer, kOp, "bwd", "cpu-reference", requested, Determinism::Yes, "", 0, ctx.device().str(), "",
                           guarantee_of(Determinism::Yes, Impl::CpuReference)});
}

}  // namespace

void detail::record_bn_stats(Context& ctx, const std::string& layer, BnStats s) {
  const VariantSpec& v = bn_stats_knob().variants[static_cast<std::size_t>(s)];
  ctx.manifest().record({layer, kOp, "stats", v.name, ctx.policy().requested(layer, "stats", op::batchnorm),
                         Determinism::Yes, "", 0, ctx.device().str(), "",
                         ctx.is_cuda() ? v.guarantee : guarantee_of(Determinism::Yes, Impl::CpuReference)});
}

namespace {

void check_channel_vec(const Context& ctx, const Tensor& t, int64_t c, const std::string& op, const char* what) {
  check_f32_on(ctx, t, op, what);
  if (t.shape() != Shape{c})
    throw ShapeError(fmt::format("{}: {} must have shape [{}] (one per channel of x), has {}", op, what, c,
                                 shape_str(t.shape())));
}

}  // namespace

BatchNormState batch_norm_state(Context& ctx, int64_t channels) {
  return {ctx.zeros({channels}), ctx.full({channels}, 1.0f)};
}

namespace {

// The operands' shapes, devices and the scalars; throws ShapeError naming the layer.
cuda::BnDims check_bn_operands(const Context& ctx, const std::string& op, const Var& x, const Var& gamma,
                               const Var& beta, const BatchNormState& state, bool training, float momentum,
                               float eps) {
  check_float_any_layout_on(ctx, x.value(), op, "x");
  check_ndim(x.value(), 4, op, "x");
  const Shape& xs = x.shape();
  if (ctx.is_cuda() && x.value().dtype() != DType::F32 && !x.value().channels_last())
    throw ShapeError(fmt::format("{}: x is {} {}; on the GPU batch norm reads f32 NCHW, or channels-last tensors of "
                                 "any float dtype (conv2d.layout=nhwc with conv2d.output=native)",
                                 op, x.value().type_tag(), shape_str(xs)));
  const cuda::BnDims d{xs[0], xs[1], xs[2] * xs[3]};
  check_channel_vec(ctx, gamma.value(), d.c, op, "gamma");
  check_channel_vec(ctx, beta.value(), d.c, op, "beta");
  check_channel_vec(ctx, state.running_mean, d.c, op, "state.running_mean");
  check_channel_vec(ctx, state.running_var, d.c, op, "state.running_var");
  if (training && d.m() < 2)
    throw ShapeError(fmt::format("{}: training needs more than one value per channel (x {}); the unbiased "
                                 "variance divides by N*H*W - 1",
                                 op, shape_str(xs)));
  if (!(eps > 0.f)) throw ShapeError(fmt::format("{}: eps must be > 0, is {}", op, eps));
  if (!(momentum >= 0.f && momentum <= 1.f)) throw ShapeError(fmt::format("{}: momentum must be in [0, 1], is {}", op, momentum));
  if (ctx.is_cuda() && (d.n > INT_MAX || d.c > 65535 || d.hw > INT_MAX))
    throw ShapeError(fmt::format("{}: x {} is too large (N and H*W up to 2^31-1, C up to 65535)", op, shape_str(xs)));
  return d;
}

// The layer's bwd variant. Inference-mode backward has no cuDNN routine (see batchnorm.h): a
// pinned cudnn is an error there, a mode's cudnn becomes ditto's deterministic kernels.
BnBwd resolve_bn_bwd(const Context& ctx, const std::string& layer, const std::string& op, const std::string& requested,
                     bool training, bool grad, const Tensor& x) {
  const Shape& xs = x.shape();
  BnBwd variant = ctx.policy().variant<BnBwd>(layer, op::batchnorm);
  // bf16/f16 channels-last: PyTorch runs its own batch-norm kernels there (its cuDNN path takes no
  // bf16), which reduce in a fixed order; cuDNN's legacy routines run, but 20x slower than ditto's
  // (CUDNN_BATCHNORM_SPATIAL on NHWC bf16, the H100). A mode's cudnn therefore runs ditto's
  // deterministic kernels, and the manifest records them; a pinned cudnn runs cuDNN.
  if (ctx.is_cuda() && variant == BnBwd::Cudnn && requested != "pinned" && x.channels_last() &&
      x.dtype() != DType::F32)
    variant = BnBwd::Deterministic;
  if (ctx.is_cuda() && !training && grad && variant == BnBwd::Cudnn) {
    if (requested == "pinned")
      throw PolicyError(fmt::format("{}: bwd=cudnn is pinned, but cuDNN has no inference-mode (training=false) "
                                    "batch-norm backward for x {}; supported there: atomic, deterministic",
                                    op, shape_str(xs)));
    variant = BnBwd::Deterministic;
  }
  return variant;
}

// What the forward pass leaves for the backward: the statistics it normalized with.
struct BnSaved {
  Tensor mean, invstd;
};

void bn_forward_cudnn(Context& ctx, const std::string& layer, const Var& x, const Var& gamma, const Var& beta,
                      BatchNormState& state, bool training, float momentum, float eps, const cuda::BnDims& d,
                      Tensor& y, BnSaved& saved) {
  auto& cs = detail::cuda_state(ctx);
  BnDescs desc(d, x.value());
  const float one = 1.f, zero = 0.f;
  if (training) {
    // cudnn saves the inverse std 1/sqrt(var + eps), as ours does.
    cudnn_bn_call(cudnnBatchNormalizationForwardTraining(
                      cs.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, desc.x.d, x.value().raw(), desc.x.d, y.raw(),
                      desc.bn.d, gamma.value().f32(), beta.value().f32(), double(momentum),
                      state.running_mean.f32(), state.running_var.f32(), double(eps), saved.mean.f32(),
                      saved.invstd.f32()),
                  "cudnnBatchNormalizationForwardTraining", layer, x.shape());
  } else {
    cudnn_bn_call(cudnnBatchNormalizationForwardInference(cs.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, desc.x.d,
                                                          x.value().raw(), desc.x.d, y.raw(), desc.bn.d,
                                                          gamma.value().f32(), beta.value().f32(),
                                                          state.running_mean.f32(), state.running_var.f32(),
                                                          double(eps)),
                  "cudnnBatchNormalizationForwardInference", layer, x.shape());
  }
}

void bn_forward_own(Context& ctx, const Var& x, const Var& gamma, const Var& beta, BatchNormState& state,
                    bool training, float momentum, float eps, const cuda::BnDims& d, Tensor& y, BnSaved& saved) {
  const Tensor& xv = x.value();
  if (xv.channels_last()) {
    Tensor scratch = ctx.empty({cuda::bn_nhwc_scratch_floats(d)});
    if (training) {
      cuda::bn_nhwc_batch_stats(ctx, xv.dtype(), xv.raw(), d, momentum, eps, gamma.value().f32(), beta.value().f32(),
                                saved.mean.f32(), saved.invstd.f32(), state.running_mean.f32(),
                                state.running_var.f32(), scratch.f32());
    } else {
      cuda::bn_running_stats(ctx, state.running_mean.f32(), state.running_var.f32(), d.c, eps, saved.mean.f32(),
                             saved.invstd.f32());
      cuda::bn_nhwc_running_affine(ctx, saved.mean.f32(), saved.invstd.f32(), gamma.value().f32(),
                                   beta.value().f32(), d, scratch.f32());
    }
    cuda::bn_nhwc_apply(ctx, xv.dtype(), xv.raw(), y.raw(), d, scratch.f32());
    return;
  }
  if (training) {
    Tensor scratch = ctx.empty({cuda::bn_scratch_floats(d)});
    cuda::bn_batch_stats(ctx, x.value().f32(), d, momentum, eps, saved.mean.f32(), saved.invstd.f32(),
                         state.running_mean.f32(), state.running_var.f32(), scratch.f32());
  } else {
    cuda::bn_running_stats(ctx, state.running_mean.f32(), state.running_var.f32(), d.c, eps, saved.mean.f32(),
                           saved.invstd.f32());
  }
  cuda::bn_apply(ctx, x.value().f32(), saved.mean.f32(), saved.invstd.f32(), gamma.value().f32(), beta.value().f32(),
                 y.f32(), d);
}

// The reference reads f32 NCHW: any other x is widened (exactly) and transposed first, and y comes
// back rounded to x's dtype in x's layout.
void bn_forward_cpu(Context& ctx, const Var& x, const Var& gamma, const Var& beta, BatchNormState& state,
                    bool training, float momentum, float eps, const cuda::BnDims& d, Tensor& y, BnSaved& saved) {
  const Tensor& xv = x.value();
  if (xv.dtype() != DType::F32 || xv.channels_last()) {
    Tensor xf = to_form(ctx, xv, DType::F32, Layout::Nchw), yf = ctx.empty(xv.shape());
    bn_forward_cpu(ctx, Var(xf), gamma, beta, state, training, momentum, eps, d, yf, saved);
    y = to_form(ctx, yf, xv.dtype(), xv.layout());
    return;
  }
  if (training)
    ref::bn_batch_stats(x.value().f32(), d.n, d.c, d.hw, momentum, eps, saved.mean.f32(), saved.invstd.f32(),
                        state.running_mean.f32(), state.running_var.f32());
  else
    ref::bn_running_stats(state.running_mean.f32(), state.running_var.f32(), d.c, eps, saved.mean.f32(),
                          saved.invstd.f32());
  ref::bn_apply(x.value().f32(), saved.mean.f32(), saved.invstd.f32(), gamma.value().f32(), beta.value().f32(),
                y.f32(), d.n, d.c, d.hw);
}

// The gradients of one backward call: dx (undefined when x needs none), dgamma and dbeta.
struct BnGrads {
  Tensor dx, dgamma, dbeta;
};

void bn_backward(Context& c, const std::string& layer, BnBwd variant, bool training, float eps, const cuda::BnDims& d,
                 const Tensor& saved_x, const Tensor& saved_gamma, const BnSaved& saved, const Tensor& dy_t,
                 const Shape& x_shape, BnGrads& g) {
  const bool plain = saved_x.dtype() == DType::F32 && !saved_x.channels_last();
  const float* mean = saved.mean.f32();
  const float* invstd = saved.invstd.f32();
  if (!c.is_cuda()) {
    // The reference in f32 NCHW (see bn_forward_cpu); dx rounded back to x's form.
    const Tensor xf = to_form(c, saved_x, DType::F32, Layout::Nchw), dyf = to_form(c, dy_t, DType::F32, Layout::Nchw);
    Tensor dxf = g.dx.defined() ? c.empty(x_shape) : Tensor();
    ref::bn_bwd(xf.f32(), dyf.f32(), mean, invstd, saved_gamma.f32(), training, dxf.defined() ? dxf.f32() : nullptr,
                g.dgamma.f32(), g.dbeta.f32(), d.n, d.c, d.hw);
    if (g.dx.defined()) g.dx = plain ? dxf : to_form(c, dxf, saved_x.dtype(), saved_x.layout());
  } else if (variant == BnBwd::Cudnn) {  // training only: inference took the own kernels
    auto& cs = detail::cuda_state(c);
    BnDescs desc(d, saved_x);
    const float one = 1.f, zero = 0.f;
    // cuDNN always writes dx
    Tensor dx_all = g.dx.defined() ? g.dx : c.empty(x_shape, saved_x.dtype(), saved_x.layout());
    cudnn_bn_call(cudnnBatchNormalizationBackward(cs.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
                                                  desc.x.d, saved_x.raw(), desc.x.d, dy_t.raw(), desc.x.d,
                                                  dx_all.raw(), desc.bn.d, saved_gamma.f32(), g.dgamma.f32(),
                                                  g.dbeta.f32(), double(eps), mean, invstd),
                  "cudnnBatchNormalizationBackward", layer, x_shape);
  } else if (!plain) {
    Tensor scratch = c.empty({cuda::bn_nhwc_scratch_floats(d)});
    cuda::bn_nhwc_bwd_reduce(c, saved_x.dtype(), saved_x.raw(), dy_t.raw(), mean, invstd, d,
                             variant == BnBwd::Atomic, g.dgamma.f32(), g.dbeta.f32(), scratch.f32());
    if (g.dx.defined())
      cuda::bn_nhwc_bwd_dx(c, saved_x.dtype(), saved_x.raw(), dy_t.raw(), mean, invstd, saved_gamma.f32(),
                           g.dgamma.f32(), g.dbeta.f32(), training, g.dx.raw(), d, scratch.f32());
  } else {
    float* pdx = g.dx.defined() ? g.dx.f32() : nullptr;
    const float* xv = saved_x.f32();
    const float* dy = dy_t.f32();
    Tensor scratch = variant == BnBwd::Deterministic ? c.empty({cuda::bn_scratch_floats(d)}) : Tensor();
    cuda::bn_bwd_reduce(c, xv, dy, mean, invstd, d, variant == BnBwd::Atomic, g.dgamma.f32(), g.dbeta.f32(),
                        scratch.defined() ? scratch.f32() : nullptr);
    if (pdx)
      cuda::bn_bwd_dx(c, xv, dy, mean, invstd, saved_gamma.f32(), g.dgamma.f32(), g.dbeta.f32(), training, pdx, d);
  }
}

}  // namespace

Var batch_norm(Context& ctx, const std::string& layer, const Var& x, const Var& gamma, const Var& beta,
               BatchNormState& state, bool training, float momentum, float eps) {
  if (training && ctx.policy().variant<BnStats>(layer, op::batchnorm) == BnStats::Sync)
    return sync_batch_norm(ctx, layer, x, gamma, beta, state, momentum, eps);
  const std::string op = fmt::format("{} (layer '{}')", kOp, layer);
  const cuda::BnDims d = check_bn_operands(ctx, op, x, gamma, beta, state, training, momentum, eps);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::batchnorm);
  const bool grad = needs_grad(ctx, {&x, &gamma, &beta});
  const BnBwd variant = resolve_bn_bwd(ctx, layer, op, requested, training, grad, x.value());

  ProfileScope timed(ctx, ProfileKind::BatchNormFwd, ctx.is_cuda() ? name_of(variant) : "cpu-reference");
  Tensor y = ctx.empty(x.shape(), x.value().dtype(), x.value().layout());
  BnSaved saved{ctx.empty({d.c}), ctx.empty({d.c})};  // what backward normalizes with
  if (!ctx.is_cuda()) bn_forward_cpu(ctx, x, gamma, beta, state, training, momentum, eps, d, y, saved);
  else if (variant == BnBwd::Cudnn) bn_forward_cudnn(ctx, layer, x, gamma, beta, state, training, momentum, eps, d, y, saved);
  else bn_forward_own(ctx, x, gamma, beta, state, training, momentum, eps, d, y, saved);
  timed.end();
  record_bn(ctx, layer, variant, requested);
  if (training) detail::record_bn_stats(ctx, layer, BnStats::Local);

  Var out(std::move(y), grad);
  if (grad) {
    // The backward reads x, gamma and the saved statistics, never y.
    ctx.tape().record(kOp, layer, {{"x", x}, {"gamma", gamma}, {"beta", beta}}, out,
                      [saved_x = x.value(), saved_gamma = gamma.value(), xr = x.grad_ref(), gr = gamma.grad_ref(),
                       br = beta.grad_ref(), outr = out.grad_ref(), saved, d, training, variant, requested, layer,
                       eps](Context& c) {
      if (!outr.grad().defined()) return;
      record_bn(c, layer, variant, requested);
      ProfileScope timed(c, ProfileKind::BatchNormBwd, c.is_cuda() ? name_of(variant) : "cpu-reference");
      BnGrads g{xr.requires_grad() ? c.empty(xr.shape(), saved_x.dtype(), saved_x.layout()) : Tensor(),
                c.empty({d.c}), c.empty({d.c})};
      bn_backward(c, layer, variant, training, eps, d, saved_x, saved_gamma, saved, outr.grad(), xr.shape(), g);
      timed.end();
      accumulate_grad(c, xr, std::move(g.dx));
      accumulate_grad(c, gr, std::move(g.dgamma));
      accumulate_grad(c, br, std::move(g.dbeta));
    });
  }
  return out;
}

}  // namespace ditto
