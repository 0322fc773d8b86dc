#include "experiments/step.h"

#include <fmt/format.h>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/loss_scale.h"
#include "engine/optim.h"
#include "engine/tracer.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "kernels/metrics.h"
#include "nets/module.h"

namespace ditto {

void traced_update(Context& ctx, Optimizer& opt, const std::vector<Param>& params, float lr, Tracer& tracer) {
  // Each update's inputs are the weight before it and its gradient; copies, since the optimizer
  // updates in place.
  std::vector<Tensor> before;
  for (const auto& p : params) before.push_back(p.var.grad().defined() ? ctx.to_device(p.var.value()) : Tensor());
  opt.step(ctx, lr);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (before[i].defined())
      tracer.event("update", params[i].name, opt.name(), {{"w_before", &before[i]}, {"dw", &params[i].var.grad()}},
                   {{"w", &params[i].var.value()}});
}

TrainStep::TrainStep(Context& ctx, Net& net, Optimizer& opt, bool graphs, Tracer* tracer, uint64_t stochastic_seed,
                     LossScaler* scaler)
    : ctx_(ctx), net_(net), opt_(opt), graphs_(graphs), tracer_(tracer), stochastic_seed_(stochastic_seed),
      scaler_(scaler), params_(net.params()) {
  if (scaler_) opt_.set_skip_flag(ctx_, scaler_->found_inf());
  if (graphs_ && !ctx.is_cuda()) throw Error(fmt::format("--graph: CUDA graphs need a CUDA device; this run is on {}", ctx.device().str()));
  if (graphs_ && tracer_)
    throw Error("--graph: a tracer observes every op on the host as it runs, and a graph replay runs none of them "
                "there; trace without --graph");
  if (graphs_ && net.stochastic())
    throw Error(fmt::format("--graph: {} has dropout, whose masks change every step; a graph would replay the "
                            "first step's masks; train it without --graph", net.name()));
}

void TrainStep::plan(const std::vector<float>& lrs) {
  planned_lrs_ = lrs;
  next_lr_ = 0;
  if (graphs_) opt_.plan(ctx_, lrs);
  if (scaler_) scaler_->reserve(ctx_, static_cast<int64_t>(lrs.size()));
}

// Backward (seeded with the loss scale), the scaler's unscale and check, the update (which the
// optimizer skips on the device after an overflow), zero_grad, and the scaler's record and
// schedule: the same queued work whether it runs eagerly or is captured.
void TrainStep::backward_and_update(const Var& loss, float lr, bool planned) {
  ctx_.tape().backward(ctx_, loss, scaler_ ? scaler_->seed().reshape(loss.shape()) : Tensor());
  if (scaler_) scaler_->unscale(ctx_, params_);
  if (tracer_) {
    traced_update(ctx_, opt_, params_, lr, *tracer_);
  } else if (planned) {
    opt_.step_planned(ctx_);
  } else {
    opt_.step(ctx_, lr);
  }
  opt_.zero_grad();
  if (scaler_) scaler_->update(ctx_);
}

void TrainStep::body(const Tensor& images, const Tensor& labels, const TaskTargets& targets, float lr, bool planned,
                     Tensor& loss_sum, Tensor& correct) {
  if (tracer_) {
    std::vector<TracedTensor> data = {{"images", &images}, {"labels", &labels}};
    if (targets.targets.defined()) data.push_back({"targets", &targets.targets});
    if (targets.lengths.defined()) data.push_back({"target_lengths", &targets.lengths});
    tracer_->event("data", "data", "loader", {}, data);
  }
  net_.begin_step(stochastic_seed_, opt_.steps() + 1);
  Var logits = net_.forward(ctx_, Var(images), true);
  const Task task = net_.task();
  Tensor input_lengths;
  if (task == Task::Sequence) {
    // Made on the first (eager) step of each shape, so a captured step only reads it.
    const int64_t n = labels.numel(), steps = logits.shape().empty() ? 0 : logits.shape()[0];
    Tensor& held = input_lengths_[{n, steps}];
    if (!held.defined()) held = ctc_input_lengths(ctx_, n, steps);
    input_lengths = held;
  }
  Var loss = task == Task::Classification ? softmax_cross_entropy(ctx_, "loss", logits, labels)
                                          : task_loss(ctx_, task, logits, labels, targets, input_lengths);
  backward_and_update(loss, lr, planned);
  // Batch-weighted so the epoch loss is the mean over examples, summed in batch order.
  axpy_inplace(ctx_, loss_sum, static_cast<float>(labels.numel()), loss.value());
  if (task == Task::Classification) accumulate_correct(ctx_, logits.value(), labels, correct);
}

void TrainStep::run(const Tensor& images, const Tensor& labels, float lr, Tensor& loss_sum, Tensor& correct,
                    const TaskTargets& targets) {
  if (!graphs_) {
    if (scaler_) scaler_->reserve(ctx_, 1);  // eager: room for this step's record, if plan() made none
    body(images, labels, targets, lr, false, loss_sum, correct);
    return;
  }
  if (next_lr_ >= planned_lrs_.size())
    throw Error(fmt::format("TrainStep: step {} was not planned ({} planned)", next_lr_ + 1, planned_lrs_.size()));
  if (planned_lrs_[next_lr_] != lr)
    throw Error(fmt::format("TrainStep: step {} runs at lr {} but {} was planned", next_lr_ + 1, lr,
                            planned_lrs_[next_lr_]));
  ++next_lr_;
  auto& slot = slots_[labels.numel()];
  if (!slot) {
    slot = std::make_unique<Slot>();
    slot->images = ctx_.empty(images.shape(), images.dtype());
    slot->labels = ctx_.empty(labels.shape(), DType::I32);
    for (auto [from, to] : {std::pair{&targets.targets, &slot->targets.targets},
                            std::pair{&targets.lengths, &slot->targets.lengths}})
      if (from->defined()) *to = ctx_.empty(from->shape(), from->dtype());
  }
  Slot& s = *slot;
  ctx_.copy(s.images, images);
  ctx_.copy(s.labels, labels);
  for (auto [from, to] : {std::pair{&targets.targets, &s.targets.targets}, std::pair{&targets.lengths, &s.targets.lengths}})
    if (from->defined() != to->defined() || (from->defined() && from->shape() != to->shape()))
      throw Error(fmt::format("TrainStep: batch {} came with other targets than its first step ({} vs {})",
                              labels.numel(), from->defined() ? shape_str(from->shape()) : "none",
                              to->defined() ? shape_str(to->shape()) : "none"));
    else if (from->defined())
      ctx_.copy(*to, *from);
  if (!s.warmed) {
    body(s.images, s.labels, s.targets, lr, true, loss_sum, correct);
    s.warmed = true;
    return;
  }
  if (!s.graph.captured() || stale(s, loss_sum, correct)) {
    s.graph.capture(ctx_, [&] { body(s.images, s.labels, s.targets, lr, true, loss_sum, correct); });
    remember_addresses(s, loss_sum, correct);
  } else {
    opt_.count_replayed_step();  // the capture counted its own step when its host code ran
    if (scaler_) scaler_->count_replayed_step();
  }
  s.graph.launch(ctx_);
}

// A graph bakes in addresses: it is stale once the optimizer's tables, the scaler's record or the
// sums moved.
bool TrainStep::stale(const Slot& s, const Tensor& loss_sum, const Tensor& correct) const {
  return s.table != opt_.table_address() || s.counted != opt_.counted_address() || s.loss_sum != loss_sum.raw() ||
         s.correct != correct.raw() || s.record != (scaler_ ? scaler_->record_address() : nullptr);
}

void TrainStep::remember_addresses(Slot& s, const Tensor& loss_sum, const Tensor& correct) const {
  s.table = opt_.table_address();
  s.counted = opt_.counted_address();
  s.loss_sum = loss_sum.raw();
  s.correct = correct.raw();
  s.record = scaler_ ? scaler_->record_address() : nullptr;
}

std::size_t TrainStep::graphs_captured() const {
  std::size_t n = 0;
  for (const auto& [size, s] : slots_) n += s->graph.captured() ? 1 : 0;
  return n;
}

std::size_t TrainStep::graph_nodes() const {
  std::size_t n = 0;
  for (const auto& [size, s] : slots_) n += s->graph.nodes();
  return n;
}

}  // namespace ditto
