// The paper's networks, with stable layer names.
//   SmallCNN  (as in the paper's repository): conv3x3 16 → relu → maxpool 2; conv3x3 32 → relu →
//             maxpool 2; conv3x3 32 → relu → maxpool 2; global average pool; dense 32 → relu;
//             dense classes. Glorot-uniform weights, zero biases; optional batch norm after each
//             conv (conv → bn → relu). Convs use padding 1 ("same").
//   two-conv  conv3x3 16 → relu → maxpool 3 stride 2 → conv3x3 32 → relu → global average pool →
//             dense classes: the noise lab's smallest example.
//   ResNet-18 for CIFAR (3x3 stem, stride 1, no stem pool) and for ImageNet-size inputs (7x7
//             stride-2 stem + 3x3 stride-2 max pool "pool1"). Convs without bias, He-normal
//             (fan_in); BN gamma 1, beta 0; fc Glorot-uniform.
//   mnist-cnn Keras's examples/mnist_cnn.py for 1x28x28 inputs: conv3x3 32 → relu → conv3x3 64 →
//             relu (both 'valid', no padding) → maxpool 2 → dropout 0.25 → flatten → dense 128 →
//             relu → dropout 0.5 → dense classes; Glorot-uniform kernels, zero biases; 1,199,882
//             parameters for 1 channel and 10 classes (Keras's model.summary()). Layers conv1,
//             conv2, pool1, dropout1, fc1, dropout2, fc2. Dropout masks come from Philox keyed by
//             (seed, step, layer name) (kernels/dropout.h; the trainer passes its init seed and the
//             1-based step through Net::begin_step), so a run replays exactly and CPU and GPU
//             masks agree bit for bit; masks change every step, so the net cannot be trained with
//             --graph. Inputs other than Nx{in_channels}x28x28 are a ShapeError.
#pragma once
#include <memory>
#include <string>

#include "nets/module.h"

namespace ditto {

struct NetConfig {
  std::string model;        // "smallcnn", "smallcnn-bn", "two-conv", "resnet18", "resnet18-imagenet",
                            // "mnist-cnn"
  int num_classes = 10;
  int in_channels = 3;
};

// Throws ditto::Error listing the known models for an unknown name.
std::unique_ptr<Net> make_net(Context& ctx, const NetConfig& cfg);
const std::vector<std::string>& known_models();

}  // namespace ditto
