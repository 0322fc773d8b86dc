#include "engine/optim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/detail/optim_cuda.h"
#include "engine/error.h"
#include "engine/optim_ref.h"
#include "engine/profiler.h"

namespace ditto {

void Optimizer::zero_grad() {
  for (auto& p : params_) p.var.zero_grad();
}

void Optimizer::plan(Context& ctx, const std::vector<float>& lrs) {
  if (lrs.empty()) throw Error(fmt::format("{}: plan() needs at least one step", name()));
  std::vector<float> rows;
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    std::vector<float> s = step_scalars(steps_ + 1 + static_cast<int64_t>(i), lrs[i]);
    if (i == 0) width_ = static_cast<int>(s.size());
    rows.insert(rows.end(), s.begin(), s.end());
  }
  // The table only grows, so graphs captured against it stay valid while the row count holds.
  if (!table_.defined() || table_.numel() < static_cast<int64_t>(rows.size()))
    table_ = ctx.empty({static_cast<int64_t>(rows.size())});
  rows.resize(static_cast<std::size_t>(table_.numel()), 0.0f);
  ctx.copy(table_, ctx.from_host(rows, {table_.numel()}));
  if (!cursor_.defined()) cursor_ = ctx.empty({1}, DType::I32);
  ctx.copy(cursor_, ctx.from_host(std::vector<int32_t>{0}, {1}));
  planned_ = static_cast<int64_t>(lrs.size());
  used_ = 0;
  prepare_steps(ctx, steps_ + planned_);
}

void Optimizer::set_skip_flag(Context& ctx, const Tensor& flag) {
  if (!flag.defined() || flag.dtype() != DType::I32 || flag.numel() != 1 || flag.device() != ctx.device())
    throw Error(fmt::format("{}: a skip flag is one i32 on {}", name(), ctx.device().str()));
  skip_ = flag;
  on_skip_flag(ctx);
}

void Optimizer::take_planned_step() {
  if (!table_.defined() || used_ >= planned_)
    throw Error(fmt::format("{}: step {} was not planned (the last plan() covered {} steps and {} were taken)", name(),
                            steps_ + 1, planned_, used_));
  ++used_;
  ++steps_;
}

void Optimizer::step_planned(Context& ctx) {
  const int64_t before = used_;
  take_planned_step();
  ProfileScope timed(ctx, ProfileKind::Optimizer);
  update_from_table(ctx, table_.f32(), cursor_.i32(), width_);
  if (ctx.is_cuda())
    cuda::advance_cursor(ctx, cursor_.i32());
  else
    *cursor_.i32() = static_cast<int32_t>(before + 1);
}

void Optimizer::count_replayed_step() { take_planned_step(); }

namespace {
// The update operands of every parameter with a gradient: its first and second state from a and b
// where they hold one per parameter (null or empty: none).
std::vector<cuda::ParamRef> updated(const std::vector<Param>& params, std::vector<Tensor>* a,
                                    std::vector<Tensor>* b) {
  std::vector<cuda::ParamRef> out;
  out.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Var& v = params[i].var;
    if (!v.grad().defined()) continue;
    cuda::ParamRef r;
    r.p = v.value().f32();
    r.grad = v.grad().f32();
    r.a = a && i < a->size() ? (*a)[i].f32() : nullptr;
    r.b = b && i < b->size() ? (*b)[i].f32() : nullptr;
    r.n = v.value().numel();
    out.push_back(r);
  }
  return out;
}
}  // namespace

Sgd::Sgd(Context& ctx, std::vector<Param> params, SgdOptions opts) : Optimizer(std::move(params)), o_(opts) {
  if (o_.nesterov && o_.momentum <= 0) throw Error("sgd: nesterov needs momentum > 0");
  if (o_.momentum != 0)
    for (auto& p : params_) momentum_.push_back(ctx.zeros(p.var.shape()));
}

std::vector<float> Sgd::step_scalars(int64_t, float lr) const { return {lr}; }

void Sgd::step(Context& ctx, float lr) {
  ProfileScope timed(ctx, ProfileKind::Optimizer);
  lr = step_scalars(steps_ + 1, lr)[0];
  if (skips_on_host(ctx)) {
    ++steps_;
    return;
  }
  if (ctx.is_cuda()) {
    cuda::sgd_update(ctx, updated(params_, &momentum_, nullptr), lr, o_.momentum, o_.nesterov, o_.weight_decay, skip_flag());
  } else {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Var& v = params_[i].var;
      if (!v.grad().defined()) continue;
      float* buf = o_.momentum != 0 ? momentum_[i].f32() : nullptr;
      ref::sgd_update<float>(v.value().f32(), v.grad().f32(), buf, v.value().numel(), lr, o_.momentum, o_.nesterov,
                             o_.weight_decay);
    }
  }
  ++steps_;
}

