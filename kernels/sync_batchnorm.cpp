#include "kernels/sync_batchnorm.h"

#include <fmt/format.h>

#include <climits>

#include "engine/collective.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "kernels/batchnorm_ref.h"
#include "engine/operand_check.h"
#include "kernels/detail/sync_batchnorm_cuda.h"
#include "kernels/sync_batchnorm_ref.h"

namespace ditto {
namespace {

constexpr const char* kKey = "batchnorm.sync";

struct SyncState {
  std::shared_ptr<RankGroup> group;
  int rank = 0;
};

SyncState* sync_state(Context& ctx) { return static_cast<SyncState*>(ctx.op_state(kKey).get()); }

// Doubles travel in f32 tensors (two floats each): the group moves bytes.
double* as_doubles(Tensor& t) { return static_cast<double*>(t.raw()); }

void copy_floats(Context& ctx, float* dst, const float* src, int64_t n) {
  if (n == 0) return;
  if (ctx.is_cuda())
    DITTO_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, detail::stream_of(ctx)));
  else
    std::copy(src, src + n, dst);
}

void record(Context& ctx, const std::string& layer, const char* variant, Determinism det, const std::string& requested) {
  const Impl impl = ctx.is_cuda() ? Impl::Ditto : Impl::CpuReference;
  ctx.manifest().record({layer, "batchnorm", "bwd", variant, requested, det, "", 0, ctx.device().str(), "",
                         guarantee_of(det, impl)});
}

}  // namespace

void set_batch_norm_group(Context& ctx, std::shared_ptr<RankGroup> group, int rank) {
  if (!group) {
    ctx.op_state(kKey).reset();
    return;
  }
  if (rank < 0 || rank >= group->size() || !group->holds(rank) || group->device_of(rank) != ctx.device())
    throw Error(fmt::format("set_batch_norm_group: rank {} of a group of {} does not live on {}", rank, group->size(),
                            ctx.device().str()));
  ctx.op_state(kKey) = std::make_shared<SyncState>(SyncState{std::move(group), rank});
}

bool has_batch_norm_group(Context& ctx) { return sync_state(ctx) != nullptr; }

namespace {

cuda::BnDims check_sync_operands(const Context& ctx, const std::string& op, const Var& x, const Var& gamma,
                                 const Var& beta, const BatchNormState& state, float eps) {
  check_f32_on(ctx, x.value(), op, "x");
  check_ndim(x.value(), 4, op, "x");
  const Shape& xs = x.shape();
  const cuda::BnDims d{xs[0], xs[1], xs[2] * xs[3]};
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&gamma.value(), "gamma"},
                                {&beta.value(), "beta"},
                                {&state.running_mean, "state.running_mean"},
                                {&state.running_var, "state.running_var"}}) {
    check_f32_on(ctx, *t, op, what);
    if (t->shape() != Shape{d.c})
      throw ShapeError(fmt::format("{}: {} must have shape [{}], has {}", op, what, d.c, shape_str(t->shape())));
  }
  if (!(eps > 0.f)) throw ShapeError(fmt::format("{}: eps must be > 0, is {}", op, eps));
  if (ctx.is_cuda() && (d.n > INT_MAX || d.c > 65535 || d.hw > INT_MAX))
    throw ShapeError(fmt::format("{}: x {} is too large (N and H*W up to 2^31-1, C up to 65535)", op, shape_str(xs)));
  return d;
}

// cuDNN's batch norm cannot use statistics merged over ranks: a pinned cudnn is an error, a
// mode's cudnn becomes ditto's deterministic kernels.
BnBwd resolve_sync_bwd(const Context& ctx, const std::string& layer, const std::string& op,
                       const std::string& requested) {
  BnBwd variant = ctx.policy().variant<BnBwd>(layer, op::batchnorm);
  if (ctx.is_cuda() && variant == BnBwd::Cudnn) {
    if (requested == "pinned")
      throw PolicyError(fmt::format("{}: bwd=cudnn is pinned, but cuDNN's batch norm cannot use statistics merged "
                                    "over ranks; supported with synchronized batch norm: atomic, deterministic",
                                    op));
    variant = BnBwd::Deterministic;
  }
  return variant;
}

