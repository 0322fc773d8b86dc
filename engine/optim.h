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

 protected:
  explicit Optimizer(std::vector<Param> params) : params_(std::move(params)) {}
  std::vector<Param> params_;
  int64_t steps_ = 0;
};

class Sgd : public Optimizer {
 public:
  Sgd(Context& ctx, std::vector<Param> params, SgdOptions opts);
  std::string name() const override { return "sgd"; }
  void step(Context& ctx, float lr) override;
  std::vector<Buffer> state() override;

 private:
  SgdOptions o_;
  std::vector<Tensor> momentum_;
};

class Adam : public Optimizer {
 public:
  Adam(Context& ctx, std::vector<Param> params, AdamOptions opts);
  std::string name() const override { return "adam"; }
  void step(Context& ctx, float lr) override;
  std::vector<Buffer> state() override;

 private:
  AdamOptions o_;
  std::vector<Tensor> m_, v_;
};

enum class LrSchedule { Constant, Step, Cosine };
LrSchedule parse_lr_schedule(const std::string& s);  // constant|step|cosine, else Error
const char* lr_schedule_name(LrSchedule s);

// Learning rate at a point of training measured in epochs (0-based, fractional: 2.5 is half-way
// through the third epoch). step: divided by 10 at each milestone epoch (the paper's 50 and 100
// by default), constant within an epoch; cosine: base * (1 + cos(pi * t / total)) / 2, evaluated
// per step so the rate falls smoothly to zero at the end of the last epoch.
float lr_at(LrSchedule s, float base, double epoch, int total_epochs,
            const std::vector<int>& milestones = {50, 100});

}  // namespace ditto
