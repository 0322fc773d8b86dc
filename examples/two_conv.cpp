// A two-conv network with one layer's bwd_filter pinned to ALGO_0 (atomics) and the other's to
// ALGO_1 (deterministic): one training step, then the manifest of what actually ran.
//   two_conv [--device cuda|cpu]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "ditto/ditto.h"

int main(int argc, char** argv) {
  CLI::App app{"two-conv step with per-layer pinned algorithms"};
  std::string device = "cuda";
  app.add_option("--device", device, "cpu or cuda[:N]");
  CLI11_PARSE(app, argc, argv);
  try {
    ditto::Policy policy;
    policy.pin("conv1", ditto::ConvBwdFilterAlgo::Algo0).pin("conv2", ditto::ConvBwdFilterAlgo::Algo1);
    ditto::Context ctx(ditto::Device::parse(device), policy);

    ditto::Conv2d conv1(ctx, "conv1", 3, 16, 3, 1, 1), conv2(ctx, "conv2", 16, 10, 3, 1, 1);
    ditto::init_tensor(ctx, conv1.weight.value(), ditto::Init::GlorotUniform, 27, 144, 1, "conv1.weight");
    ditto::init_tensor(ctx, conv2.weight.value(), ditto::Init::GlorotUniform, 144, 90, 1, "conv2.weight");
    ditto::Tensor images = ctx.empty({8, 3, 16, 16});
    ditto::init_tensor(ctx, images, ditto::Init::GlorotNormal, 1, 1, 2, "images");
    std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};

    ditto::Var x(images);
    ditto::Var logits = ditto::global_avg_pool(ctx, conv2(ctx, ditto::relu(ctx, conv1(ctx, x))));
    ditto::Var loss = ditto::softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(labels, {8}));
    ctx.tape().backward(ctx, loss);
    for (ditto::Conv2d* c : {&conv1, &conv2})
      for (ditto::Var* p : {&c->weight, &c->bias}) ditto::axpy_inplace(ctx, p->value(), -0.1f, p->grad());

    std::printf("loss %.6f, conv1.weight grad %s, conv2.weight grad %s\n", loss.value().to_host_f32()[0],
                conv1.weight.grad().fingerprint().hex().c_str(),
                conv2.weight.grad().fingerprint().hex().c_str());
    std::printf("%s\n", ctx.manifest().to_json().c_str());
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "two_conv: %s\n", e.what());
    return 1;
  }
}
