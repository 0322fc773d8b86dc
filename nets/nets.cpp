// make_net's registry: every model name with the factory of its family file.
#include "nets/nets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>

#include "engine/error.h"
#include "nets/detail/families.h"
#include "nets/detail/tasks.h"

namespace ditto {
namespace {

using Factory = std::function<std::unique_ptr<Net>(Context&, const NetConfig&)>;

// In the order known_models() lists them.
const std::vector<std::pair<std::string, Factory>>& registry() {
  using namespace zoo;
  static const std::vector<std::pair<std::string, Factory>> r = {
      {"smallcnn", [](Context& c, const NetConfig& n) { return make_smallcnn(c, n, false); }},
      {"smallcnn-bn", [](Context& c, const NetConfig& n) { return make_smallcnn(c, n, true); }},
      {"two-conv", make_two_conv},
      {"resnet18", [](Context& c, const NetConfig& n) { return make_resnet18(c, n, false); }},
      {"resnet18-imagenet", [](Context& c, const NetConfig& n) { return make_resnet18(c, n, true); }},
      {"mnist-cnn", make_mnist_cnn},
      {"vgg16", [](Context& c, const NetConfig& n) { return make_vgg(c, n, 16, false); }},
      {"vgg19", [](Context& c, const NetConfig& n) { return make_vgg(c, n, 19, false); }},
      {"vgg16-bn", [](Context& c, const NetConfig& n) { return make_vgg(c, n, 16, true); }},
      {"vgg19-bn", [](Context& c, const NetConfig& n) { return make_vgg(c, n, 19, true); }},
      {"resnet34", [](Context& c, const NetConfig& n) { return make_torchvision_resnet(c, n, 34); }},
      {"resnet50", [](Context& c, const NetConfig& n) { return make_torchvision_resnet(c, n, 50); }},
      {"resnet101", [](Context& c, const NetConfig& n) { return make_torchvision_resnet(c, n, 101); }},
      {"resnet152", [](Context& c, const NetConfig& n) { return make_torchvision_resnet(c, n, 152); }},
      {"mediumcnn-k1", [](Context& c, const NetConfig& n) { return make_mediumcnn(c, n, 1); }},
      {"mediumcnn-k3", [](Context& c, const NetConfig& n) { return make_mediumcnn(c, n, 3); }},
      {"mediumcnn-k5", [](Context& c, const NetConfig& n) { return make_mediumcnn(c, n, 5); }},
      {"mediumcnn-k7", [](Context& c, const NetConfig& n) { return make_mediumcnn(c, n, 7); }},
      {"densenet121", [](Context& c, const NetConfig& n) { return make_densenet(c, n, 121); }},
      {"densenet169", [](Context& c, const NetConfig& n) { return make_densenet(c, n, 169); }},
      {"densenet201", [](Context& c, const NetConfig& n) { return make_densenet(c, n, 201); }},
      {"mobilenet", make_mobilenet_v1},
      {"mobilenet-v2", make_mobilenet_v2},
      {"efficientnet-b0", make_efficientnet_b0},
      {"inception-v3", make_inception_v3},
      {"xception", make_xception},
      // the other task kinds (nets/detail/tasks.h)
      {"unet-small", tasks::make_unet_small},
      {"stn", tasks::make_stn},
      {"ctc-cnn", tasks::make_ctc_cnn},
      {"embedding-bag", tasks::make_embedding_bag_net},
  };
  return r;
}

}  // namespace

const std::vector<std::string>& known_models() {
  static const std::vector<std::string> m = [] {
    std::vector<std::string> names;
    for (const auto& [name, factory] : registry()) names.push_back(name);
    return names;
  }();
  return m;
}

const std::vector<std::string>& task_models() {
  static const std::vector<std::string> m = {"unet-small", "stn", "ctc-cnn", "embedding-bag"};
  return m;
}

bool is_task_model(const std::string& model) {
  const auto& t = task_models();
  return std::find(t.begin(), t.end(), model) != t.end();
}

std::unique_ptr<Net> make_net(Context& ctx, const NetConfig& cfg) {
  if (cfg.num_classes < 2) throw Error(fmt::format("model {}: need at least 2 classes, got {}", cfg.model, cfg.num_classes));
  if (cfg.in_channels < 1)
    throw Error(fmt::format("model {}: need at least 1 input channel, got {}", cfg.model, cfg.in_channels));
  for (const auto& [name, factory] : registry())
    if (name == cfg.model) return factory(ctx, cfg);
  throw Error(fmt::format("unknown model '{}'; known models: {}", cfg.model, fmt::join(known_models(), ", ")));
}

}  // namespace ditto
