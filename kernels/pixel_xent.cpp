#include "kernels/pixel_xent.h"

#include <fmt/format.h>

#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "engine/operand_check.h"
#include "kernels/detail/own_knob.h"
#include "kernels/detail/pixel_xent_cuda.h"
#include "kernels/pixel_xent_ref.h"

namespace ditto {

DITTO_KNOB(pixel_xent_reduce_knob, {op::pixel_xent, "reduce", reduction_variants(), "atomic", false,
                                    "the pixel-mean loss's sum"})

namespace {

void check_labels_cpu(const Tensor& labels, int64_t c, int64_t h, int64_t w, int ignore, const std::string& op) {
  const int32_t* lab = labels.i32();
  for (int64_t p = 0; p < labels.numel(); ++p)
    if (lab[p] != ignore && (lab[p] < 0 || lab[p] >= c))
      throw DataError(fmt::format("{}: pixel (n {}, h {}, w {}) has label {}, outside [0, {}) and not the ignore "
                                  "index {}",
                                  op, p / (h * w), p / w % h, p % w, lab[p], c, ignore));
}

}  // namespace

namespace {

enum class PixelLoss { Xent, Nll };
const char* op_of(PixelLoss k) { return k == PixelLoss::Xent ? "pixel_cross_entropy" : "pixel_nll"; }
const char* input_of(PixelLoss k) { return k == PixelLoss::Xent ? "logits" : "log_probs"; }

PixelXentForward pixel_loss_forward(Context& ctx, const std::string& layer, const Tensor& x, const Tensor& labels,
                                    int ignore_index, PixelLoss kind) {
  const std::string op = fmt::format("{} (layer '{}')", op_of(kind), layer);
  const char* input = input_of(kind);
  check_f32_on(ctx, x, op, input);
  check_ndim(x, 4, op, input);
  const Shape& ls = x.shape();
  const int64_t n = ls[0], c = ls[1], h = ls[2], w = ls[3], hw = h * w;
  if (c == 0) throw ShapeError(fmt::format("{}: {} {} has no classes", op, input, shape_str(ls)));
  check_i32_on(ctx, labels, op, "labels");
  if (labels.shape() != Shape{n, h, w})
    throw ShapeError(fmt::format("{}: labels has shape {}, {} {}: one label per pixel, {{N, H, W}}, expected", op,
                                 shape_str(labels.shape()), input, shape_str(ls)));
  if (n * hw > INT_MAX) throw ShapeError(fmt::format("{}: {} pixels; at most 2^31-1 are supported", op, n * hw));
  const Reduction r = ctx.policy().variant<Reduction>(layer, op::pixel_xent);
  const std::string requested = ctx.policy().requested(layer, "reduce", op::pixel_xent);
  PixelXentForward f{ctx.empty({1}), ctx.empty({0}), ctx.empty({1}, DType::I32)};
  std::size_t ws_bytes = 0;
  {
    ProfileScope timed(ctx, ProfileKind::LossFwd, ctx.is_cuda() ? name_of(r) : "cpu-reference");
    if (ctx.is_cuda()) {
      if (kind == PixelLoss::Xent) f.lse = ctx.empty({n * hw});
      ws_bytes = sizeof(float) * cuda::pixel_xent_workspace_floats(n * hw, r);
      detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
      if (!ws.ok())
        throw PolicyError(fmt::format("{}: reduce=deterministic needs a workspace of {} bytes for {} {}, which "
                                      "could not be allocated; reduce=atomic needs none",
                                      op, ws_bytes, input, shape_str(ls)));
      auto* partials = static_cast<float*>(ws.get());
      if (kind == PixelLoss::Xent)
        cuda::pixel_xent_fwd(ctx, x.f32(), labels.i32(), n, c, hw, ignore_index, r, f.lse.f32(), f.count.i32(),
                             partials, f.loss.f32());
      else
        cuda::pixel_nll_fwd(ctx, x.f32(), labels.i32(), n, c, hw, ignore_index, r, f.count.i32(), partials,
                            f.loss.f32());
    } else {
      check_labels_cpu(labels, c, h, w, ignore_index, op);
      int64_t counted = 0;
      const double loss = kind == PixelLoss::Xent
                              ? ref::pixel_xent_fwd(x.f32(), labels.i32(), n, c, hw, ignore_index, &counted)
                              : ref::pixel_nll_fwd(x.f32(), labels.i32(), n, c, hw, ignore_index, &counted);
      f.loss.f32()[0] = static_cast<float>(loss);
      f.count.i32()[0] = static_cast<int32_t>(counted);  // at most N*H*W < 2^31 (checked above)
    }
  }
  detail::record_own_knob(ctx, layer, "pixel_xent", "reduce", name_of(r), requested, r == Reduction::Deterministic,
                          ws_bytes);
  return f;
}

Tensor pixel_loss_backward(Context& ctx, const std::string& layer, const Tensor& dloss, const Tensor& x,
                           const Tensor& labels, const PixelXentForward& saved, int ignore_index, PixelLoss kind) {
  const std::string op = fmt::format("{} (layer '{}') backward", op_of(kind), layer);
  const char* input = input_of(kind);
  check_f32_on(ctx, dloss, op, "dloss");
  check_shape(dloss, {1}, op, "dloss");
  check_f32_on(ctx, x, op, input);
  check_ndim(x, 4, op, input);
  const Shape& ls = x.shape();
  const int64_t n = ls[0], c = ls[1], hw = ls[2] * ls[3];
  check_i32_on(ctx, labels, op, "labels");
  check_shape(labels, {n, ls[2], ls[3]}, op, "labels");
  check_i32_on(ctx, saved.count, op, "count");
  check_shape(saved.count, {1}, op, "count");
  if (kind == PixelLoss::Xent) {
    check_f32_on(ctx, saved.lse, op, "lse");
    check_shape(saved.lse, {ctx.is_cuda() ? n * hw : 0}, op, "lse");
  }
  ProfileScope timed(ctx, ProfileKind::LossBwd);
  Tensor dx = ctx.empty(ls);
  if (kind == PixelLoss::Nll) {
    if (ctx.is_cuda())
      cuda::pixel_nll_bwd(ctx, labels.i32(), dloss.f32(), saved.count.i32(), n, c, hw, ignore_index, dx.f32());
    else
      ref::pixel_nll_bwd(labels.i32(), n, c, hw, ignore_index, saved.count.i32()[0], double(dloss.f32()[0]), dx.f32());
  } else if (ctx.is_cuda()) {
    cuda::pixel_xent_bwd(ctx, x.f32(), labels.i32(), saved.lse.f32(), dloss.f32(), saved.count.i32(), n, c, hw,
                         ignore_index, dx.f32());
  } else {
    ref::pixel_xent_bwd(x.f32(), labels.i32(), n, c, hw, ignore_index, saved.count.i32()[0], double(dloss.f32()[0]),
                        dx.f32());
  }
  return dx;
}

Var pixel_loss(Context& ctx, const std::string& layer, const Var& x, const Tensor& labels, int ignore_index,
               PixelLoss kind) {
  PixelXentForward f = pixel_loss_forward(ctx, layer, x.value(), labels, ignore_index, kind);
  const bool grad = needs_grad(ctx, {&x});
  Var out(f.loss, grad);
  if (grad) {
    ctx.tape().record(kind == PixelLoss::Xent ? "pixel_xent" : "pixel_nll", layer,
                      {{input_of(kind), x}, {"labels", Var(labels)}}, out,
                      [x, labels, f, out, layer, ignore_index, kind](Context& cx) {
                        if (!out.grad().defined()) return;
                        accumulate_grad(cx, x,
                                        pixel_loss_backward(cx, layer, out.grad(), x.value(), labels, f, ignore_index,
                                                            kind));
                      });
  }
  return out;
}

}  // namespace

PixelXentForward pixel_cross_entropy_forward(Context& ctx, const std::string& layer, const Tensor& logits,
                                             const Tensor& labels, int ignore_index) {
  return pixel_loss_forward(ctx, layer, logits, labels, ignore_index, PixelLoss::Xent);
}

Tensor pixel_cross_entropy_backward(Context& ctx, const std::string& layer, const Tensor& dloss, const Tensor& logits,
                                    const Tensor& labels, const PixelXentForward& saved, int ignore_index) {
  return pixel_loss_backward(ctx, layer, dloss, logits, labels, saved, ignore_index, PixelLoss::Xent);
}

Var pixel_cross_entropy(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels,
                        int ignore_index) {
  return pixel_loss(ctx, layer, logits, labels, ignore_index, PixelLoss::Xent);
}

PixelXentForward pixel_nll_forward(Context& ctx, const std::string& layer, const Tensor& log_probs,
                                   const Tensor& labels, int ignore_index) {
  return pixel_loss_forward(ctx, layer, log_probs, labels, ignore_index, PixelLoss::Nll);
}

Tensor pixel_nll_backward(Context& ctx, const std::string& layer, const Tensor& dloss, const Tensor& log_probs,
                          const Tensor& labels, const PixelXentForward& saved, int ignore_index) {
  return pixel_loss_backward(ctx, layer, dloss, log_probs, labels, saved, ignore_index, PixelLoss::Nll);
}

Var pixel_nll(Context& ctx, const std::string& layer, const Var& log_probs, const Tensor& labels, int ignore_index) {
  return pixel_loss(ctx, layer, log_probs, labels, ignore_index, PixelLoss::Nll);
}

}  // namespace ditto
