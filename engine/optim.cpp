#include "engine/optim.h"

#include <fmt/format.h>

#include <cmath>

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

Sgd::Sgd(Context& ctx, std::vector<Param> params, SgdOptions opts) : Optimizer(std::move(params)), o_(opts) {
  if (o_.nesterov && o_.momentum <= 0) throw Error("sgd: nesterov needs momentum > 0");
  if (o_.momentum != 0)
    for (auto& p : params_) momentum_.push_back(ctx.zeros(p.var.shape()));
}

std::vector<float> Sgd::step_scalars(int64_t, float lr) const { return {lr}; }

void Sgd::step(Context& ctx, float lr) {
  ProfileScope timed(ctx, ProfileKind::Optimizer);
  lr = step_scalars(steps_ + 1, lr)[0];
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& v = params_[i].var;
    if (!v.grad().defined()) continue;
    float* buf = o_.momentum != 0 ? momentum_[i].f32() : nullptr;
    if (ctx.is_cuda())
      cuda::sgd_update(ctx, v.value().f32(), v.grad().f32(), buf, v.value().numel(), lr, o_.momentum, o_.nesterov,
                       o_.weight_decay);
    else
      ref::sgd_update<float>(v.value().f32(), v.grad().f32(), buf, v.value().numel(), lr, o_.momentum, o_.nesterov,
                             o_.weight_decay);
  }
  ++steps_;
}

void Sgd::update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& v = params_[i].var;
    if (!v.grad().defined()) continue;
    float* buf = o_.momentum != 0 ? momentum_[i].f32() : nullptr;
    if (ctx.is_cuda()) {
      cuda::sgd_update_table(ctx, v.value().f32(), v.grad().f32(), buf, v.value().numel(), table, cursor, width,
                             o_.momentum, o_.nesterov, o_.weight_decay);
    } else {
      const float* row = table + static_cast<int64_t>(*cursor) * width;
      ref::sgd_update<float>(v.value().f32(), v.grad().f32(), buf, v.value().numel(), row[0], o_.momentum, o_.nesterov,
                             o_.weight_decay);
    }
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

std::vector<float> Adam::step_scalars(int64_t step, float lr) const {
  // Bias corrections in double on the host from the step count, as PyTorch computes them.
  const double t = static_cast<double>(step);
  return {static_cast<float>(lr / (1.0 - std::pow(double(o_.beta1), t))),
          static_cast<float>(std::sqrt(1.0 - std::pow(double(o_.beta2), t)))};
}

void Adam::step(Context& ctx, float lr) {
  ProfileScope timed(ctx, ProfileKind::Optimizer);
  const std::vector<float> s = step_scalars(steps_ + 1, lr);
  const float step_size = s[0], bias2_sqrt = s[1];
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& v = params_[i].var;
    if (!v.grad().defined()) continue;
    if (ctx.is_cuda())
      cuda::adam_update(ctx, v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), step_size,
                        o_.beta1, o_.beta2, o_.eps, bias2_sqrt, o_.weight_decay);
    else
      ref::adam_update<float>(v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), step_size,
                              o_.beta1, o_.beta2, o_.eps, bias2_sqrt, o_.weight_decay);
  }
  ++steps_;
}

void Adam::update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Var& v = params_[i].var;
    if (!v.grad().defined()) continue;
    if (ctx.is_cuda()) {
      cuda::adam_update_table(ctx, v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), table,
                              cursor, width, o_.beta1, o_.beta2, o_.eps, o_.weight_decay);
    } else {
      const float* row = table + static_cast<int64_t>(*cursor) * width;
      ref::adam_update<float>(v.value().f32(), v.grad().f32(), m_[i].f32(), v_[i].f32(), v.value().numel(), row[0],
                              o_.beta1, o_.beta2, o_.eps, row[1], o_.weight_decay);
    }
  }
}

std::vector<Buffer> Adam::state() {
  std::vector<Buffer> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i].name + ".exp_avg", &m_[i]});
    out.push_back({params_[i].name + ".exp_avg_sq", &v_[i]});
  }
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
