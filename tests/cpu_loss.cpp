// Softmax cross-entropy on the CPU: gradient check of the reference in double, op values and
// stability, label errors naming the example, the manifest and tape integration.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/loss.h"
#include "kernels/loss_ref.h"
#include "support.h"

using namespace ditto;

TEST_CASE("softmax-xent reference: gradient check in double for the logits") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 6, c = 5;
  auto logits = test::random_vec<double>(n * c, seed, -3, 3);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((seed + 7 * i) % c);
  const double dl = 1.7;  // a non-unit upstream gradient
  std::vector<double> g(n * c);
  ref::softmax_xent_bwd(logits.data(), labels.data(), n, c, dl, g.data());
  auto loss = [&](const std::vector<double>& v) { return dl * ref::softmax_xent_fwd(v.data(), labels.data(), n, c); };
  CHECK(test::gradcheck(loss, logits, g) < 1e-6);
}

TEST_CASE("softmax-xent: CPU values, including logits that would overflow exp") {
  Context ctx;
  // Two equal logits: loss log 2. A 1000-vs-0 row whose label is the small one: loss 1000 exactly
  // in float, no inf from exp(1000).
  Var a(ctx.from_host(std::vector<float>{0, 0}, {1, 2}));
  CHECK(softmax_cross_entropy(ctx, "loss", a, ctx.from_host(std::vector<int32_t>{0}, {1})).value().to_host_f32()[0] ==
        Approx(std::log(2.0)).epsilon(1e-7));
  Var big(ctx.from_host(std::vector<float>{1000, 0, -1000, 0}, {2, 2}));
  Var l = softmax_cross_entropy(ctx, "loss", big, ctx.from_host(std::vector<int32_t>{1, 1}, {2}));
  CHECK(l.shape() == Shape{1});
  // row 0: 1000 - 0; row 1: log(1 + e^-1000) ~ 0. Mean 500.
  CHECK(l.value().to_host_f32()[0] == 500.0f);

  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 13, c = 11;
  auto v = test::random_vec(n * c, seed, -4, 4);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((seed + 5 * i) % c);
  float got = softmax_cross_entropy(ctx, "loss", Var(ctx.from_host(v, {n, c})), ctx.from_host(labels, {n}))
                  .value().to_host_f32()[0];
  double want = ref::softmax_xent_fwd(v.data(), labels.data(), n, c);
  CHECK(std::fabs(got - want) <= 0x1p-24 * std::fabs(want));  // double accumulation, one rounding
}

TEST_CASE("softmax-xent: errors; an out-of-range label names the example and the label") {
  Context ctx;
  Var logits(ctx.zeros({4, 10}));
  auto labels = [&](std::vector<int32_t> v) { return ctx.from_host(v, {int64_t(v.size())}); };
  CHECK_THROWS_AS(softmax_cross_entropy(ctx, "loss", logits, labels({1, 2, 10, 3})), DataError);
  CHECK_THROWS_WITH(softmax_cross_entropy(ctx, "loss", logits, labels({1, 2, 10, 3})),
                    Catch::Matchers::Contains("example 2") && Catch::Matchers::Contains("label 10") &&
                        Catch::Matchers::Contains("[0, 10)"));
  CHECK_THROWS_WITH(softmax_cross_entropy(ctx, "loss", logits, labels({-1, 2, 3, 3})),
                    Catch::Matchers::Contains("example 0") && Catch::Matchers::Contains("label -1"));
  CHECK_THROWS_AS(softmax_cross_entropy(ctx, "loss", logits, labels({1, 2, 3})), ShapeError);
  CHECK_THROWS_AS(softmax_cross_entropy(ctx, "loss", logits, ctx.zeros({4})), ShapeError);  // f32 labels
  CHECK_THROWS_AS(softmax_cross_entropy(ctx, "loss", Var(ctx.zeros({4, 10, 1})), labels({1, 2, 3, 4})), ShapeError);
  CHECK_THROWS_AS(softmax_cross_entropy(ctx, "loss", Var(ctx.zeros({0, 10})), ctx.zeros({0}, DType::I32)), ShapeError);
  CHECK_THROWS_AS(softmax_cross_entropy(ctx, "loss", logits, Tensor()), ShapeError);
}

TEST_CASE("softmax-xent: tape scales by the upstream gradient and accumulates; manifest entry") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cpu(), Policy::parse({"loss.reduce=deterministic"}));
  const int64_t n = 7, c = 4;
  auto v = test::random_vec(n * c, seed, -2, 2);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((seed + i) % c);
  Var logits(ctx.from_host(v, {n, c}), true);
  Var l = softmax_cross_entropy(ctx, "loss", logits, ctx.from_host(labels, {n}));
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"loss:softmax_xent"});
  ctx.tape().backward(ctx, l, ctx.from_host(std::vector<float>{2.0f}, {1}));
  std::vector<float> want(n * c);
  ref::softmax_xent_bwd(v.data(), labels.data(), n, c, 2.0, want.data());
  CHECK(logits.grad().to_host_f32() == want);
  // Each row of the gradient sums to zero (softmax sums to one, the one-hot to one).
  auto g = logits.grad().to_host_f32();
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += g[i * c + j];
    CHECK(std::fabs(s) < 1e-6);
  }
  const ManifestEntry* m = ctx.manifest().find("loss", "reduce");
  REQUIRE(m);
  CHECK(m->op == "softmax_xent");
  CHECK(m->variant == "reference");
  CHECK(m->requested == "deterministic");
  // Without requires_grad nothing is recorded.
  softmax_cross_entropy(ctx, "loss", Var(ctx.from_host(v, {n, c})), ctx.from_host(labels, {n}));
  CHECK(ctx.tape().size() == 0);
}
