// ctc-cnn: a convolutional CTC recognizer of digit strings (nets/nets.h describes it).
#include <fmt/format.h>

#include <map>
#include <tuple>

#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/scatter.h"
#include "nets/detail/tasks.h"

namespace ditto::tasks {
namespace {

class CtcCnn : public TaskNet {
 public:
  CtcCnn(Context& ctx, const NetConfig& cfg)
      : TaskNet({cfg.in_channels, 8, 0, "three 2x2 pools; the height must also be 24 to 31"}),
        conv1_(add_conv(ctx, "conv1", cfg.in_channels, 32, 3, 1, 1, true, Init::HeNormal)),
        pool1_(add_max_pool("pool1", 2, 2, 0)),
        conv2_(add_conv(ctx, "conv2", 32, 64, 3, 1, 1, true, Init::HeNormal)),
        pool2_(add_max_pool("pool2", 2, 2, 0)),
        conv3_(add_conv(ctx, "conv3", 64, 96, 3, 1, 1, true, Init::HeNormal)),
        pool3_(add_max_pool("pool3", 2, 2, 0)),
        conv4_(add_conv(ctx, "conv4", 96, 128, 3, 1, 1, 0, 0, true, Init::HeNormal)),
        head_(add_conv(ctx, "head", 128, cfg.num_classes, 1, 1, 0, true, Init::HeNormal)) {
    add_knob_layer("time_major", op::embedding);
  }
  std::string name() const override { return "ctc-cnn"; }
  Task task() const override { return Task::Sequence; }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool /*training*/, SummaryTrace* trace) override {
    if (x.shape()[2] < 24 || x.shape()[2] > 31 || x.shape()[3] < 8)
      throw ShapeError(fmt::format("ctc-cnn: input {} needs a height of 24 to 31 and a width of at least 8",
                                   shape_str(x.shape())));
    Var h = x;
    int i = 1;
    for (auto [conv, pool] : {std::pair{&conv1_, &pool1_}, std::pair{&conv2_, &pool2_}, std::pair{&conv3_, &pool3_}}) {
      h = zoo::traced(trace, fmt::format("relu{}", i++), "relu", relu(ctx, (*conv)(ctx, h, trace)));
      h = (*pool)(ctx, h, trace);
    }
    h = zoo::traced(trace, "relu4", "relu", relu(ctx, conv4_(ctx, h, trace)));  // {N, 128, 1, T}: one column per step
    Var logits = head_(ctx, h, trace);                                         // {N, A, 1, T}
    // CTC takes time-major logits {T, N, A}: a gather of the N*A*T values in that order. Each value
    // is read once, so the backward scatter-add (the layer's `scatter` knob) adds one term per
    // destination: its atomic and sorted variants give the same bits.
    const int64_t n = logits.shape()[0], a = logits.shape()[1], t = logits.shape()[3];
    Tensor& index = time_major_[std::make_tuple(n, a, t)];
    if (!index.defined()) index = ctx.from_host(time_major_index(n, a, t), {t, n, a});
    Var table = reshaped(ctx, logits, {n * a * t, 1}, "ctc-cnn logits");
    Var y = zoo::traced(trace, "time_major", "embedding", embedding(ctx, "time_major", table, index));
    return reshaped(ctx, y, {t, n, a}, "ctc-cnn time-major logits");
  }

 public:
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { zoo::init_conv_he_fan_in(ctx, c, seed); }, [](BatchNorm2d&) {}, [](Linear&) {});
  }

 private:
  Conv2d& conv1_;
  MaxPool2d& pool1_;
  Conv2d& conv2_;
  MaxPool2d& pool2_;
  Conv2d& conv3_;
  MaxPool2d& pool3_;
  Conv2d& conv4_;
  Conv2d& head_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Tensor> time_major_;  // gather indices per shape, on the device
};

}  // namespace

std::unique_ptr<Net> make_ctc_cnn(Context& ctx, const NetConfig& cfg) { return std::make_unique<CtcCnn>(ctx, cfg); }

}  // namespace ditto::tasks
