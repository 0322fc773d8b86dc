// Optimizers and learning-rate schedules. Update kernels are elementwise (one thread per
// parameter element, no reductions), so an update is bit-reproducible; the formulas follow
// PyTorch's SGD and Adam exactly so results can be compared with a PyTorch loop.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/param.h"

namespace ditto {

struct SgdOptions {
  float momentum = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;  // L2 added to the gradient, as torch.optim.SGD
};

struct AdamOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;  // L2 added to the gradient, as torch.optim.Adam
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update of every parameter that has a gradient, at learning rate lr.
  virtual void step(Context& ctx, float lr) = 0;
  // Optimizer state for checkpoints: "<param>.<slot>" → tensor.
  virtual std::vector<Buffer> state() = 0;
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  void zero_grad();

  // Steps planned ahead, for CUDA graphs: a replayed graph cannot be handed new kernel
  // arguments, so the per-step scalars (learning rate, Adam's bias corrections) come from a
  // table on the device. plan() computes, on the host and with the very expressions step()
  // uses, the scalars of the next lrs.size() steps, uploads them and sets a step cursor (on the
  // device) to the first row; step_planned() queues the updates reading the cursor's row and
  // then advances the cursor on the device. An update from the table is therefore bit-identical
  // to step() at the same learning rate. The table keeps its address while the number of rows
  // does not grow (table_address() tells a graph's owner when it moved).
  void plan(Context& ctx, const std::vector<float>& lrs);
  void step_planned(Context& ctx);
  // A replay of a captured step_planned(): advances the host-side counts the replay skipped.
  // Throws Error past the planned steps (the table has no row for them).
  void count_replayed_step();
  const void* table_address() const { return table_.defined() ? table_.raw() : nullptr; }

  // Loss scaling (engine/loss_scale.h): from now on every update first reads `flag` (i32 {1} on
  // this context's device) and, when it is nonzero, changes nothing: no weight, momentum, Adam
  // moment or Adam update count moves (steps() still counts the step: it numbers steps taken).
  // Adam then takes its bias corrections from the count of updates applied, kept on the device,
  // as torch.optim.Adam's step count under GradScaler. The caller keeps the flag alive.
  void set_skip_flag(Context& ctx, const Tensor& flag);
  // Where the tables a planned step reads live besides table_address() (Adam's bias corrections
  // under a skip flag); a graph captured against them is stale once one moves.
  virtual const void* counted_address() const { return nullptr; }
  // Readies now what the updates of steps up to `last_step` (1-based) read. A run that knows its
  // length calls it once before its first step, so those tables never move mid-run and a captured
  // step is never recaptured for them (plan() readies its own steps in any case).
  void reserve_steps(Context& ctx, int64_t last_step) { prepare_steps(ctx, last_step); }

 protected:
  explicit Optimizer(std::vector<Param> params) : params_(std::move(params)) {}
  // The scalars of step t (1-based) at learning rate lr, as step() and plan() use them.
  virtual std::vector<float> step_scalars(int64_t t, float lr) const = 0;
  // Queues the update of every parameter with a gradient, its scalars read from `row` of the
  // table (a device pointer on CUDA: the row the cursor names; a host row on the CPU).
  virtual void update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) = 0;
  void take_planned_step();
  // Set up what updates under a skip flag need (Adam: its update count).
  virtual void on_skip_flag(Context&) {}
  // Readies what the updates of steps up to `last_step` (1-based) read, before they are queued.
  virtual void prepare_steps(Context&, int64_t /*last_step*/) {}
  const int32_t* skip_flag() const { return skip_.defined() ? skip_.i32() : nullptr; }
  // The CPU reads the flag on the host; CUDA kernels read it on the device (never the host).
  bool skips_on_host(const Context& ctx) const { return !ctx.is_cuda() && skip_.defined() && *skip_.i32() != 0; }
  std::vector<Param> params_;
  int64_t steps_ = 0;
  Tensor table_, cursor_;          // (rows * width) f32 and (1) i32 on the context's device
  int64_t planned_ = 0, used_ = 0; // rows planned by the last plan() and used since
  int width_ = 0;                  // scalars per row
  Tensor skip_;                    // the loss scaler's overflow flag; undefined: never skip
};

class Sgd : public Optimizer {
 public:
  Sgd(Context& ctx, std::vector<Param> params, SgdOptions opts);
  std::string name() const override { return "sgd"; }
  void step(Context& ctx, float lr) override;
  std::vector<Buffer> state() override;

 protected:
  std::vector<float> step_scalars(int64_t t, float lr) const override;
  void update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) override;

 private:
  SgdOptions o_;
  std::vector<Tensor> momentum_;
};

class Adam : public Optimizer {
 public:
  Adam(Context& ctx, std::vector<Param> params, AdamOptions opts);
  std::string name() const override { return "adam"; }
  void step(Context& ctx, float lr) override;
  // Under a skip flag, "updates_applied" (i32 {1}) joins the moments.
  std::vector<Buffer> state() override;
  const void* counted_address() const override { return c1_.defined() ? c1_.raw() : nullptr; }

 protected:
  std::vector<float> step_scalars(int64_t t, float lr) const override;
  void update_from_table(Context& ctx, const float* table, const int32_t* cursor, int width) override;
  void on_skip_flag(Context& ctx) override;
  void prepare_steps(Context& ctx, int64_t last_step) override;

 private:
  // Under a skip flag (CUDA): step t's 1 - beta1^t as a double (two i32 elements each: tensors
  // have no f64) and sqrt(1 - beta2^t) as a float, rows t = 1.., computed on the host by
  // step_scalars' expressions; the kernel divides lr by the first in double, as the host does.
  void ensure_corrections(Context& ctx, int64_t steps);
  void update_counted(Context& ctx, float lr, const float* table, const int32_t* cursor, int width);
  AdamOptions o_;
  std::vector<Tensor> m_, v_;
  Tensor updates_;                 // under a skip flag: updates applied (i32 {1})
  Tensor c1_, bias2_sqrt_;         // and their bias corrections by update count (CUDA)
};

enum class LrSchedule { Constant, Step, Cosine, OneCycle };
LrSchedule parse_lr_schedule(const std::string& s);  // constant|step|cosine|onecycle, else Error
const char* lr_schedule_name(LrSchedule s);

// Learning rate at a point of training measured in epochs (0-based, fractional: 2.5 is half-way
// through the third epoch), evaluated per step. step: divided by 10 at each milestone epoch (the
// paper's 50 and 100 by default), constant within an epoch; cosine: base * (1 + cos(pi * t /
// total)) / 2, falling smoothly to zero at the end of the last epoch; onecycle: base * (total -
// t) / total, the linear decay of the fast CIFAR recipes (with a warm-up: one cycle up and down).
// warmup_epochs w > 0 (any schedule): for t < w the rate rises linearly, base * t / w (0 at the
// first step); cosine and onecycle then decay over the remaining total - w epochs, constant and
// step continue as without it. Throws Error unless 0 <= w < total_epochs.
float lr_at(LrSchedule s, float base, double epoch, int total_epochs,
            const std::vector<int>& milestones = {50, 100}, double warmup_epochs = 0);

}  // namespace ditto
