// Batch-invariant evaluation on the GPU (experiments/train.h batch_invariant_rules): a test
// example's logits are the same bits whatever the evaluation batch's size (1, 7, 128, 1000) and
// wherever the example sits in it, for SmallCNN, ResNet-18 and ResNet-50; and ditto-direct's
// forward, op by op, gives each image of a batch the bits it gets alone. Under the framework-default
// kernels (heuristic: cuDNN's and cuBLAS's per-size picks) the same comparison is printed, not
// asserted: whether cuDNN changes an example's bits with the batch is cuDNN's business, and the
// line shows what the mode is for.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "batch_invariance.h"
#include "engine/context.h"
#include "engine/policy.h"
#include "experiments/train.h"
#include "kernels/conv2d.h"

using namespace ditto;

namespace {

Policy invariant_policy() {
  Policy p = Policy::parse({"*=heuristic"});
  for (const std::string& r : batch_invariant_rules()) p.set(r);
  return p;
}

struct Model {
  const char* name;
  int side;
};

}  // namespace

TEST_CASE("gpu batch invariance: ditto-direct's forward gives an image the same bits alone and in any batch") {
  Context ctx(Device::cuda(0), Policy::parse({"*.fwd=ditto-direct"}));
  struct Case {
    Shape x, w;
    Conv2dParams p;
  };
  const Case cases[] = {
      {{9, 3, 33, 31}, {64, 3, 7, 7}, {2, 2, 3, 3, 1, 1, 1}},    // a stem: stride 2, 7x7
      {{9, 70, 14, 14}, {130, 70, 3, 3}, {1, 1, 1, 1, 1, 1, 1}}, // off the 64-wide tiles
      {{9, 64, 8, 8}, {64, 64, 1, 1}, {1, 1, 0, 0, 1, 1, 1}},    // pointwise
      {{9, 32, 12, 12}, {32, 8, 3, 3}, {1, 1, 2, 2, 2, 2, 4}},   // grouped, dilated
      {{9, 24, 10, 10}, {24, 1, 3, 3}, {2, 2, 1, 1, 1, 1, 24}},  // depthwise, stride 2
  };
  for (const Case& c : cases) {
    const std::vector<float> xv = test::random_vec(std::size_t(shape_numel(c.x)), 21),
                             wv = test::random_vec(std::size_t(shape_numel(c.w)), 22);
    const Tensor w = ctx.from_host(wv, c.w);
    const std::vector<float> full = conv2d_forward(ctx, "c", ctx.from_host(xv, c.x), w, c.p).to_host_f32();
    const int64_t per_x = shape_numel(c.x) / c.x[0], per_y = int64_t(full.size()) / c.x[0];
    for (int64_t img = 0; img < c.x[0]; ++img) {
      Shape one = c.x;
      one[0] = 1;
      const std::vector<float> x1(xv.begin() + img * per_x, xv.begin() + (img + 1) * per_x);
      const std::vector<float> y1 = conv2d_forward(ctx, "c", ctx.from_host(x1, one), w, c.p).to_host_f32();
      INFO("x " << shape_str(c.x) << " w " << shape_str(c.w) << " image " << img);
      CHECK(std::memcmp(y1.data(), full.data() + img * per_y, sizeof(float) * per_y) == 0);
    }
    const ManifestEntry* e = ctx.manifest().find("c", "fwd");
    REQUIRE(e);
    CHECK(e->variant == "ditto-direct");
    CHECK(e->guarantee == Guarantee::GpuToGpu);
    CHECK(e->workspace_bytes == 0);
  }
}

TEST_CASE("gpu batch invariance: SmallCNN, ResNet-18 and ResNet-50 logits are the same bits in batches of 1, 7, 128 and 1000") {
  const int64_t n = 1000;
  const std::vector<test::EvalPass> passes = {
      {1000, test::identity_order(n)}, {1, test::identity_order(n)},   {7, test::identity_order(n)},
      {128, test::identity_order(n)},  {128, test::strided_order(n, 7, 3)}, {7, test::strided_order(n, 13, 5)},
  };
  for (Model m : {Model{"smallcnn", 32}, Model{"resnet18", 32}, Model{"resnet50", 64}}) {
    INFO(m.name);
    const Shape one{3, m.side, m.side};
    const std::vector<float> images = test::random_vec(std::size_t(n * shape_numel(one)), 31);
    for (bool invariant : {true, false}) {
      Context ctx(Device::cuda(0), invariant ? invariant_policy() : Policy::parse({"*=heuristic"}));
      auto net = make_net(ctx, {m.name, 10, 3});
      net->init(ctx, 5);
      const auto t0 = std::chrono::steady_clock::now();
      const test::InvarianceReport rep = test::compare_passes(ctx, *net, images, one, passes, 10);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("BATCHINV %s %s: %lld of %lld examples' logits differ bitwise across batches 1000, 1, 7, 128 and "
                  "two permuted orders%s%s (%.1f s)\n",
                  m.name, invariant ? "batch-invariant" : "heuristic", static_cast<long long>(rep.differing),
                  static_cast<long long>(rep.examples), rep.first_difference.empty() ? "" : "; first: ",
                  rep.first_difference.c_str(), s);
      if (!invariant) continue;
      INFO(rep.first_difference);
      CHECK(rep.differing == 0);
      for (const auto& e : ctx.manifest().entries()) {
        INFO(e.layer << "." << e.knob << "=" << e.variant);
        if (e.op == "conv2d" && e.knob == "fwd") CHECK(e.variant == "ditto-direct");
        if (e.op == "linear" && e.knob == "gemm") CHECK(e.variant == "ditto");
        if (e.op == "batchnorm" && e.knob == "bwd") CHECK(e.variant == "deterministic");
      }
    }
  }
}
