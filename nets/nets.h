// The networks make_net builds, with stable layer names. Every one is built with the ZooNet
// builder (nets/zoo.h), one file per family: nets/small.cpp (SmallCNN, two-conv, mnist-cnn,
// MediumCNN), resnet.cpp, vgg.cpp, densenet.cpp, mobilenet.cpp (MobileNet v1 and v2,
// EfficientNet-B0) and inception.cpp (Inception-v3, Xception). Net::forward checks every input
// against the net's InputSpec first: N >= 1 images of in_channels channels, at least the minimum
// side given below (1 where none is given); anything else is a ShapeError naming the net and the
// shape, before any op runs.
//   SmallCNN  (as in the paper's repository): conv3x3 16 → relu → maxpool 2; conv3x3 32 → relu →
//             maxpool 2; conv3x3 32 → relu → maxpool 2; global average pool; dense 32 → relu;
//             dense classes. Glorot-uniform weights, zero biases; optional batch norm after each
//             conv (conv → bn → relu). Convs use padding 1 ("same"). Inputs of at least 8x8.
//   two-conv  conv3x3 16 → relu → maxpool 3 stride 2 → conv3x3 32 → relu → global average pool →
//             dense classes: the noise lab's smallest example.
//   ResNet-18 for CIFAR (3x3 stem, stride 1, no stem pool) and for ImageNet-size inputs (7x7
//             stride-2 stem + 3x3 stride-2 max pool "pool1"). Convs without bias, He-normal
//             (fan_in); BN gamma 1, beta 0; fc Glorot-uniform. Any input size (batch norm in
//             training needs more than one value per channel at the last stage).
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
// The model zoo: torchvision's architectures with torchvision's parameter counts,
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
//   resnet34  torchvision.models.resnet34: conv1 7x7/2 → bn1 → relu → maxpool 3x3/2 → layer1..4
//             of [3, 4, 6, 3] BasicBlocks (conv1 3x3 → bn1 → relu → conv2 3x3 → bn2, plus the
//             shortcut, then relu; the first block of layers 2-4 strides 2 on its conv1 and has
//             downsample.0 1x1 conv + downsample.1 bn) → global average pool → fc 512 → classes.
//             Parameters 21,797,672. Init and input sizes as resnet50's below (fc uniform
//             +-1/sqrt(512)).
//   resnet50, resnet101, resnet152  torchvision's bottleneck ResNets (v1.5: stride on the 3x3):
//             conv1 7x7/2 → bn1 → relu → maxpool 3x3/2 → layer1..4 of [3,4,6,3] / [3,4,23,3] /
//             [3,8,36,3] bottlenecks (1x1 → 3x3 → 1x1 x4, each conv → bn; downsample.0 1x1 conv
//             + downsample.1 bn) → global average pool → fc 2048 → classes. Parameters
//             25,557,032 / 44,549,160 / 60,192,808. Convs He-normal fan_out, bn 1 / 0, fc
//             PyTorch's default Linear init (uniform +-1/sqrt(2048), bias too). Any input size
//             (the last stage's map is about side/32); batch norm in training needs batch x
//             (last stage's side)^2 > 1.
//   mediumcnn-k1, -k3, -k5, -k7  the paper's MediumCNN(k): six blocks conv kxk (padding k/2,
//             bias) → bn → relu → maxpool 2, widths 16, 32, 64, 128, 256, 512 (conv1..6,
//             bn1..6, pool1..6) → global average pool → fc 512 → classes. Glorot-uniform
//             kernels, zero biases. Six halvings: inputs of at least 64x64.
//   densenet121, densenet169, densenet201  torchvision.models.densenet121/169/201 (growth 32,
//             bn_size 4, 64 initial features, drop_rate 0; blocks (6, 12, 24, 16) / (6, 12, 32,
//             32) / (6, 12, 48, 32)): features.conv0 7x7/2
//             → norm0 → relu → pool0 (max 3x3/2, pad 1) → denseblock1..4 of denselayerN (norm1 →
//             relu → conv1 1x1 to 128 → norm2 → relu → conv2 3x3 to 32, each reading the channel
//             concatenation of the block input and all earlier layers) with transition1..3
//             (norm → relu → conv 1x1 halving → 2x2 average pool) between → norm5 → relu →
//             global average pool → classifier. Parameters 7,978,856 / 14,149,480 /
//             20,013,928. Convs
//             He-normal fan_in, bn 1 / 0, classifier PyTorch's default (uniform +-1/sqrt(in)) with
//             bias 0. Inputs of at least 29x29 (32x32: a 1x1 last stage); no dropout.
//   mobilenet keras.applications.MobileNet (v1; alpha 1.0, depth multiplier 1, dropout 1e-3,
//             include_top), Keras's layer names: conv1 (3x3/2, 32, no bias) + conv1_bn + ReLU6;
//             13 depthwise-separable blocks conv_dw_i (3x3 depthwise, groups = channels, no
//             bias) + conv_dw_i_bn + ReLU6 → conv_pw_i (1x1, no bias) + conv_pw_i_bn + ReLU6, to
//             64, 128, 128, 256, 256, 512 (x6), 1024, 1024 channels, blocks 2, 4, 6 and 12 with
//             stride 2; global average pool → dropout 1e-3 "dropout" → conv_preds (1x1 conv with
//             bias) → reshape to [N, classes] (logits: the softmax is in the loss). Batch norm eps
//             1e-3, momentum 0.01 (Keras's 0.99 weighs the old average). 4,231,976 parameters:
//             Keras's summary's 4,253,864 counts the 21,888 BN moving statistics (2 x 10,944
//             channels) too, which are ditto buffers. Glorot-uniform kernels, zero biases.
//             DEVIATION: Keras pads its stride-2 3x3 convs asymmetrically (conv1 "same", the
//             blocks ZeroPadding2D((0, 1), (0, 1)) + "valid": nothing before, one row / column
//             after); ditto's convolution pads symmetrically, so they use padding 1: the same
//             output sizes when the side is a multiple of 32 (224x224 by design) but every window
//             one row / column earlier than Keras's, and on other sides a stride-2 conv that
//             meets an odd side gives one row / column more. Inputs of at least 32x32 (Keras's
//             minimum). Stochastic (dropout).
//   mobilenet-v2  torchvision.models.mobilenet_v2 (width 1.0): features.0 conv 3x3/2 + bn + ReLU6,
//             features.1..17 inverted residuals (conv.N: 1x1 expand x t + bn + ReLU6 when t != 1,
//             3x3 depthwise (groups = channels) + bn + ReLU6, 1x1 projection + bn, no activation;
//             input added when stride 1 and channels match), features.18 1x1 to 1280 + bn +
//             ReLU6 → global average pool → classifier.0 dropout 0.2 → classifier.1. Parameters
//             3,504,872. Convs He-normal fan_out, bn 1 / 0, linear normal(0, 0.01), bias 0.
//             Any input size (five stride-2 convs; 32x32 gives a 1x1 last stage). Stochastic.
//   efficientnet-b0  torchvision.models.efficientnet_b0: features.0 conv 3x3/2 + bn + SiLU,
//             features.1..7 stages of MBConv blocks (block.N: 1x1 expand + bn + SiLU when the
//             ratio is 6, kxk depthwise + bn + SiLU, squeeze-excitation fc1 / fc2 (1x1 convs
//             with bias: avg pool → fc1 to in/4 → SiLU → fc2 → sigmoid → channel scale), 1x1
//             projection + bn), features.8 1x1 to 1280 + bn + SiLU → global average pool →
//             classifier.0 dropout 0.2 → classifier.1. Parameters 5,288,548. Blocks with a
//             residual apply torchvision's StochasticDepth "row" mode in training, p = 0.2 *
//             block index / 16 (0 .. 0.1875), each sample's branch kept or zeroed by Philox keyed
//             (seed, step, "features.S.B.stochastic_depth") like dropout, so it replays exactly and
//             CPU and GPU agree (nets/zoo.h). Convs He-normal fan_out (SE convs too, biases 0),
//             bn 1 / 0 (eps 1e-5), linear uniform +-1/sqrt(classes), bias 0. Any input size;
//             stochastic.
//   inception-v3  torchvision.models.inception_v3(aux_logits=False, transform_input=False,
//             init_weights=True): BasicConv2d ("<name>.conv" no bias → "<name>.bn" eps 0.001 →
//             relu) stem Conv2d_1a_3x3 .. Conv2d_4a_3x3 with maxpool1 / maxpool2 (3x3/2), Mixed_5b-d
//             (InceptionA), Mixed_6a (B), Mixed_6b-e (C: 1x7 / 7x1 convs), Mixed_7a (D), Mixed_7b-c
//             (E) → global average pool → dropout 0.5 → fc. Branch average pools 3x3/1 pad 1 count
//             padding (F.avg_pool2d's count_include_pad=True); the functional max pools of
//             Mixed_6a / Mixed_7a are knob layers "<block>.branch_pool". Without the auxiliary
//             classifier (the trainer has one loss): 23,834,568 parameters, torchvision's
//             published 27,161,264 less AuxLogits' 3,326,696. Conv and linear weights normal(0, 0.1)
//             (torchvision's trunc_normal_ at +-2 = 20 std never truncates), fc bias PyTorch's
//             default uniform +-1/sqrt(2048), bn 1 / 0. Inputs of at least 75x75 (ShapeError
//             below; 299x299 by design). Stochastic (dropout).
//   xception  keras.applications.Xception, Keras's layer names: block1_conv1/2 (3x3, stride 2
//             then 1, 'valid', no bias) + "_bn" + relu; blocks 2-4 and 13 with a 1x1 stride-2 conv
//             + BN shortcut (Keras leaves them unnamed: its fresh-session names conv2d, conv2d_1..3
//             and batch_normalization, batch_normalization_1..3), separable convs "blockB_sepconvI"
//             (a 3x3 depthwise "<name>.depthwise", groups = channels, + 1x1 "<name>.pointwise",
//             no biases: Keras's depthwise_kernel / pointwise_kernel) each followed by
//             "blockB_sepconvI_bn", max pools "blockB_pool" 3x3/2; middle blocks 5-12 of three
//             relu → sepconv → BN with identity shortcuts; block14 sepconvs to 1536 and 2048 with
//             relu → global average pool "avg_pool" → "predictions" (logits: the softmax is in the
//             loss). Batch norm eps 1e-3, momentum 0.01 (Keras's 0.99 weighs the old average).
//             22,855,952 parameters: Keras's table's 22,910,480 counts the 54,528 BN moving
//             statistics too, which are ditto buffers. Glorot-uniform kernels, zero dense bias.
//             DEVIATION: Keras's "same" 3x3/2 max pool pads (0 before, 1 after) on an even side;
//             ditto's pooling pads symmetrically, so the pools use padding 1: the same output
//             size always, the same windows on odd sides, but on even sides every window starts
//             one row / column earlier than Keras's (at 299x299 only block3_pool, on 74x74).
//             Inputs of at least 71x71 (Keras's minimum; ShapeError below).
//
// The other task kinds (nets/detail/tasks.h, the trainer's side in experiments/task_scoring.h), each
// built on the zoo's builder with its task-specific ops as extra knob layers:
//   unet-small     segmentation (engine/task_kind.h): enc1 conv3x3 16 → relu → pool1 2 → enc2 conv 32 →
//             relu → pool2 2 → mid conv 64 → relu → up2 bilinear (align_corners false) to enc2's
//             size → concat with enc2 → dec2 conv 32 → relu → up1 nearest to enc1's size → concat
//             with enc1 → dec1 conv 16 → relu → head conv1x1 → classes: pixel logits {N, classes,
//             H, W}, the loss pixel_xent ("loss"). Convs padding "same", bias, He-normal fan_in,
//             zero bias. 58,091 parameters for 1 channel and 11 classes. Any input of at least
//             4x4 (mnist-seg, synthetic-seg: 28x28).
//   stn       the spatial transformer classifier of PyTorch's STN tutorial (Jaderberg et al.) for
//             Nx{in}x40x40 inputs (mnist-rt): localization loc.conv1 7x7 8 → loc.pool1 2 → relu →
//             loc.conv2 5x5 10 → loc.pool2 2 → relu → flatten 360 → loc.fc1 32 → relu → loc.fc2 6 =
//             theta {N, 2, 3}, started at the identity (weight 0, bias 1 0 0 0 1 0) → affine_grid
//             28x28 → grid_sample of the input (bilinear, zero padding, align_corners true, so
//             cuDNN's spatial transformer can run it) → classifier cls.conv1 5x5 10 → cls.pool1 2 →
//             relu → cls.conv2 5x5 20 → cls.pool2 2 → relu → flatten 320 → cls.fc1 50 → relu →
//             cls.fc2 classes (the tutorial's dropout left out: deterministic and graphable).
//             PyTorch's default init (uniform +-1/sqrt(fan_in), biases alike). 36,000 parameters
//             for 1 channel and 10 classes. Other input sizes are a ShapeError.
//   ctc-cnn   a CTC recognizer of digit strings, sequence task: conv1 3x3 32 → relu → pool1 2 →
//             conv2 64 → relu → pool2 2 → conv3 96 → relu → pool3 2 → conv4 3x1 (valid) 128 → relu
//             (one row left: a feature column per time step) → head conv1x1 → classes {N, A, 1, T}
//             → "time_major", a gather (kernels/scatter.h embedding) of the N*A*T values into
//             {T, N, A}, the layout CTC takes: each value is read once, so the gather's backward
//             scatter-add (knob `scatter`) adds one term per element and its variants agree → the
//             loss ctc_loss ("loss", blank = class 0) and the batch mean of the per-sequence costs
//             ("loss_mean", reduce). He-normal fan_in convs, zero bias. 112,619 parameters for 1
//             channel and 11 classes. Inputs of height 24..31 and width at least 8: T = floor(W / 8),
//             9 for mnist-strings' 28x72.
//   embedding-bag  categorical features (a categorical Dataset: celeba-attrs, synthetic-attrs):
//             "features" EmbeddingBag (nets/embedding.h) of NetConfig::categories ids x 32, mean
//             mode, over each example's fields (i32 ids {N, fields}) → relu → fc1 64 → relu → fc2
//             classes. Table normal(0, 1) as nn.EmbeddingBag, linears PyTorch's default. 4,738
//             parameters for CelebA's 39 fields (78 ids) and 2 classes.
#pragma once
#include <memory>
#include <string>

