// TrainStep: one optimizer step of a network, as the trainer and the step-time benchmark run it:
// forward, the task's loss (softmax cross-entropy for classification; experiments/task_scoring.h for the
// others), backward, the update, zero_grad, and the epoch's loss and accuracy sums accumulated on
// the device (no host copy per step).
//
// With graphs on (CUDA only), each batch size gets a CUDA graph (engine/graph.h): its first
// step runs eagerly (algorithm choice, cuDNN Find or tuning, lazily sized workspaces need the
// host), its second is captured, and every later one is a single graph launch. Inputs are
// copied into fixed buffers first, and the optimizer reads its per-step scalars from its plan
// (Optimizer::plan), so a graphed step does exactly what the eager one does: the runs are
// bit-identical (tests/gpu_graph.cpp). A final partial batch is simply another batch size, so
// it gets its own graph rather than being dropped.
//
// With a loss scaler (engine/loss_scale.h), the backward pass is seeded with its scale, the
// gradients are unscaled and checked before the update, the optimizer skips the update of a step
// that overflowed (its skip flag), and the scaler records the step and updates its scale: all on
// the device, so eager and graphed steps do the same thing. plan() makes room for the records.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/graph.h"
#include "engine/param.h"
#include "engine/tensor.h"
#include "experiments/task_scoring.h"

namespace ditto {

class Context;
class LossScaler;
class Net;
class Optimizer;
class Tracer;

// opt.step(ctx, lr) with an "update" event per updated parameter (inputs the weight before and
// its gradient, output the weight after) for tracer: how a traced step updates.
void traced_update(Context& ctx, Optimizer& opt, const std::vector<Param>& params, float lr, Tracer& tracer);

class TrainStep {
 public:
  // A tracer sees every op and update (it needs the host at every op, so it cannot be combined
  // with graphs: Error). The caller keeps net, opt and tracer alive. stochastic_seed keys the
  // net's stochastic layers (Net::begin_step) together with the step number; a stochastic net
  // cannot be graphed either (Error). scaler: loss scaling, or null for none; the caller keeps it
  // alive, and the optimizer takes its overflow flag as its skip flag (Optimizer::set_skip_flag).
  TrainStep(Context& ctx, Net& net, Optimizer& opt, bool graphs, Tracer* tracer = nullptr,
            uint64_t stochastic_seed = 0, LossScaler* scaler = nullptr);

  // The learning rates of the coming steps, one per step. Graph mode needs them before the
  // steps run (they go to the optimizer's table); eager mode takes each with run().
  void plan(const std::vector<float>& lrs);

  // One step on (images, labels) at learning rate lr (in graph mode the planned rate is used;
  // lr must equal it). loss_sum (1 f32) gets batch size * mean loss added, correct (2 i32) the
  // top-1 hits (classification only: the other tasks leave it alone); in graph mode both must keep
  // their storage from call to call. targets: the batch's targets for the net's task, if not
  // classification.
  void run(const Tensor& images, const Tensor& labels, float lr, Tensor& loss_sum, Tensor& correct,
           const TaskTargets& targets = {});

  bool graphs() const { return graphs_; }
  std::size_t graphs_captured() const;
  std::size_t graph_nodes() const;  // summed over the captured graphs

 private:
  struct Slot {
    Tensor images, labels;          // fixed input buffers of one batch size
    TaskTargets targets;
    bool warmed = false;            // its eager step has run
    StepGraph graph;
    const void* table = nullptr;    // the optimizer table and sums the graph was captured with
    const void* loss_sum = nullptr;
    const void* correct = nullptr;
    const void* counted = nullptr;  // and, under loss scaling, the tables that move as they grow
    const void* record = nullptr;
  };
  bool stale(const Slot& s, const Tensor& loss_sum, const Tensor& correct) const;
  void remember_addresses(Slot& s, const Tensor& loss_sum, const Tensor& correct) const;
  void backward_and_update(const Var& loss, float lr, bool planned);
  void body(const Tensor& images, const Tensor& labels, const TaskTargets& targets, float lr, bool planned,
            Tensor& loss_sum, Tensor& correct);

  Context& ctx_;
  Net& net_;
  Optimizer& opt_;
  bool graphs_;
  Tracer* tracer_;
  uint64_t stochastic_seed_;
  LossScaler* scaler_;
  std::vector<Param> params_;
  std::vector<float> planned_lrs_;
  std::size_t next_lr_ = 0;
  std::map<int64_t, std::unique_ptr<Slot>> slots_;  // by batch size
  std::map<std::pair<int64_t, int64_t>, Tensor> input_lengths_;  // CTC's, by (batch size, steps): made
                                                                 // once, before any capture
};

}  // namespace ditto
