#include "engine/tensor_ops.h"

#include <fmt/format.h>

#include "engine/operand_check.h"
#include "engine/detail/tensor_ops_cuda.h"

namespace ditto {

void fill(Context& ctx, Tensor& t, float value) {
  check_f32_on(ctx, t, "fill", "t");
  if (ctx.is_cuda()) return cuda::fill(ctx, t.f32(), t.numel(), value);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
}

void add_inplace(Context& ctx, Tensor& dst, const Tensor& src) { axpy_inplace(ctx, dst, 1.0f, src); }

void axpy_inplace(Context& ctx, Tensor& dst, float alpha, const Tensor& x) {
  check_f32_on(ctx, dst, "axpy", "dst");
  check_f32_on(ctx, x, "axpy", "x");
  if (dst.shape() != x.shape())
    throw ShapeError(fmt::format("axpy: shapes {} and {} differ", shape_str(dst.shape()), shape_str(x.shape())));
  if (ctx.is_cuda()) return cuda::axpy(ctx, dst.f32(), alpha, x.f32(), dst.numel());
  float* d = dst.f32();
  const float* s = x.f32();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] += alpha * s[i];
}

void scale_inplace(Context& ctx, Tensor& t, float alpha) {
  check_f32_on(ctx, t, "scale", "t");
  if (ctx.is_cuda()) return cuda::scale(ctx, t.f32(), alpha, t.numel());
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= alpha;
}

}  // namespace ditto
