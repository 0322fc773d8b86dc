// Internal to nets/: the model zoo's second batch (issue 10) — DenseNet (nets/densenet.cpp),
// MobileNet-v2 and EfficientNet-B0 (nets/mobilenet.cpp), Inception-v3 and Xception
// (nets/inception.cpp) — and the small base they share. nets.h documents each network; make_net
// (nets/nets.cpp) calls these factories. Not API (the install glob copies it with the other
// nets/ headers; it needs only public ones): callers use make_net. Tests reach stochastic_depth here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nets/module.h"
#include "nets/nets.h"

namespace ditto::zoo {

std::unique_ptr<Net> make_densenet(Context& ctx, const NetConfig& cfg, int depth);  // 121 or 201
std::unique_ptr<Net> make_mobilenet_v2(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_efficientnet_b0(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_inception_v3(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_xception(Context& ctx, const NetConfig& cfg);

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

// Appends a summary row for an op without parameters; returns y.
inline Var traced(SummaryTrace* trace, const std::string& name, const std::string& op, Var y) {
  if (trace) trace->push_back({name, op, y.shape(), 0});
  return y;
}

// A network whose layers are created through it and listed in the order of the reference's
// state_dict, so params(), buffers() and knob_layers() come from one list and cannot disagree.
// Layers live in unique_ptrs: the references the add_* calls return stay valid for the net's life.
class ZooNet : public Net {
 public:
  std::vector<Param> params() override;
  std::vector<Buffer> buffers() override;
  // One knob layer per conv, batch norm, linear and max pool, in creation order, then "loss".
  std::vector<std::pair<std::string, OpKind>> knob_layers() const override;
  void begin_step(uint64_t seed, int64_t step) override {
    seed_ = seed;
    step_ = step;
  }

 protected:
  Conv2d& add_conv(Context& ctx, std::string name, int in, int out, int kernel, int stride, int padding, bool bias,
                   Init init, int groups = 1);
  Conv2d& add_conv(Context& ctx, std::string name, int in, int out, int kernel_h, int kernel_w, int stride, int pad_h,
                   int pad_w, bool bias, Init init);
  BatchNorm2d& add_bn(Context& ctx, std::string name, int channels, float momentum = 0.1f, float eps = 1e-5f);
  Linear& add_linear(Context& ctx, std::string name, int in, int out, Init init);
  MaxPool2d& add_max_pool(std::string name, int kernel, int stride, int padding);

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
};

// ---- Initial weights by the references' rules, from the same Philox streams as init_tensor ----

// kaiming_normal_(mode="fan_in", relu gain): std sqrt(2 / (in/groups * kernel area)); bias zero.
void init_conv_he_fan_in(Context& ctx, Conv2d& c, uint64_t seed);
// kaiming_normal_(mode="fan_out", relu gain): std sqrt(2 / (out * kernel area)), PyTorch's fan_out
// (weight dim 0 times kernel area, also for grouped convs); bias zero.
void init_conv_he_fan_out(Context& ctx, Conv2d& c, uint64_t seed);
// Glorot uniform from Keras's fans; bias zero. Keras's depthwise kernel (kh, kw, in, 1) has fans
// (kh*kw*in, kh*kw), ditto's weight (in, 1, kh, kw) the swapped pair: glorot is symmetric in them.
void init_conv_glorot(Context& ctx, Conv2d& c, uint64_t seed);
// normal(0, stddev) for the weight (bias, if any, zero). init_tensor has no fixed-std normal;
// Init::HeNormal with fan_in 2 / stddev^2 has std sqrt(2 / fan_in) = stddev, the same rule.
void init_weight_normal(Context& ctx, const std::string& name, Var& weight, double stddev, uint64_t seed);
// uniform(-bound, bound); Init::HeUniform's limit sqrt(6 / fan_in) with fan_in = 6 / bound^2.
void init_uniform(Context& ctx, const std::string& name, Var& v, double bound, uint64_t seed);
// Batch norm's start: gamma 1, beta 0, running mean 0, running variance 1.
void reset_bn(Context& ctx, BatchNorm2d& bn);

}  // namespace ditto::zoo
