// The paper's small networks: SmallCNN (with or without batch norm), two-conv, Keras's
// mnist_cnn and MediumCNN(k) (nets.h documents them).
#include <fmt/format.h>

#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "nets/detail/families.h"
#include "nets/zoo.h"

namespace ditto::zoo {
namespace {

// The paper's plain CNNs: blocks of conv kxk ("same": padding k/2; with bias, Keras's default)
// [→ bn] → relu → maxpool 2, then a global average pool and a dense head. Layers conv1..B,
// bn1..B, pool1..B, relu1..B, gap, then fc1 → relu(B+1) → fc2 with a hidden dense layer, else fc.
// Keras's initializers (glorot-uniform kernels, zero biases). B halvings need 2^B a side.
//   smallcnn(-bn)  widths 16, 32, 32, k 3, hidden dense 32 (as in the paper's repository)
//   mediumcnn-kK   widths 16, 32, 64, 128, 256, 512, k = K, always batch norm, no hidden dense
class BlockCnn : public ZooNet {
 public:
  BlockCnn(Context& ctx, const NetConfig& cfg, std::string name, const std::vector<int>& widths, int k, bool bn,
           int hidden)
      : ZooNet({cfg.in_channels, 1 << static_cast<int>(widths.size()), 0,
                fmt::format("{} 2x2 max pools each halve the side", widths.size())}),
        name_(std::move(name)) {
    int in = cfg.in_channels;
    for (std::size_t i = 0; i < widths.size(); ++i) {
      Block b;
      b.conv = &add_conv(ctx, fmt::format("conv{}", i + 1), in, widths[i], k, 1, k / 2, true, Init::GlorotUniform);
      if (bn) b.bn = &add_bn(ctx, fmt::format("bn{}", i + 1), widths[i]);
      b.pool = &add_max_pool(fmt::format("pool{}", i + 1), 2, 2, 0);
      blocks_.push_back(b);
      in = widths[i];
    }
    if (hidden > 0) {
      hidden_ = &add_linear(ctx, "fc1", in, hidden, Init::GlorotUniform);
      fc_ = &add_linear(ctx, "fc2", hidden, cfg.num_classes, Init::GlorotUniform);
    } else {
      fc_ = &add_linear(ctx, "fc", in, cfg.num_classes, Init::GlorotUniform);
    }
  }
  std::string name() const override { return name_; }
  void init(Context& ctx, uint64_t seed) override { init_keras(ctx, seed); }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = x;
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      const Block& b = blocks_[i];
      h = (*b.conv)(ctx, h, trace);
      if (b.bn) h = (*b.bn)(ctx, h, training, trace);
      h = traced(trace, fmt::format("relu{}", i + 1), "relu", relu(ctx, h));
      h = (*b.pool)(ctx, h, trace);
    }
    h = traced(trace, "gap", "global_avg_pool", global_avg_pool(ctx, h));
    if (hidden_) {
      h = traced(trace, fmt::format("relu{}", blocks_.size() + 1), "relu", relu(ctx, (*hidden_)(ctx, h, trace)));
    }
    return (*fc_)(ctx, h, trace);
  }

 private:
  struct Block {
    Conv2d* conv = nullptr;
    BatchNorm2d* bn = nullptr;  // none in smallcnn
    MaxPool2d* pool = nullptr;
  };
  std::string name_;
  std::vector<Block> blocks_;
  Linear* hidden_ = nullptr;  // SmallCNN's fc1
  Linear* fc_ = nullptr;
};

