#include "kernels/loss.h"

#include <fmt/format.h>

#include "engine/detail/cuda_state.h"
#include "engine/profiler.h"
#include "engine/operand_check.h"
#include "kernels/detail/loss_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/loss_ref.h"

namespace ditto {

DITTO_KNOB(softmax_xent_reduce_knob, {op::softmax_xent, "reduce", reduction_variants(), "atomic", false,
                                      "the batch-mean loss's sum",
                                      // PyTorch's nll_loss sums a batch's losses in one block, in a fixed order.
                                      "deterministic"})


Var softmax_cross_entropy(Context& ctx, const std::string& layer, const Var& logits_in, const Tensor& labels) {
  const std::string op = fmt::format("softmax_cross_entropy (layer '{}')", layer);
  // The loss computes in fp32 (kernels/precision.h): bf16/f16 logits (a native convolution's, flattened)
  // are widened, exactly, and their gradient rounded back, as autocast's cast does.
  check_float_on(ctx, logits_in.value(), op, "logits");
  const Var logits = cast(ctx, logits_in, DType::F32);
  check_f32_on(ctx, logits.value(), op, "logits");
  check_ndim(logits.value(), 2, op, "logits");
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  if (n == 0 || c == 0)
    throw ShapeError(fmt::format("{}: logits has shape {}; the batch and the class count must be non-empty", op,
                                 shape_str(logits.shape())));
  if (!labels.defined()) throw ShapeError(fmt::format("{}: labels is undefined", op));
  if (labels.dtype() != DType::I32)
    throw ShapeError(fmt::format("{}: labels must be i32, is {}", op, dtype_name(labels.dtype())));
  if (labels.device() != ctx.device())
    throw ShapeError(fmt::format("{}: labels is on {} but the context is on {}", op, labels.device().str(),
                                 ctx.device().str()));
  if (labels.ndim() != 1 || labels.shape()[0] != n)
    throw ShapeError(fmt::format("{}: labels has shape {}, logits {}: one label per row expected", op,
                                 shape_str(labels.shape()), shape_str(logits.shape())));

  const Reduction reduce = ctx.policy().variant<Reduction>(layer, op::softmax_xent);
  const std::string requested = ctx.policy().requested(layer, "reduce", op::softmax_xent);
  Tensor loss = ctx.empty({1});
  Tensor lse;  // per-row log-sum-exp kept for the backward pass (CUDA only)
  // To the function's end: only host work (tape bookkeeping) follows the kernels.
  ProfileScope timed(ctx, ProfileKind::LossFwd, ctx.is_cuda() ? name_of(reduce) : "cpu-reference");
  if (ctx.is_cuda()) {
    lse = ctx.empty({n});
    std::size_t ws_bytes = reduce == Reduction::Deterministic ? sizeof(float) * static_cast<std::size_t>(n) : 0;
    detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
    if (!ws.ok())
      throw PolicyError(fmt::format("{}: reduce=deterministic needs a workspace of {} bytes for logits {}, which "
                                    "could not be allocated; reduce=atomic needs none",
                                    op, ws_bytes, shape_str(logits.shape())));
    cuda::softmax_xent_fwd(ctx, logits.value().f32(), labels.i32(), lse.f32(), static_cast<float*>(ws.get()),
                           loss.f32(), n, c, reduce);
    ctx.manifest().record({layer, "softmax_xent", "reduce", name_of(reduce), requested,
                           reduce == Reduction::Atomic ? Determinism::No : Determinism::Yes, "", ws_bytes,
                           ctx.device().str(), "",
                           reduce == Reduction::Atomic ? Guarantee::NotGuaranteed : Guarantee::GpuToGpu});
  } else {
    const int32_t* lab = labels.i32();
    for (int64_t i = 0; i < n; ++i)
      if (lab[i] < 0 || lab[i] >= c)
        throw DataError(fmt::format("{}: example {} has label {}, outside [0, {})", op, i, lab[i], c));
    loss.f32()[0] = static_cast<float>(ref::softmax_xent_fwd(logits.value().f32(), lab, n, c));
    ctx.manifest().record({layer, "softmax_xent", "reduce", "reference", requested, Determinism::Yes, "", 0,
                           ctx.device().str(), "", guarantee_of(Determinism::Yes, Impl::CpuReference)});
  }

  bool grad = needs_grad(ctx, {&logits});
  Var out(std::move(loss), grad);
  if (grad) {
    ctx.tape().record("softmax_xent", layer, {{"logits", logits}, {"labels", Var(labels)}}, out, [saved_logits = logits.value(), lr = logits.grad_ref(), labels, lse, outr = out.grad_ref(), n,
                       c](Context& cx) {
      if (!outr.grad().defined()) return;
      ProfileScope timed(cx, ProfileKind::LossBwd);  // the logits' gradient is the loss's alone: no add follows
      Tensor dlogits = cx.empty({n, c});
      if (cx.is_cuda())
        cuda::softmax_xent_bwd(cx, saved_logits.f32(), labels.i32(), lse.f32(), outr.grad().f32(), dlogits.f32(), n,
                               c);
      else
        ref::softmax_xent_bwd(saved_logits.f32(), labels.i32(), n, c, double(outr.grad().f32()[0]), dlogits.f32());
      accumulate_grad(cx, lr, std::move(dlogits));
    });
  }
  return out;
}

}  // namespace ditto