#include "nets/module.h"

namespace ditto {

struct NetConfig {
  std::string model;        // "smallcnn", "smallcnn-bn", "two-conv", "resnet18", "resnet18-imagenet",
                            // "mnist-cnn", "vgg16", "vgg19", "vgg16-bn", "vgg19-bn", "resnet34",
                            // "resnet50", "resnet101", "resnet152", "mediumcnn-k1", "-k3", "-k5", "-k7",
                            // "densenet121", "densenet169", "densenet201", "mobilenet",
                            // "mobilenet-v2", "efficientnet-b0", "inception-v3", "xception", and
                            // the other task kinds' "unet-small",
                            // "stn", "ctc-cnn", "embedding-bag" (nets/detail/tasks.h)
  int num_classes = 10;     // classes, pixel classes (segmentation) or symbols with the blank (ctc-cnn)
  int in_channels = 3;
  int categories = 0;       // embedding-bag: category ids in [0, categories) (Dataset::categories)
};

// Throws ditto::Error listing the known models for an unknown name (and for fewer than 2
// classes or 1 input channel).
std::unique_ptr<Net> make_net(Context& ctx, const NetConfig& cfg);
const std::vector<std::string>& known_models();
// The models of the other task kinds (segmentation, sequences, categorical input), among
// known_models(). The rest are image classifiers: logits [N, classes] from N x C x H x W.
const std::vector<std::string>& task_models();
bool is_task_model(const std::string& model);

}  // namespace ditto