// What the forward pass leaves for the backward: the statistics it normalized with and the
// merged per-channel record (its last double is the global count).
struct SyncSaved {
  Tensor mean, invstd, merged;
};

// Every rank's per-channel sums, gathered and merged in rank order; then normalizes x into y.
void sync_forward(Context& ctx, const Var& x, const Var& gamma, const Var& beta, BatchNormState& state,
                  float momentum, float eps, const cuda::BnDims& d, RankGroup& group, int rank, Tensor& y,
                  SyncSaved& saved) {
  const int ranks = group.size();
  const int64_t per = 2 * d.c + 1;  // doubles per rank's record: sums, sums of squares, count
  Tensor local = ctx.empty({2 * per}), all = ctx.empty({2 * per * ranks});
  if (ctx.is_cuda())
    cuda::sbn_local_sums(ctx, x.value().f32(), d, as_doubles(local));
  else
    ref::sbn_local_sums(x.value().f32(), d.n, d.c, d.hw, as_doubles(local));
  group.all_gather(rank, ctx, local, all);
  float* mean = saved.mean.f32();
  float* invstd = saved.invstd.f32();
  if (ctx.is_cuda()) {
    cuda::sbn_merge(ctx, as_doubles(all), ranks, per, as_doubles(saved.merged));
    cuda::sbn_stats(ctx, as_doubles(saved.merged), d.c, momentum, eps, mean, invstd, state.running_mean.f32(),
                    state.running_var.f32());
    cuda::bn_apply(ctx, x.value().f32(), mean, invstd, gamma.value().f32(), beta.value().f32(), y.f32(), d);
  } else {
    ref::sbn_merge(as_doubles(all), ranks, per, as_doubles(saved.merged));
    ref::sbn_stats(as_doubles(saved.merged), d.c, momentum, eps, mean, invstd, state.running_mean.f32(),
                   state.running_var.f32());
    ref::bn_apply(x.value().f32(), mean, invstd, gamma.value().f32(), beta.value().f32(), y.f32(), d.n, d.c, d.hw);
  }
}

struct SyncGrads {
  Tensor dx, dgamma, dbeta;
};

// The local dgamma / dbeta, merged over the ranks as [sum dy | sum dy * xhat] by a fixed tree,
// then dx from the merged sums.
void sync_backward(Context& c, BnBwd variant, const cuda::BnDims& d, const Tensor& saved_x, const Tensor& saved_gamma,
                   SyncSaved& saved, const Tensor& dy_t, RankGroup& group, int rank, SyncGrads& g) {
  const int ranks = group.size();
  const float* xv = saved_x.f32();
  const float* dy = dy_t.f32();
  const float* mean = saved.mean.f32();
  const float* invstd = saved.invstd.f32();
  if (c.is_cuda()) {
    Tensor scratch = variant == BnBwd::Deterministic ? c.empty({cuda::bn_scratch_floats(d)}) : Tensor();
    cuda::bn_bwd_reduce(c, xv, dy, mean, invstd, d, variant == BnBwd::Atomic, g.dgamma.f32(), g.dbeta.f32(),
                        scratch.defined() ? scratch.f32() : nullptr);
  } else {
    ref::bn_bwd(xv, dy, mean, invstd, saved_gamma.f32(), true, static_cast<float*>(nullptr), g.dgamma.f32(),
                g.dbeta.f32(), d.n, d.c, d.hw);
  }
  Tensor pack = c.empty({2 * d.c}), gathered = c.empty({2 * d.c * ranks}), sums = c.empty({2 * d.c});
  copy_floats(c, pack.f32(), g.dbeta.f32(), d.c);
  copy_floats(c, pack.f32() + d.c, g.dgamma.f32(), d.c);
  group.all_gather(rank, c, pack, gathered);
  fixed_tree_sum_chunks(c, gathered, ranks, sums);
  if (!g.dx.defined()) return;
  const double* count = as_doubles(saved.merged) + 2 * d.c;
  if (c.is_cuda())
    cuda::sbn_bwd_dx(c, xv, dy, mean, invstd, saved_gamma.f32(), sums.f32(), sums.f32() + d.c, count, g.dx.f32(), d);
  else
    ref::sbn_bwd_dx(xv, dy, mean, invstd, saved_gamma.f32(), sums.f32(), sums.f32() + d.c, *count, g.dx.f32(), d.n,
                    d.c, d.hw);
}

}  // namespace

