#include "engine/optim.h"

#include <fmt/format.h>

#include <cmath>

#include "engine/detail/optim_cuda.h"
#include "engine/error.h"
#include "engine/optim_ref.h"

namespace ditto {

void Optimizer::zero_grad() {
  for (auto& p : params_) p.var.zero_grad();
}

Sgd::Sgd(Context& ctx, std::vector<Param> params, SgdOptions opts) : Optimizer(std::move(params)), o_(opts) {
  if (o_.nesterov && o_.momentum <= 0) throw Error("sgd: nesterov needs momentum > 0");
  if (o_.momentum != 0)
    for (auto& p : params_) momentum_.push_back(ctx.zeros(p.var.shape()));
}

void Sgd::step(Context& ctx, float lr) {
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

void Adam::step(Context& ctx, float lr) {
  // Bias corrections in double on the host from the step count, as PyTorch computes them.
  const double t = static_cast<double>(steps_ + 1);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(double(o_.beta1), t)));
  const float bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(o_.beta2), t)));
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
  throw Error(fmt::format("unknown lr schedule '{}'; valid: constant, step, cosine", s));
}

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::Constant: return "constant";
    case LrSchedule::Step: return "step";
    case LrSchedule::Cosine: return "cosine";
  }
  return "?";
}

float lr_at(LrSchedule s, float base, double epoch, int total_epochs, const std::vector<int>& milestones) {
  switch (s) {
    case LrSchedule::Constant: return base;
    case LrSchedule::Step: {
      double lr = base;
      for (int m : milestones)
        if (std::floor(epoch) >= m) lr /= 10.0;
      return static_cast<float>(lr);
    }
    case LrSchedule::Cosine:
      return static_cast<float>(base * 0.5 * (1.0 + std::cos(M_PI * epoch / double(std::max(1, total_epochs)))));
  }
  return base;
}

}  // namespace ditto
