// Layers with named parameters, and the Net interface every network implements.
//
// Names are stable ("conv1.weight", "layer2.0.bn1.running_var") because the policy, the
// manifest, the initial-weight RNG streams and checkpoint tensors are all keyed by them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/context.h"
#include "engine/param.h"
#include "engine/policy.h"
#include "engine/task_kind.h"
#include "kernels/batchnorm.h"
#include "kernels/conv2d.h"
#include "kernels/pool.h"

namespace ditto {

// The knob layers of a task's loss, which the training step runs on the net's output
// (experiments/task_scoring.h) and a net lists last among its knob layers: "loss" (softmax_xent,
// pixel_xent or ctc_loss) and, for sequences, "loss_mean" (reduce: the batch mean of the
// per-sequence CTC costs).
std::vector<std::pair<std::string, OpKind>> task_loss_layers(Task t);

enum class Init { GlorotUniform, GlorotNormal, HeUniform, HeNormal, Zeros, Ones };
const char* init_name(Init i);

// One row of a network summary.
struct SummaryRow {
  std::string name, op;
  Shape output;
  int64_t params = 0;
};

// Optional trace a Net fills while it runs (for --summary).
using SummaryTrace = std::vector<SummaryRow>;

// groups > 1: a grouped convolution (weight [out, in/groups, k, k]; group g maps input channels
// g*in/groups .. to output channels g*out/groups ..); groups == in_channels is depthwise.
// in_channels and out_channels must be divisible by groups (else ShapeError naming the layer).
class Conv2d {
 public:
  Conv2d(Context& ctx, std::string name, int in_channels, int out_channels, int kernel, int stride = 1,
         int padding = 0, bool bias = true, Init init = Init::GlorotUniform, int groups = 1);
  // A kernel_h x kernel_w kernel with padding pad_h (rows) and pad_w (columns): Inception-v3's
  // 1x7 / 7x1 and 1x3 / 3x1 convolutions. The square constructor is this one with equal sides.
  Conv2d(Context& ctx, std::string name, int in_channels, int out_channels, int kernel_h, int kernel_w, int stride,
         int pad_h, int pad_w, bool bias, Init init, int groups = 1);
  Var operator()(Context& ctx, const Var& x, SummaryTrace* trace = nullptr) const;
  void collect(std::vector<Param>& params) const;
  const std::string& name() const { return name_; }
  Init init() const { return init_; }
  int groups() const { return p_.groups; }
  Var weight, bias;

 private:
  std::string name_;
  Conv2dParams p_;
  Init init_;
};

class Linear {
 public:
  Linear(Context& ctx, std::string name, int in_features, int out_features, bool bias = true,
         Init init = Init::GlorotUniform);
  Var operator()(Context& ctx, const Var& x, SummaryTrace* trace = nullptr) const;
  void collect(std::vector<Param>& params) const;
  const std::string& name() const { return name_; }
  Var weight, bias;

 private:
  std::string name_;
  Init init_;
};

class BatchNorm2d {
 public:
  BatchNorm2d(Context& ctx, std::string name, int channels, float momentum = 0.1f, float eps = 1e-5f);
  Var operator()(Context& ctx, const Var& x, bool training, SummaryTrace* trace = nullptr);
  void collect(std::vector<Param>& params) const;
  void collect(std::vector<Buffer>& buffers);
  const std::string& name() const { return name_; }
  Var gamma, beta;
  BatchNormState state;

 private:
  std::string name_;
  float momentum_, eps_;
};

class MaxPool2d {
 public:
  MaxPool2d(std::string name, int kernel, int stride, int padding = 0);
  Var operator()(Context& ctx, const Var& x, SummaryTrace* trace = nullptr) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  PoolParams p_;
};

// Inverted dropout (kernels/dropout.h). The layer's name is part of its mask key, so two dropout
// layers of one net draw independent masks, and the same (seed, step) replays the same masks.
// Evaluation (training == false) is the identity.
class Dropout {
 public:
  Dropout(std::string name, float p);
  Var operator()(Context& ctx, const Var& x, bool training, uint64_t seed, int64_t step,
                 SummaryTrace* trace = nullptr) const;
  const std::string& name() const { return name_; }
  float p() const { return p_; }

 private:
  std::string name_;
  float p_;
};

// What a network accepts: a batch N x channels x H x W (or N x fields of category ids, below) with N >= 1 and min_side <= H, W (and
// H, W <= max_side when max_side > 0). min_side is the smallest side at which every layer still
// has an output (or the reference's own minimum); `why` says where the bounds come from.
struct InputSpec {
  int channels = 3;
  int min_side = 1;
  int max_side = 0;  // 0: no upper bound
  std::string why;
  // A net of category ids takes N x channels instead (channels: the number of fields, 0 for any;
  // the sides do not apply).
  bool categorical = false;
};

// A network: layers with stable names, a forward pass, and what trainers need around it.
class Net {
 public:
  explicit Net(InputSpec input) : input_(std::move(input)) {}
  virtual ~Net() = default;
  virtual std::string name() const = 0;
  const InputSpec& input_spec() const { return input_; }
  // Throws ShapeError naming the net, the shape and what the net takes when an input of shape x
  // does not fit input_spec(): so a trainer or benchmark can check its data before any step.
  void check_input(const Shape& x) const;
  // logits [N, classes]; for the other task kinds what task() says (engine/task_kind.h). Checks x
  // (check_input) before any op runs, then calls forward_impl.
  Var forward(Context& ctx, const Var& x, bool training, SummaryTrace* trace = nullptr);
  // What the output means, so which loss and scores a trainer applies (experiments/task_scoring.h).
  virtual Task task() const { return Task::Classification; }
  // True for a net that takes category ids (i32 {N, fields}, a categorical Dataset) instead of images.
  bool categorical_input() const { return input_.categorical; }
  virtual std::vector<Param> params() = 0;
  virtual std::vector<Buffer> buffers() { return {}; }
  // Layers that have policy knobs, with their op kinds (for Policy::check_layers). The loss is
  // the layer "loss".
  virtual std::vector<std::pair<std::string, OpKind>> knob_layers() const = 0;
  // Initial weights: each parameter from its own Philox stream keyed by (seed_init, name), so
  // adding a layer does not shift the others' initial weights. Buffers are reset.
  virtual void init(Context& ctx, uint64_t seed_init) = 0;
  // Nets with stochastic layers (dropout) draw them from Philox keyed by (seed, step, layer):
  // the trainer calls this before each training step's forward. A net without any ignores it.
  virtual void begin_step(uint64_t seed, int64_t step) { (void)seed, (void)step; }
  // True when begin_step matters: such a step differs from step to step, so it cannot be
  // replayed from one CUDA graph.
  virtual bool stochastic() const { return false; }
  int64_t param_count();

 protected:
  // The forward pass proper, on an input check_input accepted.
  virtual Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) = 0;

 private:
  InputSpec input_;
};

// Fills t (any device) from the Philox stream keyed by (seed, name) with the given rule for a
// tensor of the given fans. Values are drawn on the host, so CPU and GPU get the same bits.
void init_tensor(Context& ctx, Tensor& t, Init rule, int64_t fan_in, int64_t fan_out, uint64_t seed,
                 const std::string& name);

// Prints the summary table (name, op, output shape, parameters) and the total.
std::string format_summary(const SummaryTrace& rows, int64_t total_params);

}  // namespace ditto