Var sync_batch_norm(Context& ctx, const std::string& layer, const Var& x, const Var& gamma, const Var& beta,
                    BatchNormState& state, float momentum, float eps) {
  SyncState* sync = sync_state(ctx);
  const std::string op = fmt::format("synchronized batchnorm (layer '{}')", layer);
  if (!sync)
    throw PolicyError(fmt::format("{}: stats=sync merges the batch statistics over a data-parallel run's ranks, and "
                                  "this context belongs to none (ditto-train --batchnorm sync with --gpus or "
                                  "--dp-groups gives it one; set_batch_norm_group in a program); supported here: "
                                  "local",
                                  op));
  const cuda::BnDims d = check_sync_operands(ctx, op, x, gamma, beta, state, eps);
  const std::string requested = ctx.policy().requested(layer, "bwd", op::batchnorm);
  const BnBwd variant = resolve_sync_bwd(ctx, layer, op, requested);
  const char* variant_name = ctx.is_cuda() ? name_of(variant) : "cpu-reference";
  const Determinism det = ctx.is_cuda() && variant == BnBwd::Atomic ? Determinism::No : Determinism::Yes;
  std::shared_ptr<RankGroup> group = sync->group;
  const int rank = sync->rank;

  ProfileScope timed(ctx, ProfileKind::BatchNormFwd, variant_name);
  const int64_t per = 2 * d.c + 1;
  SyncSaved saved{ctx.empty({d.c}), ctx.empty({d.c}), ctx.empty({2 * per})};
  Tensor y = ctx.empty(x.shape());
  sync_forward(ctx, x, gamma, beta, state, momentum, eps, d, *group, rank, y, saved);
  timed.end();
  record(ctx, layer, variant_name, det, requested);
  detail::record_bn_stats(ctx, layer, BnStats::Sync);

  const bool grad = needs_grad(ctx, {&x, &gamma, &beta});
  Var out(std::move(y), grad);
  if (!grad) return out;
  ctx.tape().record(
      "batchnorm", layer, {{"x", x}, {"gamma", gamma}, {"beta", beta}}, out,
      [saved_x = x.value(), saved_gamma = gamma.value(), xr = x.grad_ref(), gr = gamma.grad_ref(), br = beta.grad_ref(),
       outr = out.grad_ref(), saved, d, variant, variant_name, det, requested, layer, group, rank](Context& c) mutable {
        if (!outr.grad().defined()) return;
        record(c, layer, variant_name, det, requested);
        ProfileScope timed(c, ProfileKind::BatchNormBwd, variant_name);
        SyncGrads g{xr.requires_grad() ? c.empty(xr.shape()) : Tensor(), c.empty({d.c}), c.empty({d.c})};
        sync_backward(c, variant, d, saved_x, saved_gamma, saved, outr.grad(), *group, rank, g);
        timed.end();
        accumulate_grad(c, xr, std::move(g.dx));
        accumulate_grad(c, gr, std::move(g.dgamma));
        accumulate_grad(c, br, std::move(g.dbeta));
      });
  return out;
}

}  // namespace ditto
