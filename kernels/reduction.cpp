#include "kernels/reduction.h"

#include <fmt/format.h>

#include <cmath>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/operand_check.h"
#include "kernels/detail/op_record.h"
#include "kernels/detail/reduction_cuda.h"
#include "kernels/reduction_ref.h"

namespace ditto {

std::vector<VariantSpec> reduction_variants() {
  return {{"atomic", Guarantee::NotGuaranteed, Impl::Ditto, "atomicAdd of per-block partial sums"},
          {"deterministic", Guarantee::GpuToGpu, Impl::Ditto, "per-block partial sums added in a fixed order"}};
}

namespace {
std::vector<VariantSpec> reduce_variants() {
  std::vector<VariantSpec> v = reduction_variants();
  v.push_back({"cub", Guarantee::RunToRun, Impl::Library, "cub::DeviceReduce::Sum (two passes, grid by SM count)"});
  return v;
}
}  // namespace

DITTO_KNOB(reduce_knob, {op::reduce, "reduce", reduce_variants(), "atomic", false, "the sum's order",
                         // PyTorch's sum and mean reduce without atomics, in an order fixed per shape.
                         "deterministic"})

const char* name_of(Reduction r) { return variant_name(reduce_knob(), r); }

namespace {

Var reduce_all(Context& ctx, const std::string& layer, const Var& x, bool mean) {
  const char* name = mean ? "reduce_mean" : "reduce_sum";
  const std::string op = fmt::format("{} (layer '{}')", name, layer);
  check_f32_on(ctx, x.value(), op, "x");
  const int64_t n = x.value().numel();
  const Reduction r = ctx.policy().variant<Reduction>(layer, op::reduce);
  const std::string requested = ctx.policy().requested(layer, "reduce", op::reduce);
  Tensor out = ctx.empty({1});
  std::size_t ws_bytes = 0;
  if (ctx.is_cuda()) {
    ws_bytes = sizeof(float) * cuda::reduce_workspace_floats(n, r);
    detail::Workspace ws(detail::cuda_state(ctx), ws_bytes);
    if (!ws.ok())
      throw PolicyError(fmt::format("{}: reduce={} needs a workspace of {} bytes, which could not be "
                                    "allocated; reduce=atomic needs none",
                                    op, name_of(r), ws_bytes));
    cuda::reduce_all(ctx, x.value().f32(), n, mean, r, static_cast<float*>(ws.get()), out.f32());
  } else {
    const double s = ref::sum_all(x.value().f32(), n);
    out.f32()[0] = static_cast<float>(mean ? s / double(n) : s);
  }
  const VariantSpec& ran = reduce_knob().variants[static_cast<std::size_t>(r)];
  detail::record_knob(ctx, layer, "reduce", "reduce", ran.name, requested,
                      ran.guarantee == Guarantee::NotGuaranteed ? Determinism::No : Determinism::Yes, ran.impl,
                      ws_bytes);

  const bool grad = needs_grad(ctx, {&x});
  Var y(std::move(out), grad);
  if (grad) {
    ctx.tape().record(name, layer, {{"x", x}}, y, [x, y, n, mean](Context& c) {
      if (!y.grad().defined()) return;
      Tensor dx = c.empty(x.shape());
      if (c.is_cuda()) {
        cuda::reduce_all_bwd(c, y.grad().f32(), dx.f32(), n, mean);
      } else {
        const float g = static_cast<float>(mean ? double(y.grad().f32()[0]) / double(n) : double(y.grad().f32()[0]));
        std::fill(dx.f32(), dx.f32() + n, g);
      }
      accumulate_grad(c, x, std::move(dx));
    });
  }
  return y;
}

}  // namespace

Var reduce_sum(Context& ctx, const std::string& layer, const Var& x) { return reduce_all(ctx, layer, x, false); }
Var reduce_mean(Context& ctx, const std::string& layer, const Var& x) { return reduce_all(ctx, layer, x, true); }

}  // namespace ditto
