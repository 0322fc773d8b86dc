#include "kernels/metrics.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/operand_check.h"
#include "engine/tensor_ops.h"
#include "kernels/detail/metrics_cuda.h"
#include "kernels/metrics_ref.h"

namespace ditto {
namespace {
// Logits of any float dtype as f32: a classifier that hands on its native bf16 / f16 result is
// widened exactly, so the ranking is that of the logits themselves.
Tensor f32_logits(Context& ctx, const Tensor& logits, const char* op) {
  check_float_any_layout_on(ctx, logits, op, "logits");
  check_ndim(logits, 2, op, "logits");
  return logits.dtype() == DType::F32 ? logits : to_dtype(ctx, logits, DType::F32);
}
}  // namespace

Tensor topk(Context& ctx, const Tensor& any_logits, int k) {
  const Tensor logits = f32_logits(ctx, any_logits, "topk");
  const int64_t n = logits.dim(0), c = logits.dim(1);
  if (k < 1 || k > 16 || k > c) throw ShapeError(fmt::format("topk: k={} must be in 1..min(16, {})", k, c));
  Tensor out = ctx.empty({n, k}, DType::I32);
  if (ctx.is_cuda())
    cuda::topk(ctx, logits.f32(), n, c, k, out.i32());
  else
    ref::topk(logits.f32(), n, c, k, out.i32());
  return out;
}

void accumulate_correct(Context& ctx, const Tensor& any_logits, const Tensor& labels, Tensor& counts) {
  const Tensor logits = f32_logits(ctx, any_logits, "accumulate_correct");
  const int64_t n = logits.dim(0), c = logits.dim(1);
  if (labels.dtype() != DType::I32 || labels.numel() != n || labels.device() != ctx.device())
    throw ShapeError(fmt::format("accumulate_correct: labels must be i32 [{}] on {}", n, ctx.device().str()));
  if (counts.dtype() != DType::I32 || counts.numel() != 2 || counts.device() != ctx.device())
    throw ShapeError("accumulate_correct: counts must be i32 [2] on the context's device");
  if (ctx.is_cuda()) return cuda::accumulate_correct(ctx, logits.f32(), labels.i32(), n, c, counts.i32());
  const int k = static_cast<int>(std::min<int64_t>(5, c));
  std::vector<int32_t> top(static_cast<std::size_t>(n * k));
  ref::topk(logits.f32(), n, c, k, top.data());
  int32_t* cnt = counts.i32();
  const int32_t* lab = labels.i32();
  for (int64_t r = 0; r < n; ++r) {
    cnt[0] += top[r * k] == lab[r];
    cnt[1] += std::find(&top[r * k], &top[r * k] + k, lab[r]) != &top[r * k] + k;
  }
}

}  // namespace ditto
