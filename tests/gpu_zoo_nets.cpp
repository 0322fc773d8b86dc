// Every network on the GPU, as make_net builds it (the one builder, DenseNet-169 and Keras's
// MobileNet included): initial weights bit-equal to the CPU's (both are drawn on the host from
// the same Philox streams), a training step under `*=deterministic` that two fresh contexts repeat
// bit for bit (logits, loss, every gradient, the batch-norm statistics), every op of it promising
// run_to_run or gpu_to_gpu in the manifest, and the input check of Net::forward refusing a wrong
// shape before any op runs (nothing recorded in the manifest). Inputs as tests/cpu_net_fingerprints
// (small: batch 2 at the smallest side each net documents; VGG at 224x224, batch 1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/loss.h"
#include "nets/nets.h"
#include "support.h"

using namespace ditto;

namespace {

struct Probe {
  const char* model;
  int channels, side, batch;
};

const Probe kProbes[] = {
    {"smallcnn", 3, 16, 2},      {"smallcnn-bn", 3, 16, 2},     {"two-conv", 3, 16, 2},
    {"resnet18", 3, 16, 2},      {"resnet18-imagenet", 3, 32, 2}, {"mnist-cnn", 1, 28, 2},
    {"vgg16-bn", 3, 224, 1},     {"resnet50", 3, 32, 2},        {"mediumcnn-k3", 3, 64, 2},
    {"densenet121", 3, 32, 2},   {"densenet169", 3, 32, 2},     {"mobilenet", 3, 32, 2},
    {"mobilenet-v2", 3, 32, 2},  {"efficientnet-b0", 3, 32, 2}, {"inception-v3", 3, 75, 2},
    {"xception", 3, 71, 2},      {"resnet34", 3, 32, 2},
};
constexpr int kClasses = 10;

// One training step's fingerprints: logits, loss, every gradient and buffer, in order.
std::vector<Fingerprint> step_prints(const Probe& p, uint64_t seed) {
  Context ctx(Device::cuda(0), Policy::parse({"*=deterministic"}));
  auto net = make_net(ctx, {p.model, kClasses, p.channels});
  net->init(ctx, seed);
  net->begin_step(seed, 1);
  const Shape xs{p.batch, p.channels, p.side, p.side};
  Tensor x = ctx.from_host(test::random_vec(std::size_t(shape_numel(xs)), seed), xs);
  std::vector<int32_t> labels(std::size_t(p.batch));
  for (int i = 0; i < p.batch; ++i) labels[std::size_t(i)] = i % kClasses;
  Var logits = net->forward(ctx, Var(x), true);
  Var loss = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(labels, {p.batch}));
  ctx.tape().backward(ctx, loss);
  ctx.synchronize();
  auto lv = logits.value().to_host_f32();
  CHECK(std::all_of(lv.begin(), lv.end(), [](float v) { return std::isfinite(v); }));
  for (const auto& e : ctx.manifest().entries()) {
    INFO(e.layer << "." << e.knob << "=" << e.variant << " " << guarantee_name(e.guarantee));
    CHECK((e.guarantee == Guarantee::RunToRun || e.guarantee == Guarantee::GpuToGpu));
  }
  std::vector<Fingerprint> prints = {logits.value().fingerprint(), loss.value().fingerprint()};
  for (const auto& prm : net->params()) {
    INFO(prm.name);
    REQUIRE(prm.var.grad().defined());
    prints.push_back(prm.var.grad().fingerprint());
  }
  for (const auto& b : net->buffers()) prints.push_back(b.tensor->fingerprint());
  return prints;
}

}  // namespace

TEST_CASE("gpu nets: initial weights equal the CPU's bit for bit") {
  for (const Probe& p : kProbes) {
    INFO(p.model);
    Context cpu;
    Context gpu(Device::cuda(0));
    auto net_c = make_net(cpu, {p.model, kClasses, p.channels});
    auto net_g = make_net(gpu, {p.model, kClasses, p.channels});
    net_c->init(cpu, 42);
    net_g->init(gpu, 42);
    auto pc = net_c->params(), pg = net_g->params();
    REQUIRE(pc.size() == pg.size());
    for (std::size_t i = 0; i < pc.size(); ++i) {
      INFO(pc[i].name);
      CHECK(pg[i].name == pc[i].name);
      CHECK(pg[i].var.value().fingerprint() == pc[i].var.value().fingerprint());
    }
    auto bc = net_c->buffers(), bg = net_g->buffers();
    REQUIRE(bc.size() == bg.size());
    for (std::size_t i = 0; i < bc.size(); ++i) CHECK(bg[i].tensor->fingerprint() == bc[i].tensor->fingerprint());
  }
}

TEST_CASE("gpu nets: a deterministic training step repeats bit for bit in a fresh context") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const Probe& p : kProbes) {
    INFO(p.model);
    const auto a = step_prints(p, seed), b = step_prints(p, seed);
    CHECK(a == b);
  }
}

TEST_CASE("gpu nets: Net::forward refuses a wrong input before any op runs") {
  for (const Probe& p : kProbes) {
    INFO(p.model);
    Context ctx(Device::cuda(0));
    auto net = make_net(ctx, {p.model, kClasses, p.channels});
    // One channel too many, a batch of none, a 3-D input.
    CHECK_THROWS_AS(net->forward(ctx, Var(ctx.zeros({1, p.channels + 1, p.side, p.side})), false), ShapeError);
    CHECK_THROWS_AS(net->forward(ctx, Var(ctx.zeros({0, p.channels, p.side, p.side})), false), ShapeError);
    CHECK_THROWS_AS(net->forward(ctx, Var(ctx.zeros({p.channels, p.side, p.side})), false), ShapeError);
    CHECK(ctx.manifest().entries().empty());
  }
}
