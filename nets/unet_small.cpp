// unet-small: a small encoder-decoder for segmentation (nets/nets.h describes it).
#include <fmt/format.h>

#include "engine/error.h"
#include "kernels/activation.h"
#include "kernels/concat.h"
#include "kernels/upsample.h"
#include "nets/detail/tasks.h"

namespace ditto::tasks {
namespace {

class UnetSmall : public TaskNet {
 public:
  UnetSmall(Context& ctx, const NetConfig& cfg)
      : TaskNet({cfg.in_channels, 4, 0, "two 2x2 pools"}),
        enc1_(add_conv(ctx, "enc1", cfg.in_channels, 16, 3, 1, 1, true, Init::HeNormal)),
        pool1_(add_max_pool("pool1", 2, 2, 0)),
        enc2_(add_conv(ctx, "enc2", 16, 32, 3, 1, 1, true, Init::HeNormal)),
        pool2_(add_max_pool("pool2", 2, 2, 0)),
        mid_(add_conv(ctx, "mid", 32, 64, 3, 1, 1, true, Init::HeNormal)),
        dec2_(add_conv(ctx, "dec2", 64 + 32, 32, 3, 1, 1, true, Init::HeNormal)),
        dec1_(add_conv(ctx, "dec1", 32 + 16, 16, 3, 1, 1, true, Init::HeNormal)),
        head_(add_conv(ctx, "head", 16, cfg.num_classes, 1, 1, 0, true, Init::HeNormal)) {
    add_knob_layer("up2", op::upsample);
    add_knob_layer("up1", op::upsample);
  }
  std::string name() const override { return "unet-small"; }
  Task task() const override { return Task::Segmentation; }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool /*training*/, SummaryTrace* trace) override {
    Var e1 = zoo::traced(trace, "relu1", "relu", relu(ctx, enc1_(ctx, x, trace)));
    Var e2 = zoo::traced(trace, "relu2", "relu", relu(ctx, enc2_(ctx, pool1_(ctx, e1, trace), trace)));
    Var m = zoo::traced(trace, "relu3", "relu", relu(ctx, mid_(ctx, pool2_(ctx, e2, trace), trace)));
    // Each decoder stage upsamples to its skip's size (exactly 2x for even sides, and odd sides
    // still line up), then reads the upsampled map and the skip side by side.
    Var u2 = up(ctx, "up2", m, e2, UpsampleMode::Bilinear, trace);
    Var d2 = zoo::traced(trace, "relu4", "relu", relu(ctx, dec2_(ctx, concat_channels(ctx, {u2, e2}), trace)));
    Var u1 = up(ctx, "up1", d2, e1, UpsampleMode::Nearest, trace);
    Var d1 = zoo::traced(trace, "relu5", "relu", relu(ctx, dec1_(ctx, concat_channels(ctx, {u1, e1}), trace)));
    return head_(ctx, d1, trace);
  }

 public:
  // Kaiming-normal (fan_in) convs, zero biases: the U-Net paper's rule.
  void init(Context& ctx, uint64_t seed) override {
    each_layer([&](Conv2d& c) { zoo::init_conv_he_fan_in(ctx, c, seed); }, [](BatchNorm2d&) {}, [](Linear&) {});
  }

 private:
  static Var up(Context& ctx, const std::string& layer, const Var& x, const Var& like, UpsampleMode mode,
                SummaryTrace* trace) {
    UpsampleParams p;
    p.mode = mode;
    p.out_h = like.shape()[2];
    p.out_w = like.shape()[3];
    return zoo::traced(trace, layer, fmt::format("upsample_{}", upsample_mode_name(mode)), upsample2d(ctx, layer, x, p));
  }

  Conv2d& enc1_;
  MaxPool2d& pool1_;
  Conv2d& enc2_;
  MaxPool2d& pool2_;
  Conv2d& mid_;
  Conv2d& dec2_;
  Conv2d& dec1_;
  Conv2d& head_;
};

}  // namespace

std::unique_ptr<Net> make_unet_small(Context& ctx, const NetConfig& cfg) { return std::make_unique<UnetSmall>(ctx, cfg); }

}  // namespace ditto::tasks
