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
//
// The model zoo (issue 10): torchvision's architectures with torchvision's parameter counts,
// module paths as layer names (so parameter names match torchvision's state_dict, less batch
// norm's num_batches_tracked) and torchvision's init rules; num_classes and in_channels are
// honoured (1000 and 3 give torchvision's counts).
//   vgg16, vgg19, vgg16-bn, vgg19-bn  torchvision.models.vgg16/vgg19(_bn): "features" of 3x3
//             convs (padding 1, bias) → (bn →) relu and 2x2 max pools, counted as torchvision
//             counts its modules ("features.0" conv, "features.1" bn or relu, ...); then
//             flatten → classifier.0 linear 25088→4096 → relu → classifier.2 dropout 0.5 →
//             classifier.3 4096→4096 → relu → classifier.5 dropout 0.5 → classifier.6 →
//             classes. torchvision's AdaptiveAvgPool2d((7, 7)) is the identity for 224x224
//             inputs and is left out, so inputs must be 224..255 a side (else ShapeError).
//             Parameters 138,357,544 / 143,667,240 / 138,365,992 / 143,678,248. Convs He-normal
//             fan_out, bias 0; linears normal(0, 0.01), bias 0; bn 1 / 0. Dropout as mnist-cnn
//             (Philox keyed by seed, step, layer): stochastic.
//   resnet50, resnet101, resnet152  torchvision's bottleneck ResNets (v1.5: stride on the 3x3):
//             conv1 7x7/2 → bn1 → relu → maxpool 3x3/2 → layer1..4 of [3,4,6,3] / [3,4,23,3] /
//             [3,8,36,3] bottlenecks (1x1 → 3x3 → 1x1 x4, each conv → bn; downsample.0 1x1 conv
//             + downsample.1 bn) → global average pool → fc 2048 → classes. Parameters
//             25,557,032 / 44,549,160 / 60,192,808. Convs He-normal fan_out, bn 1 / 0, fc
//             PyTorch's default Linear init (uniform +-1/sqrt(2048), bias too). Any input of at
//             least 32x32; batch norm in training needs batch x (side/32)^2 > 1.
//   mediumcnn-k1, -k3, -k5, -k7  the paper's MediumCNN(k): six blocks conv kxk (padding k/2,
//             bias) → bn → relu → maxpool 2, widths 16, 32, 64, 128, 256, 512 (conv1..6,
//             bn1..6, pool1..6) → global average pool → fc 512 → classes. Glorot-uniform
//             kernels, zero biases. Six halvings: inputs of at least 64x64.
#pragma once
#include <memory>
#include <string>

#include "nets/module.h"

namespace ditto {

struct NetConfig {
  std::string model;        // "smallcnn", "smallcnn-bn", "two-conv", "resnet18", "resnet18-imagenet",
                            // "mnist-cnn", "vgg16", "vgg19", "vgg16-bn", "vgg19-bn", "resnet50",
                            // "resnet101", "resnet152", "mediumcnn-k1", "-k3", "-k5", "-k7"
  int num_classes = 10;
  int in_channels = 3;
};

// Throws ditto::Error listing the known models for an unknown name.
std::unique_ptr<Net> make_net(Context& ctx, const NetConfig& cfg);
const std::vector<std::string>& known_models();

}  // namespace ditto
