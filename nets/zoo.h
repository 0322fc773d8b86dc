// The network builder every ditto net is made with, and the initial-weight rules of the
// references it follows. A net derives from ZooNet and creates its layers through add_conv /
// add_bn / add_linear / add_max_pool / add_dropout in the order of its reference's state_dict;
// params(), buffers(), knob_layers() and stochastic() then come from that one list, so they
// cannot disagree with each other or with the layers the forward pass runs. A net writes its
// name(), forward_impl() and init(); Net::forward checks the input against the InputSpec the
// net passes to ZooNet before forward_impl runs.
//
//   class Tiny : public ditto::zoo::ZooNet {
//    public:
//     Tiny(ditto::Context& ctx, int classes)
//         : ZooNet({3, 1, 0, ""}),
//           conv_(add_conv(ctx, "conv1", 3, 8, 3, 1, 1, true, ditto::Init::GlorotUniform)),
//           fc_(add_linear(ctx, "fc", 8, classes, ditto::Init::GlorotUniform)) {}
//     std::string name() const override { return "tiny"; }
//     void init(ditto::Context& ctx, uint64_t seed) override {  // or each_layer with other rules
//       init_keras(ctx, seed);
//     }
//    protected:
//     ditto::Var forward_impl(ditto::Context& ctx, const ditto::Var& x, bool, ditto::SummaryTrace* t) override {
//       return fc_(ctx, ditto::global_avg_pool(ctx, ditto::relu(ctx, conv_(ctx, x, t))), t);
//     }
//    private:
//     ditto::Conv2d& conv_;
//     ditto::Linear& fc_;
//   };
//
// make_net (nets/nets.h) builds the named networks of nets/small.cpp, resnet.cpp, vgg.cpp,
// densenet.cpp, mobilenet.cpp and inception.cpp this way; nets.h documents each of them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nets/module.h"

namespace ditto::zoo {

// Appends a summary row for an op without parameters; returns y.
inline Var traced(SummaryTrace* trace, const std::string& name, const std::string& op, Var y) {
  if (trace) trace->push_back({name, op, y.shape(), 0});
  return y;
}

// A network whose layers are created through it and listed in creation order, which is the
// order of the reference's state_dict: params() and buffers() follow it, and knob_layers() is
// one entry per conv, batch norm, linear and max pool in creation order, then "loss" (a max pool
// created later than the layers around it in the forward pass is listed where it was created).
// Layers live in unique_ptrs: the references the add_* calls return stay valid for the net's life.
class ZooNet : public Net {
 public:
  explicit ZooNet(InputSpec input) : Net(std::move(input)) {}
  std::vector<Param> params() override;
  std::vector<Buffer> buffers() override;
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override;
  void begin_step(uint64_t seed, int64_t step) override {
    seed_ = seed;
    step_ = step;
  }
  // True when a dropout was added or the net draws other masks (mark_stochastic).
  bool stochastic() const override { return stochastic_; }

 protected:
  Conv2d& add_conv(Context& ctx, std::string name, int in, int out, int kernel, int stride, int padding, bool bias,
                   Init init, int groups = 1);
  Conv2d& add_conv(Context& ctx, std::string name, int in, int out, int kernel_h, int kernel_w, int stride, int pad_h,
                   int pad_w, bool bias, Init init);
  BatchNorm2d& add_bn(Context& ctx, std::string name, int channels, float momentum = 0.1f, float eps = 1e-5f);
  Linear& add_linear(Context& ctx, std::string name, int in, int out, Init init);
  MaxPool2d& add_max_pool(std::string name, int kernel, int stride, int padding);
  // Dropout has no parameters or knobs; adding one makes the net stochastic. Its masks are keyed
  // by (seed_, step_, name): pass seed_ and step_ when calling it.
  Dropout& add_dropout(std::string name, float p);
  // For masks drawn without a Dropout layer (stochastic_depth).
  void mark_stochastic() { stochastic_ = true; }
  // Keras's default initializers, for nets that follow a Keras reference: glorot-uniform conv
  // kernels (init_conv_glorot; depthwise ones too) and dense kernels (init_linear_glorot), zero
  // biases, batch norm gamma 1, beta 0, moving mean 0, moving variance 1.
  void init_keras(Context& ctx, uint64_t seed);

  // Visits every conv, batch norm and linear in creation order (init uses it).
  template <class OnConv, class OnBn, class OnLinear>
  void each_layer(OnConv&& on_conv, OnBn&& on_bn, OnLinear&& on_linear) {
    for (const Entry& e : order_) {
      if (e.conv) on_conv(*e.conv);
      if (e.bn) on_bn(*e.bn);
      if (e.fc) on_linear(*e.fc);
    }
  }

