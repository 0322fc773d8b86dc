#include "kernels/ctc.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/ctc_ref.h"
#include "kernels/detail/ctc_cuda.h"
#include "kernels/detail/op_record.h"

namespace ditto {

namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
}  // namespace

// The op runs ditto's own where cuDNN cannot take the shape, and records it.
DITTO_KNOB(ctc_algo_knob, {op::ctc_loss, "algo",
                           {{"ditto", kGpu, kOwn, "ditto's alpha-beta kernel, fixed order"},
                            {"cudnn-deterministic", kRun, kLib, "CUDNN_CTC_LOSS_ALGO_DETERMINISTIC"},
                            {"cudnn-nondeterministic", kNot, kLib, "CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC"}},
                           "cudnn-nondeterministic", false, "the CTC loss and gradient"})

const char* name_of(CtcAlgo v) { return variant_name(ctc_algo_knob(), v); }

namespace {

constexpr const char* kOp = "ctc_loss";
// cuDNN documents labels of at most 256 symbols, but 256 itself fails (PyTorch found it with
// cuDNN 8.1 and hands cuDNN labels of at most 255, as its v8 path's maxLabelLength of 255 says).
constexpr int64_t kCudnnMaxLabels = 255;

Determinism determinism_of(CtcAlgo v) { return v == CtcAlgo::CudnnNondeterministic ? Determinism::No : Determinism::Yes; }
Impl impl_of(CtcAlgo v) { return v == CtcAlgo::Ditto ? Impl::Ditto : Impl::Library; }

void check_i32(const Context& ctx, const Tensor& t, const Shape& shape, const std::string& op, const char* what) {
  if (!t.defined()) throw ShapeError(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() != DType::I32) throw ShapeError(fmt::format("{}: {} must be i32, is {}", op, what, dtype_name(t.dtype())));
  if (t.device() != ctx.device())
    throw ShapeError(fmt::format("{}: {} is on {} but the context is on {}", op, what, t.device().str(), ctx.device().str()));
  if (t.shape() != shape)
    throw ShapeError(fmt::format("{}: {} has shape {}, expected {}", op, what, shape_str(t.shape()), shape_str(shape)));
}

struct TensorNdDesc {
  cudnnTensorDescriptor_t d = nullptr;
  explicit TensorNdDesc(const ref::CtcDims& g) {
    DITTO_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    const int dims[3] = {int(g.t), int(g.n), int(g.a)}, strides[3] = {int(g.n * g.a), int(g.a), 1};
    cudnnStatus_t s = cudnnSetTensorNdDescriptor(d, CUDNN_DATA_FLOAT, 3, dims, strides);
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroyTensorDescriptor(d);
      detail::throw_cudnn(s, "cudnnSetTensorNdDescriptor", __FILE__, __LINE__);
    }
  }
  ~TensorNdDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorNdDesc(const TensorNdDesc&) = delete;
  TensorNdDesc& operator=(const TensorNdDesc&) = delete;
};

struct CtcDesc {
  cudnnCTCLossDescriptor_t d = nullptr;
  explicit CtcDesc(int max_label_length) {
    DITTO_CUDNN_CHECK(cudnnCreateCTCLossDescriptor(&d));
    // Softmax inside (the gradient is with respect to the logits, as ditto's); zero gradient for a
    // sample no alignment fits.
    cudnnStatus_t s = cudnnSetCTCLossDescriptor_v9(d, CUDNN_DATA_FLOAT, CUDNN_LOSS_NORMALIZATION_SOFTMAX,
                                                   CUDNN_CTC_ZERO_OOB_GRADIENTS, max_label_length);
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroyCTCLossDescriptor(d);
      detail::throw_cudnn(s, "cudnnSetCTCLossDescriptor_v9", __FILE__, __LINE__);
    }
  }
  ~CtcDesc() { cudnnDestroyCTCLossDescriptor(d); }
  CtcDesc(const CtcDesc&) = delete;
  CtcDesc& operator=(const CtcDesc&) = delete;
};

std::size_t run_cudnn(Context& ctx, const std::string& op, CtcAlgo v, const ref::CtcDims& d, const float* logits,
                      const int32_t* labels, const int32_t* label_len, const int32_t* input_len, float* cost,
                      float* grad) {
  const cudnnCTCLossAlgo_t algo =
      v == CtcAlgo::CudnnDeterministic ? CUDNN_CTC_LOSS_ALGO_DETERMINISTIC : CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC;
  auto& cs = detail::cuda_state(ctx);
  CtcDesc desc(int(d.s > 0 ? d.s : 1));
  TensorNdDesc probs(d), grads(d);
  std::size_t cudnn_bytes = 0;
  const std::string what = fmt::format("algo={}", name_of(v));
  DITTO_CUDNN_VARIANT(cudnnGetCTCLossWorkspaceSize_v8(cs.cudnn, algo, desc.d, probs.d, grad ? grads.d : nullptr,
                                                      &cudnn_bytes),
                      op, what, "ditto");
  const std::size_t stage_bytes = cuda::ctc_cudnn_stage_workspace(d);
  detail::Workspace stage_ws(cs, stage_bytes), cudnn_ws(cs, cudnn_bytes);
  detail::require_workspace(stage_ws, op, what + " (label staging)", "algo=ditto needs its own");
  detail::require_workspace(cudnn_ws, op, what, "algo=ditto needs its own");
  const cuda::CtcCudnnStage st = cuda::ctc_cudnn_stage(ctx, labels, label_len, input_len, stage_ws.get(), d);
  // cuDNN may leave gradient rows past an input length untouched; ctc_cudnn_finish zeroes them and
  // writes the stand-in samples' costs and gradients (empty labels by their closed form).
  DITTO_CUDNN_VARIANT(cudnnCTCLoss_v8(cs.cudnn, algo, desc.d, probs.d, logits, st.flat_labels, st.label_len,
                                      st.input_len, cost, grad ? grads.d : nullptr, grad, cudnn_bytes, cudnn_ws.get()),
                      op, what, "ditto");
  cuda::ctc_cudnn_finish(ctx, st, logits, input_len, cost, grad, d);
  return stage_bytes + cudnn_bytes;
}

}  // namespace

