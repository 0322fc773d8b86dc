#include "nets/detail/tasks.h"

#include <fmt/format.h>

#include <cmath>

#include "engine/error.h"
#include "kernels/ctc.h"
#include "kernels/loss.h"
#include "kernels/pixel_xent.h"
#include "kernels/reduction.h"

namespace ditto::tasks {

Var reshaped(Context& ctx, const Var& x, Shape shape, const std::string& what) {
  if (shape_numel(shape) != x.value().numel())
    throw ShapeError(fmt::format("{}: cannot view {} as {}", what, shape_str(x.shape()), shape_str(shape)));
  Var out(x.value().reshape(std::move(shape)), needs_grad(ctx, {&x}));
  if (out.requires_grad()) {
    ctx.tape().record("reshape", "", {{"x", x}}, out, [xr = x.grad_ref(), outr = out.grad_ref()](Context& c) {
      if (!outr.grad().defined()) return;
      accumulate_grad(c, xr, pass_grad(c, outr).reshape(xr.shape()));
    });
  }
  return out;
}

std::vector<int32_t> time_major_index(int64_t n, int64_t a, int64_t t) {
  if (n * a * t > INT32_MAX) throw ShapeError(fmt::format("time_major_index: {}x{}x{} elements exceed 2^31-1", n, a, t));
  std::vector<int32_t> index(static_cast<std::size_t>(n * a * t));
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t ni = 0; ni < n; ++ni)
      for (int64_t ai = 0; ai < a; ++ai) index[(ti * n + ni) * a + ai] = static_cast<int32_t>((ni * a + ai) * t + ti);
  return index;
}

std::vector<std::pair<std::string, OpKind>> TaskNet::knob_layers() const {
  std::vector<std::pair<std::string, OpKind>> l = ZooNet::knob_layers();
  if (l.empty() || l.back() != std::make_pair(std::string("loss"), op::softmax_xent))
    throw Error(fmt::format("{}: ZooNet's knob layers no longer end with its softmax-xent \"loss\"", name()));
  l.pop_back();  // replaced by the task's loss layers
  l.insert(l.end(), extra_.begin(), extra_.end());
  for (const auto& loss : task_loss_layers(task())) l.push_back(loss);
  return l;
}

void init_conv_torch_default(Context& ctx, Conv2d& c, uint64_t seed) {
  const Shape& s = c.weight.value().shape();
  const double bound = 1.0 / std::sqrt(double(s[1] * s[2] * s[3]));
  zoo::init_uniform(ctx, c.name() + ".weight", c.weight, bound, seed);
  if (c.bias.defined()) zoo::init_uniform(ctx, c.name() + ".bias", c.bias, bound, seed);
}

void init_linear_torch_default(Context& ctx, Linear& fc, uint64_t seed) {
  const double bound = 1.0 / std::sqrt(double(fc.weight.value().shape()[1]));
  zoo::init_uniform(ctx, fc.name() + ".weight", fc.weight, bound, seed);
  if (fc.bias.defined()) zoo::init_uniform(ctx, fc.name() + ".bias", fc.bias, bound, seed);
}

}  // namespace ditto::tasks

namespace ditto {

std::vector<std::pair<std::string, OpKind>> task_loss_layers(Task t) {
  switch (t) {
    case Task::Segmentation: return {{"loss", op::pixel_xent}};
    case Task::Sequence: return {{"loss", op::ctc_loss}, {"loss_mean", op::reduce}};
    case Task::Classification: break;
  }
  return {{"loss", op::softmax_xent}};
}

}  // namespace ditto