void Sgd::update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) {
  if (skips_on_host(ctx)) return;
  if (ctx.is_cuda()) {
    cuda::sgd_update_table(ctx, updated(params_, &momentum_, nullptr), table, cursor, width, o_.momentum, o_.nesterov,
                           o_.weight_decay, skip_flag());
    return;
  }
  const float* row = table + static_cast<int64_t>(*cursor) * width;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& v = params_[i].var;
    if (!v.grad().defined()) continue;
    float* buf = o_.momentum != 0 ? momentum_[i].f32() : nullptr;
    ref::sgd_update<float>(v.value().f32(), v.grad().f32(), buf, v.value().numel(), row[0], o_.momentum, o_.nesterov,
                           o_.weight_decay);
  }
}

std::vector<Buffer> Sgd::state() {
  std::vector<Buffer> out;
  for (std::size_t i = 0; i < momentum_.size(); ++i) out.push_back({params_[i].name + ".momentum", &momentum_[i]});
  return out;
}

Adam::Adam(Context& ctx, std::vector<Param> params, AdamOptions opts) : Optimizer(std::move(params)), o_(opts) {
  for (auto& p : params_) {
    m_.push_back(ctx.zeros(p.var.shape()));
    v_.push_back(ctx.zeros(p.var.shape()));
  }
}

namespace {
// Adam's bias corrections of step t, in double on the host from the step count, as PyTorch
// computes them: the one expression of step_scalars and of the device's table.
double adam_c1(float beta1, int64_t t) { return 1.0 - std::pow(double(beta1), static_cast<double>(t)); }
float adam_bias2_sqrt(float beta2, int64_t t) {
  return static_cast<float>(std::sqrt(1.0 - std::pow(double(beta2), static_cast<double>(t))));
}
}  // namespace

// {step_size, bias2_sqrt, lr}: the third column is read by the updates under a skip flag, whose
// bias corrections follow the updates applied rather than the step.
std::vector<float> Adam::step_scalars(int64_t step, float lr) const {
  return {static_cast<float>(lr / adam_c1(o_.beta1, step)), adam_bias2_sqrt(o_.beta2, step), lr};
}

void Adam::step(Context& ctx, float lr) {
  ProfileScope timed(ctx, ProfileKind::Optimizer);
  if (updates_.defined()) {
    prepare_steps(ctx, steps_ + 1);
    update_counted(ctx, lr, nullptr, nullptr, 0);
    ++steps_;
    return;
  }
  const std::vector<float> s = step_scalars(steps_ + 1, lr);
  const float step_size = s[0], bias2_sqrt = s[1];
  if (ctx.is_cuda()) {
    cuda::adam_update(ctx, updated(params_, &m_, &v_), step_size, o_.beta1, o_.beta2, o_.eps, bias2_sqrt, o_.weight_decay);
  } else {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Var& v = params_[i].var;
      if (!v.grad().defined()) continue;
      ref::adam_update<float>(v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), step_size,
                              o_.beta1, o_.beta2, o_.eps, bias2_sqrt, o_.weight_decay);
    }
  }
  ++steps_;
}

void Adam::update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) {
  if (updates_.defined()) return update_counted(ctx, 0.0f, table, cursor, width);
  if (ctx.is_cuda()) {
    cuda::adam_update_table(ctx, updated(params_, &m_, &v_), table, cursor, width, o_.beta1, o_.beta2, o_.eps, o_.weight_decay);
    return;
  }
  const float* row = table + static_cast<int64_t>(*cursor) * width;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& v = params_[i].var;
    if (!v.grad().defined()) continue;
    ref::adam_update<float>(v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), row[0],
                            o_.beta1, o_.beta2, o_.eps, row[1], o_.weight_decay);
  }
}

void Adam::on_skip_flag(Context& ctx) {
  if (!updates_.defined()) updates_ = ctx.zeros({1}, DType::I32);  // a second flag keeps the count
}

void Adam::prepare_steps(Context& ctx, int64_t last_step) {
  if (updates_.defined() && ctx.is_cuda()) ensure_corrections(ctx, last_step);
}

