#include "nets/zoo.h"

#include <cmath>

#include "engine/tensor_ops.h"
#include "kernels/linear.h"
#include "kernels/loss.h"

namespace ditto::zoo {

std::vector<Param> ZooNet::params() {
  std::vector<Param> p;
  for (const Entry& e : order_) {
    if (e.conv) e.conv->collect(p);
    if (e.bn) e.bn->collect(p);
    if (e.fc) e.fc->collect(p);
  }
  return p;
}

std::vector<Buffer> ZooNet::buffers() {
  std::vector<Buffer> b;
  for (const Entry& e : order_)
    if (e.bn) e.bn->collect(b);
  return b;
}

std::vector<std::pair<std::string, OpKind>> ZooNet::knob_layers() const {
  std::vector<std::pair<std::string, OpKind>> l;
  for (const Entry& e : order_) {
    if (e.conv) l.push_back({e.conv->name(), op::conv2d});
    if (e.bn) l.push_back({e.bn->name(), op::batchnorm});
    if (e.fc) l.push_back({e.fc->name(), op::linear});
    if (e.pool) l.push_back({e.pool->name(), op::maxpool2d});
  }
  l.push_back({"loss", op::softmax_xent});
  return l;
}

Conv2d& ZooNet::add_conv(Context& ctx, std::string name, int in, int out, int kernel, int stride, int padding,
                         bool bias, Init init, int groups) {
  convs_.push_back(
      std::make_unique<Conv2d>(ctx, std::move(name), in, out, kernel, stride, padding, bias, init, groups));
  order_.push_back({convs_.back().get(), nullptr, nullptr, nullptr});
  return *convs_.back();
}

Conv2d& ZooNet::add_conv(Context& ctx, std::string name, int in, int out, int kernel_h, int kernel_w, int stride,
                         int pad_h, int pad_w, bool bias, Init init) {
  convs_.push_back(
      std::make_unique<Conv2d>(ctx, std::move(name), in, out, kernel_h, kernel_w, stride, pad_h, pad_w, bias, init));
  order_.push_back({convs_.back().get(), nullptr, nullptr, nullptr});
  return *convs_.back();
}

BatchNorm2d& ZooNet::add_bn(Context& ctx, std::string name, int channels, float momentum, float eps) {
  bns_.push_back(std::make_unique<BatchNorm2d>(ctx, std::move(name), channels, momentum, eps));
  order_.push_back({nullptr, bns_.back().get(), nullptr, nullptr});
  return *bns_.back();
}

Linear& ZooNet::add_linear(Context& ctx, std::string name, int in, int out, Init init) {
  fcs_.push_back(std::make_unique<Linear>(ctx, std::move(name), in, out, true, init));
  order_.push_back({nullptr, nullptr, fcs_.back().get(), nullptr});
  return *fcs_.back();
}

MaxPool2d& ZooNet::add_max_pool(std::string name, int kernel, int stride, int padding) {
  pools_.push_back(std::make_unique<MaxPool2d>(std::move(name), kernel, stride, padding));
  order_.push_back({nullptr, nullptr, nullptr, pools_.back().get()});
  return *pools_.back();
}

Dropout& ZooNet::add_dropout(std::string name, float p) {
  dropouts_.push_back(std::make_unique<Dropout>(std::move(name), p));
  stochastic_ = true;
  return *dropouts_.back();
}

void ZooNet::init_keras(Context& ctx, uint64_t seed) {
  each_layer([&](Conv2d& c) { init_conv_glorot(ctx, c, seed); }, [&](BatchNorm2d& bn) { reset_bn(ctx, bn); },
             [&](Linear& fc) { init_linear_glorot(ctx, fc, seed); });
}

namespace {
template <class Layer>
void zero_bias(Context& ctx, Layer& l, uint64_t seed) {
  if (l.bias.defined()) init_tensor(ctx, l.bias.value(), Init::Zeros, 0, 0, seed, l.name() + ".bias");
}
}  // namespace

void init_conv_he_fan_in(Context& ctx, Conv2d& c, uint64_t seed) {
  const Shape& s = c.weight.value().shape();
  init_tensor(ctx, c.weight.value(), Init::HeNormal, s[1] * s[2] * s[3], 0, seed, c.name() + ".weight");
  zero_bias(ctx, c, seed);
}

void init_conv_he_fan_out(Context& ctx, Conv2d& c, uint64_t seed) {
  const Shape& s = c.weight.value().shape();
  // Init::HeNormal draws std sqrt(2 / fan_in) from its fan_in argument: pass the fan-out there.
  init_tensor(ctx, c.weight.value(), Init::HeNormal, s[0] * s[2] * s[3], 0, seed, c.name() + ".weight");
  zero_bias(ctx, c, seed);
}

void init_conv_glorot(Context& ctx, Conv2d& c, uint64_t seed) {
  const Shape& s = c.weight.value().shape();
  init_tensor(ctx, c.weight.value(), Init::GlorotUniform, s[1] * s[2] * s[3], s[0] * s[2] * s[3], seed,
              c.name() + ".weight");
  zero_bias(ctx, c, seed);
}

void init_linear_glorot(Context& ctx, Linear& fc, uint64_t seed) {
  const Shape& s = fc.weight.value().shape();
  init_tensor(ctx, fc.weight.value(), Init::GlorotUniform, s[1], s[0], seed, fc.name() + ".weight");
  zero_bias(ctx, fc, seed);
}

void init_linear_normal(Context& ctx, Linear& fc, double stddev, uint64_t seed) {
  init_weight_normal(ctx, fc.name() + ".weight", fc.weight, stddev, seed);
  zero_bias(ctx, fc, seed);
}

void init_linear_uniform(Context& ctx, Linear& fc, double bound, bool bias_too, uint64_t seed) {
  init_uniform(ctx, fc.name() + ".weight", fc.weight, bound, seed);
  if (bias_too && fc.bias.defined()) init_uniform(ctx, fc.name() + ".bias", fc.bias, bound, seed);
  else zero_bias(ctx, fc, seed);
}

void init_weight_normal(Context& ctx, const std::string& name, Var& weight, double stddev, uint64_t seed) {
  const int64_t fan_in = std::llround(2.0 / (stddev * stddev));
  init_tensor(ctx, weight.value(), Init::HeNormal, fan_in, 0, seed, name);
}

void init_uniform(Context& ctx, const std::string& name, Var& v, double bound, uint64_t seed) {
  const int64_t fan_in = std::llround(6.0 / (bound * bound));
  init_tensor(ctx, v.value(), Init::HeUniform, fan_in, 0, seed, name);
}

void reset_bn(Context& ctx, BatchNorm2d& bn) {
  fill(ctx, bn.gamma.value(), 1.0f);
  fill(ctx, bn.beta.value(), 0.0f);
  fill(ctx, bn.state.running_mean, 0.0f);
  fill(ctx, bn.state.running_var, 1.0f);
}

}  // namespace ditto::zoo
