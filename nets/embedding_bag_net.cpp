// embedding-bag: categorical features through an embedding bag into a small classifier
// (nets/nets.h describes it).
#include <fmt/format.h>

#include "engine/error.h"
#include "kernels/activation.h"
#include "nets/embedding.h"
#include "nets/detail/tasks.h"

namespace ditto::tasks {
namespace {

class EmbeddingBagNet : public TaskNet {
 public:
  static constexpr int kDim = 32, kHidden = 64;

  EmbeddingBagNet(Context& ctx, const NetConfig& cfg)
      : TaskNet({0, 1, 0, "a categorical dataset: synthetic-attrs, celeba-attrs", true}),
        bag_(ctx, "features", checked_categories(cfg), kDim, BagMode::Mean),
        fc1_(add_linear(ctx, "fc1", kDim, kHidden, Init::HeUniform)),
        fc2_(add_linear(ctx, "fc2", kHidden, cfg.num_classes, Init::HeUniform)) {
    add_knob_layer(bag_.name(), EmbeddingBag::kind);
  }
  std::string name() const override { return "embedding-bag"; }

 protected:
  Var forward_impl(Context& ctx, const Var& x, bool /*training*/, SummaryTrace* trace) override {
    const Tensor& ids = x.value();
    if (ids.dtype() != DType::I32 || ids.ndim() != 2)
      throw ShapeError(fmt::format("embedding-bag: input is {} {}; the network takes category ids, i32 {{N, fields}} "
                                   "(a categorical dataset: synthetic-attrs, celeba-attrs)",
                                   ids.dtype() == DType::I32 ? "i32" : "f32", shape_str(ids.shape())));
    Var h = zoo::traced(trace, "relu0", "relu", relu(ctx, bag_(ctx, ids, Tensor(), trace)));
    h = zoo::traced(trace, "relu1", "relu", relu(ctx, fc1_(ctx, h, trace)));
    return fc2_(ctx, h, trace);
  }

 public:
  // The embedding table first, then ZooNet's linears.
  std::vector<Param> params() override {
    std::vector<Param> p;
    bag_.collect(p);
    for (auto& q : ZooNet::params()) p.push_back(q);
    return p;
  }
  // nn.EmbeddingBag's normal(0, 1) table, PyTorch's default linears.
  void init(Context& ctx, uint64_t seed) override {
    bag_.init(ctx, seed);
    each_layer([](Conv2d&) {}, [](BatchNorm2d&) {}, [&](Linear& fc) { init_linear_torch_default(ctx, fc, seed); });
  }

 private:
  static int64_t checked_categories(const NetConfig& cfg) {
    if (cfg.categories < 1)
      throw Error(fmt::format("embedding-bag: needs categorical data (NetConfig::categories, the number of category ids, "
                              "is {}); train it on synthetic-attrs or celeba-attrs",
                              cfg.categories));
    return cfg.categories;
  }

  EmbeddingBag bag_;
  Linear& fc1_;
  Linear& fc2_;
};

}  // namespace

std::unique_ptr<Net> make_embedding_bag_net(Context& ctx, const NetConfig& cfg) {
  return std::make_unique<EmbeddingBagNet>(ctx, cfg);
}

}  // namespace ditto::tasks
