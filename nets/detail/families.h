// Internal to nets/: the factories of each family file, which make_net's registry (nets/nets.cpp)
// calls. Not installed (callers use make_net); nets/nets.h documents every network.
#pragma once
#include <memory>

#include "nets/nets.h"

namespace ditto::zoo {

// nets/small.cpp
std::unique_ptr<Net> make_smallcnn(Context& ctx, const NetConfig& cfg, bool batch_norm);
std::unique_ptr<Net> make_two_conv(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_mnist_cnn(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_mediumcnn(Context& ctx, const NetConfig& cfg, int kernel);  // 1, 3, 5 or 7
// nets/resnet.cpp
std::unique_ptr<Net> make_resnet18(Context& ctx, const NetConfig& cfg, bool imagenet_stem);
std::unique_ptr<Net> make_torchvision_resnet(Context& ctx, const NetConfig& cfg, int depth);  // 34, 50, 101 or 152
// nets/vgg.cpp
std::unique_ptr<Net> make_vgg(Context& ctx, const NetConfig& cfg, int depth, bool batch_norm);  // 16 or 19
// nets/densenet.cpp
std::unique_ptr<Net> make_densenet(Context& ctx, const NetConfig& cfg, int depth);  // 121, 169 or 201
// nets/mobilenet.cpp
std::unique_ptr<Net> make_mobilenet_v1(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_mobilenet_v2(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_efficientnet_b0(Context& ctx, const NetConfig& cfg);
// nets/inception.cpp
std::unique_ptr<Net> make_inception_v3(Context& ctx, const NetConfig& cfg);
std::unique_ptr<Net> make_xception(Context& ctx, const NetConfig& cfg);

}  // namespace ditto::zoo