void Adam::ensure_corrections(Context& ctx, int64_t steps) {
  const int64_t have = c1_.defined() ? c1_.numel() / 2 : 0;
  if (steps <= have) return;
  // Doubling: a graph captured against the table is recaptured only log2(steps) times.
  const int64_t rows = std::max<int64_t>({steps, 2 * have, 256});
  std::vector<int32_t> c1_words(static_cast<std::size_t>(rows * 2));
  std::vector<float> b2(static_cast<std::size_t>(rows));
  for (int64_t t = 1; t <= rows; ++t) {
    const double c1 = adam_c1(o_.beta1, t);
    std::memcpy(&c1_words[static_cast<std::size_t>(2 * (t - 1))], &c1, sizeof c1);
    b2[static_cast<std::size_t>(t - 1)] = adam_bias2_sqrt(o_.beta2, t);
  }
  c1_ = ctx.from_host(c1_words, {rows * 2});
  bias2_sqrt_ = ctx.from_host(b2, {rows});
}

// One update under the skip flag: step t = updates applied + 1, lr by value or from the plan's
// row (column 2). The CPU computes the scalars with step_scalars itself (the same bits the
// device's table gives).
void Adam::update_counted(Context& ctx, float lr, const float* table, const int32_t* cursor, int width) {
  if (!ctx.is_cuda()) {
    if (skips_on_host(ctx)) return;
    if (table) lr = table[static_cast<int64_t>(*cursor) * width + 2];
    const std::vector<float> s = step_scalars(int64_t(*updates_.i32()) + 1, lr);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Var& v = params_[i].var;
      if (v.grad().defined())
        ref::adam_update<float>(v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), s[0],
                                o_.beta1, o_.beta2, o_.eps, s[1], o_.weight_decay);
    }
    *updates_.i32() += 1;
    return;
  }
  const auto* c1 = reinterpret_cast<const double*>(c1_.i32());
  cuda::adam_update_counted(ctx, updated(params_, &m_, &v_), lr, table, cursor, width, c1, bias2_sqrt_.f32(), updates_.i32(),
                            skip_flag(), o_.beta1, o_.beta2, o_.eps, o_.weight_decay);
  cuda::count_update(ctx, updates_.i32(), skip_flag());
}

std::vector<Buffer> Adam::state() {
  std::vector<Buffer> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i].name + ".exp_avg", &m_[i]});
    out.push_back({params_[i].name + ".exp_avg_sq", &v_[i]});
  }
  if (updates_.defined()) out.push_back({"updates_applied", &updates_});  // under a skip flag
  return out;
}

LrSchedule parse_lr_schedule(const std::string& s) {
  if (s == "constant") return LrSchedule::Constant;
  if (s == "step") return LrSchedule::Step;
  if (s == "cosine") return LrSchedule::Cosine;
  if (s == "onecycle") return LrSchedule::OneCycle;
  throw Error(fmt::format("unknown lr schedule '{}'; valid: constant, step, cosine, onecycle", s));
}

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::Constant: return "constant";
    case LrSchedule::Step: return "step";
    case LrSchedule::Cosine: return "cosine";
    case LrSchedule::OneCycle: return "onecycle";
  }
  return "?";
}

float lr_at(LrSchedule s, float base, double epoch, int total_epochs, const std::vector<int>& milestones,
            double warmup_epochs) {
  const double total = double(std::max(1, total_epochs));
  if (!(warmup_epochs >= 0 && warmup_epochs < total))
    throw Error(fmt::format("lr schedule: a warm-up of {} epochs must be at least 0 and below the {} epochs of training",
                            warmup_epochs, total_epochs));
  if (epoch < warmup_epochs) return static_cast<float>(base * epoch / warmup_epochs);
  // Decaying schedules run their course over the epochs after the warm-up (written so that
  // without one the cosine is evaluated exactly as it always was: same bits).
  const double after = epoch - warmup_epochs, span = total - warmup_epochs;
  switch (s) {
    case LrSchedule::Constant: return base;
    case LrSchedule::Step: {
      double lr = base;
      for (int m : milestones)
        if (std::floor(epoch) >= m) lr /= 10.0;
      return static_cast<float>(lr);
    }
    case LrSchedule::Cosine: return static_cast<float>(base * 0.5 * (1.0 + std::cos(M_PI * after / span)));
    case LrSchedule::OneCycle: return static_cast<float>(base * std::max(0.0, (span - after) / span));
  }
  return base;
}

}  // namespace ditto