Var ctc_loss(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels,
             const Tensor& label_lengths, const Tensor& input_lengths) {
  const std::string op = detail::op_where(kOp, layer);
  check_f32_on(ctx, logits.value(), op, "logits");
  check_ndim(logits.value(), 3, op, "logits");
  ref::CtcDims d;
  d.t = logits.shape()[0], d.n = logits.shape()[1], d.a = logits.shape()[2];
  if (d.a < 2)
    throw ShapeError(fmt::format("{}: logits {} has {} classes; the blank (class 0) and at least one label are needed",
                                 op, shape_str(logits.shape()), d.a));
  if (!labels.defined() || labels.ndim() != 2)
    throw ShapeError(fmt::format("{}: labels must be {{N, S}} i32 (padded), has shape {}", op,
                                 labels.defined() ? shape_str(labels.shape()) : "undefined"));
  d.s = labels.shape()[1];
  check_i32(ctx, labels, {d.n, d.s}, op, "labels");
  check_i32(ctx, label_lengths, {d.n}, op, "label_lengths");
  check_i32(ctx, input_lengths, {d.n}, op, "input_lengths");
  if (d.t * d.n * d.a > INT_MAX || d.s > INT_MAX / 4)
    throw ShapeError(fmt::format("{}: logits {} with labels {}: more than 2^31-1 elements are not supported", op,
                                 shape_str(logits.shape()), shape_str(labels.shape())));

  CtcAlgo variant = ctx.policy().variant<CtcAlgo>(layer, op::ctc_loss);
  const std::string requested = ctx.policy().requested(layer, "algo", op::ctc_loss);
  if (ctx.is_cuda() && variant != CtcAlgo::Ditto && d.s > kCudnnMaxLabels) {
    if (requested == "pinned")
      throw PolicyError(fmt::format("{}: algo={} takes labels of at most {} symbols (cuDNN documents 256 but fails "
                                    "there), labels {} have {}; supported variants: ditto",
                                    op, name_of(variant), kCudnnMaxLabels, shape_str(labels.shape()), d.s));
    variant = CtcAlgo::Ditto;  // a mode word: cuDNN cannot take the shape; recorded below
  }

  const bool grad = needs_grad(ctx, {&logits});
  Tensor cost = ctx.empty({d.n});
  Tensor dcost;  // d cost[n] / d logits, kept for backward
  if (grad) dcost = ctx.empty(logits.shape());
  std::size_t ws_bytes = 0;
  if (!ctx.is_cuda()) {
    const int32_t *lab = labels.i32(), *ll = label_lengths.i32(), *il = input_lengths.i32();
    for (int64_t n = 0; n < d.n; ++n)
      if (!ref::ctc_sample_valid(lab, ll, il, d, n))
        throw DataError(fmt::format("{}: sample {} has label length {} (of at most {}), input length {} (of at most "
                                    "{}) or a label outside [1, {})",
                                    op, n, ll[n], d.s, il[n], d.t, d.a));
    ref::ctc_loss(logits.value().f32(), lab, ll, il, d, cost.f32(), grad ? dcost.f32() : nullptr);
  } else if (variant == CtcAlgo::Ditto) {
    ws_bytes = cuda::ctc_workspace(d);
    detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
    detail::require_workspace(ws, op, "algo=ditto", "the cuDNN variants (labels <= 255) need less");
    cuda::ctc_ditto(ctx, logits.value().f32(), labels.i32(), label_lengths.i32(), input_lengths.i32(), cost.f32(),
                    grad ? dcost.f32() : nullptr, ws.get(), d);
  } else if (d.n > 0) {
    ws_bytes = run_cudnn(ctx, op, variant, d, logits.value().f32(), labels.i32(), label_lengths.i32(),
                         input_lengths.i32(), cost.f32(), grad ? dcost.f32() : nullptr);
  }
  detail::record_knob(ctx, layer, kOp, "algo", name_of(variant), requested, determinism_of(variant), impl_of(variant),
                      ws_bytes);

  Var out(std::move(cost), grad);
  if (grad) {
    ctx.tape().record(kOp, layer, {{"logits", logits}, {"labels", Var(labels)}}, out, [logits, out, dcost, d](Context& c) {
      if (!out.grad().defined()) return;
      Tensor dlogits = c.empty(logits.shape());
      if (c.is_cuda()) {
        cuda::ctc_scale_grad(c, dcost.f32(), out.grad().f32(), dlogits.f32(), d);
      } else {
        const float *g = dcost.f32(), *up = out.grad().f32();
        float* o = dlogits.f32();
        for (int64_t i = 0; i < d.t * d.n * d.a; ++i) o[i] = up[(i / d.a) % d.n] * g[i];
      }
      accumulate_grad(c, logits, std::move(dlogits));
    });
  }
  return out;
}

}  // namespace ditto
