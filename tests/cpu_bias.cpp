// Bias add on the CPU: gradient checks of the reference in double, op values, errors (shapes,
// bias_bwd=cudnn where it cannot run), the manifest and tape integration.
#include <catch2/catch.hpp>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/bias.h"
#include "kernels/bias_ref.h"
#include "support.h"
#include "kernels/pool.h"

using namespace ditto;

TEST_CASE("bias reference: gradient check in double for x and b, 2-D and 4-D") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (auto [n, c, s] : {std::tuple<int64_t, int64_t, int64_t>{3, 4, 1}, {2, 3, 6}}) {
    auto x = test::random_vec<double>(n * c * s, seed);
    auto b = test::random_vec<double>(c, seed + 1);
    auto dy = test::loss_weights(n * c * s, seed);
    auto run = [&](const std::vector<double>& xv, const std::vector<double>& bv) {
      std::vector<double> y(n * c * s);
      ref::bias_fwd(xv.data(), bv.data(), y.data(), n, c, s);
      return test::weighted_sum(y, dy);
    };
    std::vector<double> db(c);
    ref::bias_bwd_db(dy.data(), db.data(), n, c, s);
    CHECK(test::gradcheck([&](const std::vector<double>& v) { return run(v, b); }, x, dy) < 1e-6);  // dx = dy
    CHECK(test::gradcheck([&](const std::vector<double>& v) { return run(x, v); }, b, db) < 1e-6);
  }
}

TEST_CASE("bias: CPU op values broadcast over N and spatial positions") {
  Context ctx;
  Var x(ctx.zeros({2, 3, 1, 2}));
  Var b(ctx.from_host(std::vector<float>{1, 2, 3}, {3}));
  Var y = bias_add(ctx, "conv1", op::conv2d, x, b);
  CHECK(y.value().to_host_f32() == std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  Var y2 = bias_add(ctx, "fc", op::linear, Var(ctx.full({2, 3}, 0.5f)), b);
  CHECK(y2.value().to_host_f32() == std::vector<float>{1.5f, 2.5f, 3.5f, 1.5f, 2.5f, 3.5f});
}

TEST_CASE("bias: errors name the layer, the shapes and what is supported") {
  Context ctx;
  Var b3(ctx.zeros({3}));
  CHECK_THROWS_WITH(bias_add(ctx, "fc2", op::linear, Var(ctx.zeros({4, 5})), b3),
                    Catch::Matchers::Contains("fc2") && Catch::Matchers::Contains("[3]") &&
                        Catch::Matchers::Contains("[4, 5]"));
  CHECK_THROWS_AS(bias_add(ctx, "fc2", op::linear, Var(ctx.zeros({4, 5})), b3), ShapeError);
  CHECK_THROWS_AS(bias_add(ctx, "c", op::conv2d, Var(ctx.zeros({4, 3, 2})), b3), ShapeError);
  CHECK_THROWS_AS(bias_add(ctx, "c", op::conv2d, Var(ctx.zeros({4, 3})), Var(ctx.zeros({3, 1}))), ShapeError);
  CHECK_THROWS_AS(bias_add(ctx, "p", op::maxpool2d, Var(ctx.zeros({4, 3})), b3), Error);

  // cudnn is not a bias_bwd variant of a linear layer: the policy refuses it for that layer.
  Context lin(Device::cpu(), Policy::parse({"fc1.bias_bwd=cudnn"}));
  CHECK_THROWS_AS(bias_add(lin, "fc1", op::linear, Var(lin.zeros({2, 3})), Var(lin.zeros({3}))), PolicyError);
  // *.bias_bwd=cudnn is meant for conv layers; a linear layer keeps its own default (atomic).
  Context wild(Device::cpu(), Policy::parse({"*.bias_bwd=cudnn"}));
  CHECK(wild.policy().variant<BiasBwd>("fc1", op::linear) == BiasBwd::Atomic);
  // A conv-kind layer pinned to cudnn with a 2-D x cannot run cudnnConvolutionBackwardBias.
  Context conv(Device::cpu(), Policy::parse({"conv1.bias_bwd=cudnn"}));
  CHECK_THROWS_AS(bias_add(conv, "conv1", op::conv2d, Var(conv.zeros({2, 3})), Var(conv.zeros({3}))), PolicyError);
  CHECK_THROWS_WITH(bias_add(conv, "conv1", op::conv2d, Var(conv.zeros({2, 3})), Var(conv.zeros({3}))),
                    Catch::Matchers::Contains("conv1") && Catch::Matchers::Contains("[2, 3]") &&
                        Catch::Matchers::Contains("atomic, deterministic"));
}

TEST_CASE("bias: tape gives dx = dy as a fresh tensor and db = sums; the manifest names the owning layer") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cpu(), Policy::parse({"conv1.bias_bwd=deterministic"}));
  const int64_t n = 3, c = 4, h = 2, w = 5;
  auto xv = test::random_vec(n * c * h * w, seed), bv = test::random_vec(c, seed + 1);
  auto dyv = test::random_vec(n * c * h * w, seed + 2);
  Var x(ctx.from_host(xv, {n, c, h, w}), true), b(ctx.from_host(bv, {c}), true);
  Var y = bias_add(ctx, "conv1", op::conv2d, x, b);
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"conv1:bias_add"});
  Tensor seed_grad = ctx.from_host(dyv, {n, c, h, w});
  ctx.tape().backward(ctx, y, seed_grad);
  CHECK(x.grad().to_host_f32() == dyv);
  CHECK(detail::storage_of(x.grad()) != detail::storage_of(y.grad()));  // a copy: accumulating into dx must not touch dy
  std::vector<float> want_db(c);
  ref::bias_bwd_db(dyv.data(), want_db.data(), n, c, h * w);
  CHECK(b.grad().to_host_f32() == want_db);
  const ManifestEntry* m = ctx.manifest().find("conv1", "bias_bwd");
  REQUIRE(m);
  CHECK(m->op == "conv2d");
  CHECK(m->variant == "reference");
  CHECK(m->requested == "deterministic");

  // Only b requires grad; the linear kind records op "linear".
  Var x2(ctx.from_host(test::random_vec(6, seed), {2, 3})), b2(ctx.zeros({3}), true);
  ctx.tape().backward(ctx, bias_add(ctx, "fc", op::linear, x2, b2));  // seed: ones
  CHECK_FALSE(x2.grad().defined());
  CHECK(b2.grad().to_host_f32() == std::vector<float>{2, 2, 2});
  CHECK(ctx.manifest().find("fc", "bias_bwd")->op == "linear");
}
