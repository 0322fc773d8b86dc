// Builds against the installed package only, through the umbrella header: a policy, a network
// of its own made with the ZooNet builder (one CPU training step with a tape), a zoo network
// from make_net, the input check of Net::forward, and the manifest. Exits non-zero if anything
// is off.
#include <ditto/ditto.h>

#include <cstdio>

namespace {

class Tiny : public ditto::zoo::ZooNet {
 public:
  Tiny(ditto::Context& ctx, int classes) : ZooNet({3, 4, 0, "the consumer's own minimum"}) {
    conv_ = &add_conv(ctx, "conv1", 3, 8, 3, 1, 1, true, ditto::Init::GlorotUniform);
    pool_ = &add_max_pool("pool1", 2, 2, 0);
    fc_ = &add_linear(ctx, "fc", 8, classes, ditto::Init::GlorotUniform);
  }
  std::string name() const override { return "tiny"; }
  void init(ditto::Context& ctx, uint64_t seed) override {
    each_layer([&](ditto::Conv2d& c) { ditto::zoo::init_conv_glorot(ctx, c, seed); },
               [&](ditto::BatchNorm2d& bn) { ditto::zoo::reset_bn(ctx, bn); },
               [&](ditto::Linear& fc) { ditto::zoo::init_linear_glorot(ctx, fc, seed); });
  }

 protected:
  ditto::Var forward_impl(ditto::Context& ctx, const ditto::Var& x, bool, ditto::SummaryTrace* trace) override {
    ditto::Var h = (*pool_)(ctx, ditto::relu(ctx, (*conv_)(ctx, x, trace)), trace);
    return (*fc_)(ctx, ditto::global_avg_pool(ctx, h), trace);
  }

 private:
  ditto::Conv2d* conv_ = nullptr;
  ditto::MaxPool2d* pool_ = nullptr;
  ditto::Linear* fc_ = nullptr;
};

}  // namespace

int main() {
  ditto::Policy policy = ditto::Policy::parse({"*=deterministic", "conv1.bwd_filter=algo0"});
  if (ditto::conv_choice<ditto::ConvBwdFilterAlgo>(policy, "conv1").mode != ditto::SelectMode::Pinned) return 1;
  ditto::Context ctx(ditto::Device::cpu(), policy);

  Tiny net(ctx, 4);
  policy.check_layers(net.knob_layers());
  if (net.param_count() != 3 * 8 * 9 + 8 + 8 * 4 + 4) return 2;
  net.init(ctx, 1);
  std::vector<float> pixels(2 * 3 * 8 * 8);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = float(i % 5) - 2.0f;
  ditto::Var logits = net.forward(ctx, ditto::Var(ctx.from_host(pixels, {2, 3, 8, 8})), true);
  ditto::Var loss = ditto::softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(std::vector<int32_t>{0, 3}, {2}));
  ctx.tape().backward(ctx, loss);
  for (const auto& p : net.params())
    if (!p.var.grad().defined()) return 3;
  try {
    net.forward(ctx, ditto::Var(ctx.zeros({2, 3, 3, 3})), false);  // below its minimum side
    return 4;
  } catch (const ditto::ShapeError&) {
  }

  auto zoo = ditto::make_net(ctx, {"smallcnn", 10, 3});
  if (zoo->param_count() != 15722) return 5;
  try {
    ditto::Policy::parse({"conv1.bwd_filter=algo9"});
    return 6;
  } catch (const ditto::PolicyError&) {
  }
  if (ctx.manifest().entries().empty()) return 7;
  std::printf("consumer ok: loss fingerprint %s\n", loss.value().fingerprint().hex().c_str());
  return 0;
}
