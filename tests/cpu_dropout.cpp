// Dropout on the CPU: gradient check in double with the mask fixed, values, replay and variation
// of the mask with (seed, step, layer), the dropped fraction, errors, identity cases, the tape.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/dropout.h"
#include "kernels/dropout_ref.h"
#include "support.h"

using namespace ditto;

TEST_CASE("dropout reference: gradient check in double for x (the mask is fixed by the key)") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 50;
  const float p = 0.3f;
  const uint64_t key = dropout_key(seed, 4, "drop1");
  auto x = test::random_vec<double>(n, seed);
  auto dy = test::loss_weights(n, seed);
  std::vector<double> dx(n);
  ref::dropout_bwd(dy.data(), dx.data(), n, p, key);
  auto loss = [&](const std::vector<double>& v) {
    std::vector<double> y(n);
    ref::dropout_fwd(v.data(), y.data(), n, p, key);
    return test::weighted_sum(y, dy);
  };
  CHECK(test::gradcheck(loss, x, dx) < 1e-6);
  int dropped = 0;
  for (int64_t i = 0; i < n; ++i) dropped += ref::dropout_dropped(key, i, p);
  CHECK(dropped > 0);  // the check above covered both kinds of element
  CHECK(dropped < n);
}

TEST_CASE("dropout: values are 0 or x / (1 - p), matching the mask, bit for bit") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 1003;  // not a multiple of 4: the last Philox block is partly used
  const float p = 0.4f, scale = 1.0f / (1.0f - p);
  auto xv = test::random_vec(n, seed);
  Var y = dropout(ctx, "drop1", Var(ctx.from_host(xv, {n})), p, seed, 11, true);
  auto yv = y.value().to_host_f32();
  const uint64_t key = dropout_key(seed, 11, "drop1");
  for (int64_t i = 0; i < n; ++i) {
    if (ref::dropout_dropped(key, i, p))
      CHECK(yv[i] == 0.0f);
    else
      CHECK(yv[i] == xv[i] * scale);
  }
}

TEST_CASE("dropout: the mask replays for the same (seed, step, layer) and changes with each") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 4096;
  Var x(ctx.full({n}, 1.0f));
  auto run = [&](uint64_t s, uint64_t step, const std::string& layer) {
    return dropout(ctx, layer, x, 0.5f, s, step, true).value().fingerprint();
  };
  const Fingerprint base = run(seed, 5, "drop1");
  CHECK(run(seed, 5, "drop1") == base);
  CHECK(run(seed + 1, 5, "drop1") != base);
  CHECK(run(seed, 6, "drop1") != base);
  CHECK(run(seed, 5, "drop2") != base);
  // (With n = 4096 and p = 0.5 two independent masks coincide with probability 2^-4096.)
}

TEST_CASE("dropout: the dropped fraction is near p on 1e5 elements") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 100000;
  Var x(ctx.full({n}, 1.0f));
  for (float p : {0.1f, 0.5f, 0.9f}) {
    auto y = dropout(ctx, "drop", x, p, seed, 0, true).value().to_host_f32();
    int64_t dropped = 0;
    for (float v : y) dropped += v == 0.0f;
    // The count is Binomial(n, p') with p' = P(uniform24 < p) = ceil(p * 2^24) / 2^24, within
    // 2^-24 of p. Its standard deviation is sqrt(n p (1-p)) <= 158; a 6-sigma band fails a correct
    // mask with probability < 2e-9 (normal tail; n p (1-p) >= 9000, so the normal approximation is
    // good), while a mask off by even 1% in rate (1000 elements) fails it.
    const double sigma = std::sqrt(n * double(p) * (1 - double(p)));
    INFO("p " << p << " dropped " << dropped << " sigma " << sigma);
    CHECK(std::fabs(dropped - n * double(p)) < 6 * sigma);
  }
}

TEST_CASE("dropout: p outside [0, 1) is an error; p = 0 and evaluation are the identity") {
  Context ctx;
  Var x(ctx.full({8}, 2.0f), true);
  CHECK_THROWS_AS(dropout(ctx, "drop", x, 1.0f, 1, 1, true), Error);
  CHECK_THROWS_WITH(dropout(ctx, "drop", x, -0.1f, 1, 1, true),
                    Catch::Matchers::Contains("drop") && Catch::Matchers::Contains("[0, 1)"));
  CHECK_THROWS_AS(dropout(ctx, "drop", x, std::nanf(""), 1, 1, true), Error);
  CHECK_THROWS_AS(dropout(ctx, "drop", x, 1.5f, 1, 1, false), Error);  // checked even when not training
  CHECK(dropout(ctx, "drop", x, 0.5f, 1, 1, false).node() == x.node());
  CHECK(dropout(ctx, "drop", x, 0.0f, 1, 1, true).node() == x.node());
  CHECK(ctx.tape().size() == 0);
  CHECK_THROWS_AS(dropout(ctx, "drop", Var(ctx.zeros({4}, DType::I32)), 0.5f, 1, 1, true), ShapeError);
}

TEST_CASE("dropout: the tape passes dy through the same mask and scale") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 257;
  const float p = 0.2f;
  auto xv = test::random_vec(n, seed), dyv = test::random_vec(n, seed + 1);
  Var x(ctx.from_host(xv, {n}), true);
  Var y = dropout(ctx, "drop3", x, p, seed, 2, true);
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"drop3:dropout"});
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, {n}));
  std::vector<float> want(n);
  ref::dropout_bwd(dyv.data(), want.data(), n, p, dropout_key(seed, 2, "drop3"));
  CHECK(x.grad().to_host_f32() == want);
  auto yv = y.value().to_host_f32(), gv = x.grad().to_host_f32();
  for (int64_t i = 0; i < n; ++i) CHECK((yv[i] == 0.0f) == (gv[i] == 0.0f || xv[i] == 0.0f));
}