// The smallest network with every kind of noisy kernel the noise lab studies: conv 3x3 16 →
// relu → max-pool 3x3 stride 2 (overlapping windows, so the pool's backward scatter can
// collide) → conv 3x3 32 → relu → global average pool → dense classes.
class TwoConv : public ZooNet {
 public:
  TwoConv(Context& ctx, const NetConfig& cfg) : ZooNet({cfg.in_channels, 1, 0, ""}) {
    conv1_ = &add_conv(ctx, "conv1", cfg.in_channels, 16, 3, 1, 1, true, Init::GlorotUniform);
    pool1_ = &add_max_pool("pool1", 3, 2, 1);
    conv2_ = &add_conv(ctx, "conv2", 16, 32, 3, 1, 1, true, Init::GlorotUniform);
    fc_ = &add_linear(ctx, "fc", 32, cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override { return "two-conv"; }
  void init(Context& ctx, uint64_t seed) override { init_keras(ctx, seed); }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool, SummaryTrace* trace) override {
    Var h = traced(trace, "relu1", "relu", relu(ctx, (*conv1_)(ctx, x, trace)));
    h = traced(trace, "relu2", "relu", relu(ctx, (*conv2_)(ctx, (*pool1_)(ctx, h, trace), trace)));
    return (*fc_)(ctx, traced(trace, "gap", "global_avg_pool", global_avg_pool(ctx, h)), trace);
  }

 private:
  Conv2d* conv1_ = nullptr;
  MaxPool2d* pool1_ = nullptr;
  Conv2d* conv2_ = nullptr;
  Linear* fc_ = nullptr;
};

// Keras's examples/mnist_cnn.py, layer for layer (see nets.h). Only a 28x28 input fits fc1.
class MnistCnn : public ZooNet {
 public:
  static constexpr int kSide = 28;                     // input height and width
  static constexpr int kPooled = (kSide - 2 - 2) / 2;  // two valid 3x3 convs, then pool 2: 12
  MnistCnn(Context& ctx, const NetConfig& cfg)
      : ZooNet({cfg.in_channels, kSide, kSide, fmt::format("its fc1 is sized for {}x{} images", kSide, kSide)}) {
    conv1_ = &add_conv(ctx, "conv1", cfg.in_channels, 32, 3, 1, 0, true, Init::GlorotUniform);  // Keras's 'valid'
    conv2_ = &add_conv(ctx, "conv2", 32, 64, 3, 1, 0, true, Init::GlorotUniform);
    pool1_ = &add_max_pool("pool1", 2, 2, 0);
    dropout1_ = &add_dropout("dropout1", 0.25f);
    fc1_ = &add_linear(ctx, "fc1", 64 * kPooled * kPooled, 128, Init::GlorotUniform);
    dropout2_ = &add_dropout("dropout2", 0.5f);
    fc2_ = &add_linear(ctx, "fc2", 128, cfg.num_classes, Init::GlorotUniform);
  }
  std::string name() const override { return "mnist-cnn"; }
  void init(Context& ctx, uint64_t seed) override { init_keras(ctx, seed); }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool training, SummaryTrace* trace) override {
    Var h = traced(trace, "relu1", "relu", relu(ctx, (*conv1_)(ctx, x, trace)));
    h = traced(trace, "relu2", "relu", relu(ctx, (*conv2_)(ctx, h, trace)));
    h = (*dropout1_)(ctx, (*pool1_)(ctx, h, trace), training, seed_, step_, trace);
    h = traced(trace, "flatten", "flatten", flatten(ctx, h));
    h = traced(trace, "relu3", "relu", relu(ctx, (*fc1_)(ctx, h, trace)));
    return (*fc2_)(ctx, (*dropout2_)(ctx, h, training, seed_, step_, trace), trace);
  }

 private:
  Conv2d* conv1_ = nullptr;
  Conv2d* conv2_ = nullptr;
  MaxPool2d* pool1_ = nullptr;
  Dropout* dropout1_ = nullptr;
  Linear* fc1_ = nullptr;
  Dropout* dropout2_ = nullptr;
  Linear* fc2_ = nullptr;
};

}  // namespace

std::unique_ptr<Net> make_smallcnn(Context& ctx, const NetConfig& cfg, bool batch_norm) {
  return std::make_unique<BlockCnn>(ctx, cfg, batch_norm ? "smallcnn-bn" : "smallcnn", std::vector<int>{16, 32, 32}, 3,
                                    batch_norm, 32);
}
std::unique_ptr<Net> make_two_conv(Context& ctx, const NetConfig& cfg) { return std::make_unique<TwoConv>(ctx, cfg); }
std::unique_ptr<Net> make_mnist_cnn(Context& ctx, const NetConfig& cfg) { return std::make_unique<MnistCnn>(ctx, cfg); }
std::unique_ptr<Net> make_mediumcnn(Context& ctx, const NetConfig& cfg, int kernel) {
  return std::make_unique<BlockCnn>(ctx, cfg, fmt::format("mediumcnn-k{}", kernel),
                                    std::vector<int>{16, 32, 64, 128, 256, 512}, kernel, true, 0);
}

}  // namespace ditto::zoo
