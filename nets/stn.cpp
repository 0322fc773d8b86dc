// stn: the spatial transformer classifier of PyTorch's spatial-transformer tutorial (Jaderberg et
// al., 2015) on rotated and translated digits (nets/nets.h describes it).
#include <fmt/format.h>

#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/grid_sample.h"
#include "nets/detail/tasks.h"

namespace ditto::tasks {
namespace {

class Stn : public TaskNet {
 public:
  static constexpr int kCanvas = 40;   // the input side (datasets/dataset.h kStnCanvas)
  static constexpr int kSampled = 28;  // the side the transformer samples for the classifier

  Stn(Context& ctx, const NetConfig& cfg)
      : TaskNet({cfg.in_channels, kCanvas, kCanvas, "the rotated and translated digits, mnist-rt"}),
        loc_conv1_(add_conv(ctx, "loc.conv1", cfg.in_channels, 8, 7, 1, 0, true, Init::HeUniform)),
        loc_pool1_(add_max_pool("loc.pool1", 2, 2, 0)),
        loc_conv2_(add_conv(ctx, "loc.conv2", 8, 10, 5, 1, 0, true, Init::HeUniform)),
        loc_pool2_(add_max_pool("loc.pool2", 2, 2, 0)),
        loc_fc1_(add_linear(ctx, "loc.fc1", 10 * 6 * 6, 32, Init::HeUniform)),
        loc_fc2_(add_linear(ctx, "loc.fc2", 32, 6, Init::Zeros)),
        cls_conv1_(add_conv(ctx, "cls.conv1", cfg.in_channels, 10, 5, 1, 0, true, Init::HeUniform)),
        cls_pool1_(add_max_pool("cls.pool1", 2, 2, 0)),
        cls_conv2_(add_conv(ctx, "cls.conv2", 10, 20, 5, 1, 0, true, Init::HeUniform)),
        cls_pool2_(add_max_pool("cls.pool2", 2, 2, 0)),
        cls_fc1_(add_linear(ctx, "cls.fc1", 20 * 4 * 4, 50, Init::HeUniform)),
        cls_fc2_(add_linear(ctx, "cls.fc2", 50, cfg.num_classes, Init::HeUniform)) {
    add_knob_layer("affine_grid", op::affine_grid);
    add_knob_layer("grid_sample", op::grid_sample);
  }
  std::string name() const override { return "stn"; }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool /*training*/, SummaryTrace* trace) override {
    const int64_t n = x.shape()[0];
    // Localization: where the digit is and how it is turned, as a 2x3 affine map.
    Var h = relu(ctx, loc_pool1_(ctx, loc_conv1_(ctx, x, trace), trace));
    h = relu(ctx, loc_pool2_(ctx, loc_conv2_(ctx, h, trace), trace));
    h = zoo::traced(trace, "loc.relu3", "relu", relu(ctx, loc_fc1_(ctx, flatten(ctx, h), trace)));
    Var theta = reshaped(ctx, loc_fc2_(ctx, h, trace), {n, 2, 3}, "stn theta");
    // The transformer: sample the input where the map sends a 28x28 grid.
    Var grid = zoo::traced(trace, "affine_grid", "affine_grid", affine_grid(ctx, "affine_grid", theta, kSampled, kSampled, true));
    Var xs = zoo::traced(trace, "grid_sample", "grid_sample", grid_sample(ctx, "grid_sample", x, grid, true));
    // The classifier on the transformed image.
    h = relu(ctx, cls_pool1_(ctx, cls_conv1_(ctx, xs, trace), trace));
    h = relu(ctx, cls_pool2_(ctx, cls_conv2_(ctx, h, trace), trace));
    h = zoo::traced(trace, "cls.relu3", "relu", relu(ctx, cls_fc1_(ctx, flatten(ctx, h), trace)));
    return cls_fc2_(ctx, h, trace);
  }

 public:
  // PyTorch's default init everywhere, except the last localization layer, which starts at the
  // identity map (weight 0, bias 1 0 0 0 1 0) as the tutorial and the paper start it.
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { init_conv_torch_default(ctx, c, seed); }, [](BatchNorm2d&) {},
               [&](Linear& fc) { init_linear_torch_default(ctx, fc, seed); });
    fill(ctx, loc_fc2_.weight.value(), 0.0f);
    Tensor identity = Context().from_host(std::vector<float>{1, 0, 0, 0, 1, 0}, {6});
    ctx.copy(loc_fc2_.bias.value(), identity);
  }

 private:
  Conv2d& loc_conv1_;
  MaxPool2d& loc_pool1_;
  Conv2d& loc_conv2_;
  MaxPool2d& loc_pool2_;
  Linear& loc_fc1_;
  Linear& loc_fc2_;
  Conv2d& cls_conv1_;
  MaxPool2d& cls_pool1_;
  Conv2d& cls_conv2_;
  MaxPool2d& cls_pool2_;
  Linear& cls_fc1_;
  Linear& cls_fc2_;
};

}  // namespace

std::unique_ptr<Net> make_stn(Context& ctx, const NetConfig& cfg) { return std::make_unique<Stn>(ctx, cfg); }

}  // namespace ditto::tasks
