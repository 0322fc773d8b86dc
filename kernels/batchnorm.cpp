#include "kernels/batchnorm.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "kernels/batchnorm_ref.h"
#include "kernels/check.h"
#include "kernels/detail/batchnorm_cuda.h"
#include "kernels/sync_batchnorm.h"

namespace ditto {
namespace {

constexpr const char* kOp = "batchnorm";

// ---- cuDNN (RAII descriptors; cudnn.h stays out of the public header) ----------------------
using TensorDesc = detail::CudnnTensorDesc;

// x/y descriptor (N, C, HW, 1) and the derived per-channel descriptor (1, C, 1, 1).
struct BnDescs {
  TensorDesc x, bn;
  explicit BnDescs(const cuda::BnDims& d) {
    DITTO_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(d.n), int(d.c),
                                                 int(d.hw), 1));
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

Var batch_norm(Context& ctx, const std::string& layer, const Var& x, const Var& gamma, const Var& beta,
               BatchNormState& state, bool training, float momentum, float eps) {
  if (training && batch_norm_synced(ctx)) return sync_batch_norm(ctx, layer, x, gamma, beta, state, momentum, eps);
  const std::string op = fmt::format("{} (layer '{}')", kOp, layer);
  check_f32_on(ctx, x.value(), op, "x");
  check_ndim(x.value(), 4, op, "x");
  const Shape& xs = x.shape();
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

  const std::string requested = ctx.policy().requested(layer, "bwd", OpKind::BatchNorm);
  BnBwd variant = ctx.policy().bn_bwd(layer);
  const bool grad = needs_grad(ctx, {&x, &gamma, &beta});
  // Inference-mode backward has no cuDNN routine (see batchnorm.h).
  if (ctx.is_cuda() && !training && grad && variant == BnBwd::Cudnn) {
    if (requested == "pinned")
      throw PolicyError(fmt::format("{}: bwd=cudnn is pinned, but cuDNN has no inference-mode (training=false) "
                                    "batch-norm backward for x {}; supported there: atomic, deterministic",
                                    op, shape_str(xs)));
    variant = BnBwd::Deterministic;
  }

  ProfileScope timed(ctx, ProfileKind::BatchNormFwd, ctx.is_cuda() ? name_of(variant) : "cpu-reference");
  Tensor y = ctx.empty(xs);
  Tensor mean = ctx.empty({d.c}), invstd = ctx.empty({d.c});  // what backward normalizes with
  if (!ctx.is_cuda()) {
    if (training)
      ref::bn_batch_stats(x.value().f32(), d.n, d.c, d.hw, momentum, eps, mean.f32(), invstd.f32(),
                          state.running_mean.f32(), state.running_var.f32());
    else
      ref::bn_running_stats(state.running_mean.f32(), state.running_var.f32(), d.c, eps, mean.f32(), invstd.f32());
    ref::bn_apply(x.value().f32(), mean.f32(), invstd.f32(), gamma.value().f32(), beta.value().f32(), y.f32(), d.n,
                  d.c, d.hw);
  } else if (variant == BnBwd::Cudnn) {
    auto& cs = ctx.cuda();
    BnDescs desc(d);
    const float one = 1.f, zero = 0.f;
    if (training) {
      // cudnn saves the inverse std 1/sqrt(var + eps), as ours does.
      cudnn_bn_call(cudnnBatchNormalizationForwardTraining(
                        cs.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, desc.x.d, x.value().f32(), desc.x.d, y.f32(),
                        desc.bn.d, gamma.value().f32(), beta.value().f32(), double(momentum),
                        state.running_mean.f32(), state.running_var.f32(), double(eps), mean.f32(), invstd.f32()),
                    "cudnnBatchNormalizationForwardTraining", layer, xs);
    } else {
      cudnn_bn_call(cudnnBatchNormalizationForwardInference(cs.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, desc.x.d,
                                                            x.value().f32(), desc.x.d, y.f32(), desc.bn.d,
                                                            gamma.value().f32(), beta.value().f32(),
                                                            state.running_mean.f32(), state.running_var.f32(),
                                                            double(eps)),
                    "cudnnBatchNormalizationForwardInference", layer, xs);
    }
  } else {
    if (training) {
      Tensor scratch = ctx.empty({cuda::bn_scratch_floats(d)});
      cuda::bn_batch_stats(ctx, x.value().f32(), d, momentum, eps, mean.f32(), invstd.f32(), state.running_mean.f32(),
                           state.running_var.f32(), scratch.f32());
    } else {
      cuda::bn_running_stats(ctx, state.running_mean.f32(), state.running_var.f32(), d.c, eps, mean.f32(),
                             invstd.f32());
    }
    cuda::bn_apply(ctx, x.value().f32(), mean.f32(), invstd.f32(), gamma.value().f32(), beta.value().f32(), y.f32(),
                   d);
  }
  timed.end();
  record_bn(ctx, layer, variant, requested);

  Var out(std::move(y), grad);
  if (grad) {
    // The backward reads x, gamma and the saved statistics, never y.
    ctx.tape().record(kOp, layer, {{"x", x}, {"gamma", gamma}, {"beta", beta}}, out,
                      [saved_x = x.value(), saved_gamma = gamma.value(), xr = x.grad_ref(), gr = gamma.grad_ref(),
                       br = beta.grad_ref(), outr = out.grad_ref(), mean, invstd, d, training, variant, requested, layer,
                       eps](Context& c) {
      if (!outr.grad().defined()) return;
      record_bn(c, layer, variant, requested);
      ProfileScope timed(c, ProfileKind::BatchNormBwd, c.is_cuda() ? name_of(variant) : "cpu-reference");
      Tensor dx = xr.requires_grad() ? c.empty(xr.shape()) : Tensor();
      Tensor dgamma = c.empty({d.c}), dbeta = c.empty({d.c});
      float* pdx = dx.defined() ? dx.f32() : nullptr;
      const float* xv = saved_x.f32();
      const float* dy = outr.grad().f32();
      if (!c.is_cuda()) {
        ref::bn_bwd(xv, dy, mean.f32(), invstd.f32(), saved_gamma.f32(), training, pdx, dgamma.f32(), dbeta.f32(),
                    d.n, d.c, d.hw);
      } else if (variant == BnBwd::Cudnn) {  // training only: inference took the own kernels above
        auto& cs = c.cuda();
        BnDescs desc(d);
        const float one = 1.f, zero = 0.f;
        Tensor dx_all = pdx ? dx : c.empty(xr.shape());  // cuDNN always writes dx
        cudnn_bn_call(cudnnBatchNormalizationBackward(cs.cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
                                                      desc.x.d, xv, desc.x.d, dy, desc.x.d, dx_all.f32(), desc.bn.d,
                                                      saved_gamma.f32(), dgamma.f32(), dbeta.f32(), double(eps),
                                                      mean.f32(), invstd.f32()),
                      "cudnnBatchNormalizationBackward", layer, xr.shape());
      } else {
        Tensor scratch = variant == BnBwd::Deterministic ? c.empty({cuda::bn_scratch_floats(d)}) : Tensor();
        cuda::bn_bwd_reduce(c, xv, dy, mean.f32(), invstd.f32(), d, variant == BnBwd::Atomic, dgamma.f32(),
                            dbeta.f32(), scratch.defined() ? scratch.f32() : nullptr);
        if (pdx)
          cuda::bn_bwd_dx(c, xv, dy, mean.f32(), invstd.f32(), saved_gamma.f32(), dgamma.f32(), dbeta.f32(),
                          training, pdx, d);
      }
      timed.end();
      accumulate_grad(c, xr, std::move(dx));
      accumulate_grad(c, gr, std::move(dgamma));
      accumulate_grad(c, br, std::move(dbeta));
    });
  }
  return out;
}

}  // namespace ditto
