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

Var pixel_cross_entropy(Context& ctx, const std::string& layer, const Var& logits, const Tensor& labels,
                        int ignore_index) {
  const std::string op = fmt::format("pixel_cross_entropy (layer '{}')", layer);
  check_f32_on(ctx, logits.value(), op, "logits");
  check_ndim(logits.value(), 4, op, "logits");
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
  Tensor loss = ctx.empty({1});
  Tensor lse, count;  // per-pixel log-sum-exp and the counted pixels, kept for backward (CUDA)
  int64_t host_count = 0;
  std::size_t ws_bytes = 0;
  {
    ProfileScope timed(ctx, ProfileKind::LossFwd, ctx.is_cuda() ? name_of(r) : "cpu-reference");
    if (ctx.is_cuda()) {
      lse = ctx.empty({n * hw});
      count = ctx.empty({1}, DType::I32);
      ws_bytes = sizeof(float) * cuda::pixel_xent_workspace_floats(n * hw, r);
      detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
      if (!ws.ok())
        throw PolicyError(fmt::format("{}: reduce=deterministic needs a workspace of {} bytes for logits {}, which "
                                      "could not be allocated; reduce=atomic needs none",
                                      op, ws_bytes, shape_str(ls)));
      cuda::pixel_xent_fwd(ctx, logits.value().f32(), labels.i32(), n, c, hw, ignore_index, r, lse.f32(), count.i32(),
                           static_cast<float*>(ws.get()), loss.f32());
    } else {
      check_labels_cpu(labels, c, h, w, ignore_index, op);
      loss.f32()[0] =
          static_cast<float>(ref::pixel_xent_fwd(logits.value().f32(), labels.i32(), n, c, hw, ignore_index, &host_count));
    }
  }
  detail::record_own_knob(ctx, layer, "pixel_xent", "reduce", name_of(r), requested, r == Reduction::Deterministic,
                          ws_bytes);

  const bool grad = needs_grad(ctx, {&logits});
  Var out(std::move(loss), grad);
  if (grad) {
    ctx.tape().record("pixel_xent", layer, {{"logits", logits}, {"labels", Var(labels)}}, out,
                      [logits, labels, lse, count, out, n, c, hw, ignore_index, host_count](Context& cx) {
                        if (!out.grad().defined()) return;
                        ProfileScope timed(cx, ProfileKind::LossBwd);
                        Tensor dlogits = cx.empty(logits.shape());
                        if (cx.is_cuda())
                          cuda::pixel_xent_bwd(cx, logits.value().f32(), labels.i32(), lse.f32(), out.grad().f32(),
                                               count.i32(), n, c, hw, ignore_index, dlogits.f32());
                        else
                          ref::pixel_xent_bwd(logits.value().f32(), labels.i32(), n, c, hw, ignore_index, host_count,
                                              double(out.grad().f32()[0]), dlogits.f32());
                        timed.end();
                        accumulate_grad(cx, logits, std::move(dlogits));
                      });
  }
  return out;
}

}  // namespace ditto