  uint64_t seed_ = 0;  // from begin_step: the key of dropout / stochastic-depth masks with the step
  int64_t step_ = 0;   // and the layer name

 private:
  struct Entry {
    Conv2d* conv = nullptr;
    BatchNorm2d* bn = nullptr;
    Linear* fc = nullptr;
    MaxPool2d* pool = nullptr;
  };
  std::vector<Entry> order_;
  std::vector<std::unique_ptr<Conv2d>> convs_;
  std::vector<std::unique_ptr<BatchNorm2d>> bns_;
  std::vector<std::unique_ptr<Linear>> fcs_;
  std::vector<std::unique_ptr<MaxPool2d>> pools_;
  std::vector<std::unique_ptr<Dropout>> dropouts_;
  bool stochastic_ = false;
};

// torchvision's StochasticDepth(p, "row") (EfficientNet's MBConv), made replayable: in training
// each sample's residual branch is kept with probability 1 - p and scaled by the float
// 1 / (1 - p), else zeroed. Sample n draws exactly what element n of a dropout mask of the same
// layer would (kernels/dropout.h): Philox keyed by dropout_key(seed, step, layer), counter n / 4,
// lane n % 4, dropped when philox_uniform(bits) < p. The N draws are made on the host and applied
// as a constant (N, C, 1, 1) scale through channel_mul (deterministic, kernels/concat.h), so CPU
// and GPU apply the same mask bit for bit and a step replays exactly. Evaluation and p = 0 return
// x itself.
Var stochastic_depth(Context& ctx, const std::string& layer, const Var& x, float p, bool training, uint64_t seed,
                     int64_t step, SummaryTrace* trace = nullptr);

// Keras's BatchNormalization defaults in ditto's terms: Keras's momentum 0.99 is the weight of the
// OLD moving average; ditto's momentum (PyTorch's convention) weighs the new batch: 1 - 0.99.
constexpr float kKerasBnMomentum = 0.01f, kKerasBnEps = 1e-3f;

// ---- Initial weights by the references' rules, from the same Philox streams as init_tensor ----
// Each draws from the stream keyed by (seed, "<layer>.weight") / (seed, "<layer>.bias"); a bias
// the rule does not name is zero.

// kaiming_normal_(mode="fan_in", relu gain): std sqrt(2 / (in/groups * kernel area)).
void init_conv_he_fan_in(Context& ctx, Conv2d& c, uint64_t seed);
// kaiming_normal_(mode="fan_out", relu gain): std sqrt(2 / (out * kernel area)), PyTorch's fan_out
// (weight dim 0 times kernel area, also for grouped convs).
void init_conv_he_fan_out(Context& ctx, Conv2d& c, uint64_t seed);
// Glorot uniform from Keras's fans (in/groups * kernel area, out * kernel area). Keras's
// depthwise kernel (kh, kw, in, 1) has fans (kh*kw*in, kh*kw), ditto's weight (in, 1, kh, kw) the
// swapped pair: glorot is symmetric in them.
void init_conv_glorot(Context& ctx, Conv2d& c, uint64_t seed);
// Glorot uniform from (in_features, out_features): Keras's Dense.
void init_linear_glorot(Context& ctx, Linear& fc, uint64_t seed);
// normal(0, stddev): torchvision's VGG and MobileNet-v2 classifiers (0.01).
void init_linear_normal(Context& ctx, Linear& fc, double stddev, uint64_t seed);
// uniform(-bound, bound) for the weight, and for the bias too when bias_too (PyTorch's default
// nn.Linear init with bound 1/sqrt(in_features)), else a zero bias.
void init_linear_uniform(Context& ctx, Linear& fc, double bound, bool bias_too, uint64_t seed);
// normal(0, stddev) for one tensor. init_tensor has no fixed-std normal; Init::HeNormal with
// fan_in 2 / stddev^2 has std sqrt(2 / fan_in) = stddev, the same rule.
void init_weight_normal(Context& ctx, const std::string& name, Var& weight, double stddev, uint64_t seed);
// uniform(-bound, bound) for one tensor; Init::HeUniform's limit sqrt(6 / fan_in) with
// fan_in = 6 / bound^2.
void init_uniform(Context& ctx, const std::string& name, Var& v, double bound, uint64_t seed);
// Batch norm's start: gamma 1, beta 0, running mean 0, running variance 1.
void reset_bn(Context& ctx, BatchNorm2d& bn);

}  // namespace ditto::zoo
