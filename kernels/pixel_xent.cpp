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

PixelXentForward pixel_cross_entropy_forward(Context& ctx, const std::string& layer, const Tensor& logits,
                                             const Tensor& labels, int ignore_index) {
  const std::string op = fmt::format("pixel_cross_entropy (layer '{}')", layer);
  check_f32_on(ctx, logits, op, "logits");
  check_ndim(logits, 4, op, "logits");
  const Shape& ls = logits.shape();
  const int64_t n = ls[0], c = ls[1], h = ls[2], w = ls[3], hw = h * w;
  if (c == 0) throw ShapeError(fmt::format("{}: logits {} has no classes", op, shape_str(ls)));
  check_i32_on(ctx, labels, op, "labels");
  if (labels.shape() != Shape{n, h, w})
    throw ShapeError(fmt::format("{}: labels has shape {}, logits {}: one label per pixel, {{N, H, W}}, expected", op,
                                 shape_str(labels.shape()), shape_str(ls)));
  if (n * hw > INT_MAX) throw ShapeError(fmt::format("{}: {} pixels; at most 2^31-1 are supported", op, n * hw));
  const Reduction r = ctx.policy().variant<Reduction>(layer, op::pixel_xent);
  const std::string requested = ctx.policy().requested(layer, "reduce", op::pixel_xent);
  PixelXentForward f{ctx.empty({1}), Tensor(), ctx.empty({1}, DType::I32)};
  std::size_t ws_bytes = 0;
  {
    ProfileScope timed(ctx, ProfileKind::LossFwd, ctx.is_cuda() ? name_of(r) : "cpu-reference");
    if (ctx.is_cuda()) {
      f.lse = ctx.empty({n * hw});
      ws_bytes = sizeof(float) * cuda::pixel_xent_workspace_floats(n * hw, r);
      detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
      if (!ws.ok())
        throw PolicyError(fmt::format("{}: reduce=deterministic needs a workspace of {} bytes for logits {}, which "
                                      "could not be allocated; reduce=atomic needs none",
                                      op, ws_bytes, shape_str(ls)));
      cuda::pixel_xent_fwd(ctx, logits.f32(), labels.i32(), n, c, hw, ignore_index, r, f.lse.f32(), f.count.i32(),
                           static_cast<float*>(ws.get()), f.loss.f32());
    } else {
      check_labels_cpu(labels, c, h, w, ignore_index, op);
      int64_t counted = 0;
      f.loss.f32()[0] = static_cast<float>(ref::pixel_xent_fwd(logits.f32(), labels.i32(), n, c, hw, ignore_index, &counted));
      f.lse = ctx.empty({0});
      f.count.i32()[0] = static_cast<int32_t>(counted);  // at most N*H*W < 2^31 (checked above)
    }
  }
  detail::record_own_knob(ctx, layer, "pixel_xent", "reduce", name_of(r), requested, r == Reduction::Deterministic,
                          ws_bytes);
  return f;
}

Tensor pixel_cross_entropy_backward(Context& ctx, const std::string& layer, const Tensor& dloss, const Tensor& logits,
                                    const Tensor& labels, const PixelXentForward& saved, int ignore_index) {
  const std::string op = fmt::format("pixel_cross_entropy (layer '{}') backward", layer);
  check_f32_on(ctx, dloss, op, "dloss");
  check_shape(dloss, {1}, op, "dloss");
  check_f32_on(ctx, logits, op, "logits");
  check_ndim(logits, 4, op, "logits");
  const Shape& ls = logits.shape();
  const int64_t n = ls[0], c = ls[1], hw = ls[2] * ls[3];
  check_i32_on(ctx, labels, op, "labels");
  check_shape(labels, {n, ls[2], ls[3]}, op, "labels");
  check_i32_on(ctx, saved.count, op, "count");
  check_shape(saved.count, {1}, op, "count");
  check_f32_on(ctx, saved.lse, op, "lse");
  check_shape(saved.lse, {ctx.is_cuda() ? n * hw : 0}, op, "lse");
  ProfileScope timed(ctx, ProfileKind::LossBwd);
  Tensor dlogits = ctx.empty(ls);
  if (ctx.is_cuda())
    cuda::pixel_xent_bwd(ctx, logits.f32(), labels.i32(), saved.lse.f32(), dloss.f32(), saved.count.i32(), n, c, hw,
                         ignore_index, dlogits.f32());
  else
    ref::pixel_xent_bwd(logits.f32(), labels.i32(), n, c, hw, ignore_index, saved.count.i32()[0],
                        double(dloss.f32()[0]), dlogits.f32());
  return dlogits;
}

Var pixel_cross_entropy(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels,
                        int ignore_index) {
  PixelXentForward f = pixel_cross_entropy_forward(ctx, layer, logits.value(), labels, ignore_index);
  const bool grad = needs_grad(ctx, {&logits});
  Var out(f.loss, grad);
  if (grad) {
    ctx.tape().record("pixel_xent", layer, {{"logits", logits}, {"labels", Var(labels)}}, out,
                      [logits, labels, f, out, layer, ignore_index](Context& cx) {
                        if (!out.grad().defined()) return;
                        accumulate_grad(cx, logits,
                                        pixel_cross_entropy_backward(cx, layer, out.grad(), logits.value(), labels, f,
                                                                     ignore_index));
                      });
  }
  return out;
}

}  // namespace ditto
