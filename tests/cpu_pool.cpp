// Pooling on the CPU: gradient checks of the reference in double (max, average, global
// average), op values against hand-computed numbers (tie-breaking, padding as -inf, padding
// counted in averages), shape errors, tape integration, the manifest entry, and the no-grad path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/pool.h"
#include "kernels/pool_ref.h"
#include "support.h"

using namespace ditto;

namespace {

// n values without ties and at least 0.005 apart (a random permutation of a spaced grid, with
// jitter), so that the max-pool argmax is stable under the gradient check's 1e-6 steps.
std::vector<double> tie_free(std::size_t n, uint64_t seed) {
  std::vector<std::size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 g(seed);
  std::shuffle(perm.begin(), perm.end(), g);
  auto jitter = test::random_vec<double>(n, seed ^ 0x7177, 0.0, 0.5);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (double(perm[i]) + jitter[i] - double(n) / 2) * 0.01;
  return v;
}

ref::PoolDims dims(int64_t n, int64_t c, int64_t h, int64_t w, const PoolParams& p) {
  ref::PoolDims d;
  d.n = n, d.c = c, d.h = h, d.w = w;
  d.kh = p.kernel_h, d.kw = p.kernel_w, d.sh = p.stride_h, d.sw = p.stride_w, d.ph = p.pad_h, d.pw = p.pad_w;
  Shape o = pool_output_shape({n, c, h, w}, p);
  d.oh = o[2], d.ow = o[3];
  return d;
}

}  // namespace

TEST_CASE("max pool reference: gradient check in double (overlapping, padded, and tiling windows)") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (PoolParams p : {PoolParams{3, 3, 2, 2, 1, 1}, PoolParams{2, 2, 2, 2, 0, 0}, PoolParams{3, 2, 1, 2, 1, 0}}) {
    INFO("kernel " << p.kernel_h << "x" << p.kernel_w << " stride " << p.stride_h << "x" << p.stride_w << " pad "
                   << p.pad_h << "x" << p.pad_w);
    const ref::PoolDims d = dims(2, 3, 7, 6, p);
    const std::size_t nx = std::size_t(d.n * d.c * d.h * d.w), ny = std::size_t(d.n * d.c * d.oh * d.ow);
    auto x = tie_free(nx, seed);
    auto w = test::loss_weights(ny, seed);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(ny);
      ref::max_pool_fwd(in.data(), y.data(), static_cast<int32_t*>(nullptr), d);
      return test::weighted_sum(y, w);
    };
    std::vector<double> y(ny), dx(nx);
    std::vector<int32_t> am(ny);
    ref::max_pool_fwd(x.data(), y.data(), am.data(), d);
    ref::max_pool_bwd(w.data(), am.data(), dx.data(), d);
    CHECK(test::gradcheck(loss, x, dx) < 1e-6);
  }
}

TEST_CASE("avg pool and global avg pool references: gradient check in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (PoolParams p : {PoolParams{3, 3, 2, 2, 1, 1}, PoolParams{2, 3, 1, 2, 1, 1}}) {
    const ref::PoolDims d = dims(2, 2, 6, 7, p);
    const std::size_t nx = std::size_t(d.n * d.c * d.h * d.w), ny = std::size_t(d.n * d.c * d.oh * d.ow);
    auto x = test::random_vec<double>(nx, seed);
    auto w = test::loss_weights(ny, seed);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(ny);
      ref::avg_pool_fwd(in.data(), y.data(), d);
      return test::weighted_sum(y, w);
    };
    std::vector<double> dx(nx);
    ref::avg_pool_bwd(w.data(), dx.data(), d);
    CHECK(test::gradcheck(loss, x, dx) < 1e-6);
  }
  const int64_t planes = 6, hw = 15;
  auto x = test::random_vec<double>(planes * hw, seed);
  auto w = test::loss_weights(planes, seed);
  auto loss = [&](const std::vector<double>& in) {
    std::vector<double> y(planes);
    ref::global_avg_pool_fwd(in.data(), y.data(), planes, hw);
    return test::weighted_sum(y, w);
  };
  std::vector<double> dx(planes * hw);
  ref::global_avg_pool_bwd(w.data(), dx.data(), planes, hw);
  CHECK(test::gradcheck(loss, x, dx) < 1e-6);
}

TEST_CASE("max_pool2d on the CPU: values, first-maximum ties, padding as -inf, gradient routing") {
  Context ctx;
  // One 4x4 plane; 2x2 windows, stride 2.
  std::vector<float> v = {1, 5, 2, 2,   //
                          3, 4, 2, 2,   //
                          -1, -2, 9, 0,  //
                          -3, -4, 0, 9};
  Var x(ctx.from_host(v, {1, 1, 4, 4}), true);
  Var y = max_pool2d(ctx, "pool1", x, PoolParams{});
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  CHECK(y.value().to_host_f32() == std::vector<float>{5, 2, -1, 9});
  ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{10, 20, 30, 40}, {1, 1, 2, 2}));
  // Ties: the window of 2s gives its gradient to the first 2 in row-major order (index 2); the
  // window with two 9s to the first 9 (index 10).
  CHECK(x.grad().to_host_f32() == std::vector<float>{0, 10, 20, 0,  //
                                                     0, 0, 0, 0,    //
                                                     30, 0, 40, 0,  //
                                                     0, 0, 0, 0});

  // Padding counts as -inf: with all-negative input, a padded window still returns a real value.
  Var neg(ctx.from_host(std::vector<float>{-5, -6, -7, -8}, {1, 1, 2, 2}), false);
  Var yp = max_pool2d(ctx, "pool2", neg, PoolParams{2, 2, 1, 1, 1, 1});
  CHECK(yp.shape() == Shape{1, 1, 3, 3});
  CHECK(yp.value().to_host_f32() == std::vector<float>{-5, -5, -6, -5, -5, -6, -7, -7, -8});
}

TEST_CASE("max_pool2d on the CPU: matches the reference on random input, batch and channels") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const PoolParams p{3, 3, 2, 2, 1, 1};
  const ref::PoolDims d = dims(3, 4, 9, 8, p);
  auto xv = test::random_vec(std::size_t(d.n * d.c * d.h * d.w), seed);
  Var x(ctx.from_host(xv, {d.n, d.c, d.h, d.w}), true);
  Var y = max_pool2d(ctx, "p", x, p);
  std::vector<float> want(std::size_t(d.n * d.c * d.oh * d.ow));
  std::vector<int32_t> am(want.size());
  ref::max_pool_fwd(xv.data(), want.data(), am.data(), d);
  CHECK(y.value().to_host_f32() == want);
  auto dyv = test::random_vec(want.size(), seed + 1);
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, y.shape()));
  std::vector<float> dx(xv.size());
  ref::max_pool_bwd(dyv.data(), am.data(), dx.data(), d);
  CHECK(x.grad().to_host_f32() == dx);
}

TEST_CASE("avg_pool2d on the CPU: padding is counted in the divisor") {
  Context ctx;
  Var x(ctx.full({1, 1, 2, 2}, 1.0f), true);
  // 2x2 windows, stride 1, pad 1 over a 2x2 plane of ones: corners see 1 real value, edges 2,
  // the centre 4 — always divided by 4.
  Var y = avg_pool2d(ctx, x, PoolParams{2, 2, 1, 1, 1, 1});
  CHECK(y.shape() == Shape{1, 1, 3, 3});
  CHECK(y.value().to_host_f32() == std::vector<float>{0.25f, 0.5f, 0.25f, 0.5f, 1.0f, 0.5f, 0.25f, 0.5f, 0.25f});
  ctx.tape().backward(ctx, y);
  // Every input is covered by 4 windows: 4 * 1/4.
  CHECK(x.grad().to_host_f32() == std::vector<float>{1, 1, 1, 1});
  CHECK(ctx.manifest().entries().empty());  // no knob, nothing to record
}

TEST_CASE("global_avg_pool on the CPU: N,C,H,W -> N,C, values and gradient") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2}), true);
  Var y = global_avg_pool(ctx, x);
  CHECK(y.shape() == Shape{1, 2});
  CHECK(y.value().to_host_f32() == std::vector<float>{2.5f, 25.0f});
  ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{4, 8}, {1, 2}));
  CHECK(x.grad().to_host_f32() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2});
  CHECK_THROWS_AS(global_avg_pool(ctx, Var(ctx.zeros({2, 3}))), ShapeError);
}

TEST_CASE("pooling: shape and parameter errors name the op, layer and problem") {
  Context ctx;
  Var x4(ctx.zeros({1, 1, 4, 4}), false);
  CHECK_THROWS_WITH(max_pool2d(ctx, "poolA", Var(ctx.zeros({1, 4, 4})), PoolParams{}),
                    Catch::Matchers::Contains("poolA") && Catch::Matchers::Contains("4 dimensions"));
  CHECK_THROWS_AS(max_pool2d(ctx, "poolA", x4, PoolParams{2, 2, 2, 2, 2, 0}), ShapeError);
  CHECK_THROWS_WITH(max_pool2d(ctx, "poolA", x4, PoolParams{2, 2, 2, 2, 2, 0}),
                    Catch::Matchers::Contains("0 <= pad < kernel"));
  CHECK_THROWS_WITH(max_pool2d(ctx, "poolA", x4, PoolParams{2, 2, 0, 2, 0, 0}), Catch::Matchers::Contains("stride"));
  CHECK_THROWS_WITH(avg_pool2d(ctx, x4, PoolParams{5, 5, 1, 1, 0, 0}),
                    Catch::Matchers::Contains("avg_pool2d") && Catch::Matchers::Contains("smaller than the kernel"));
  CHECK_THROWS_AS(avg_pool2d(ctx, Var(ctx.zeros({1, 1, 4, 4}, DType::I32)), PoolParams{}), ShapeError);
  CHECK(pool_output_shape({2, 3, 56, 56}, PoolParams{3, 3, 2, 2, 1, 1}) == Shape{2, 3, 28, 28});
  CHECK(pool_output_shape({1, 1, 7, 7}, PoolParams{2, 2, 2, 2, 0, 0}) == Shape{1, 1, 3, 3});
}

TEST_CASE("max_pool2d: manifest records the bwd knob, the ask and what ran") {
  Context ctx;
  Var x(ctx.from_host(test::random_vec(64, 3), {1, 1, 8, 8}), true);
  Var y = max_pool2d(ctx, "pool1", x, PoolParams{});
  const ManifestEntry* e = ctx.manifest().find("pool1", "bwd");
  REQUIRE(e != nullptr);
  CHECK(e->op == "maxpool2d");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "heuristic");
  CHECK(e->deterministic == Determinism::Yes);
  CHECK(e->device == "cpu");
  ctx.policy().set("*=deterministic");
  max_pool2d(ctx, "pool1", x, PoolParams{});
  CHECK(ctx.manifest().find("pool1", "bwd")->requested == "deterministic");
  ctx.policy().pin("pool1", PoolBwd::AtomicScatter);
  CHECK(ctx.policy().variant<PoolBwd>("pool1", op::maxpool2d) == PoolBwd::AtomicScatter);
  max_pool2d(ctx, "pool1", x, PoolParams{});
  CHECK(ctx.manifest().find("pool1", "bwd")->requested == "pinned");
  CHECK(ctx.manifest().entries().size() == 1);
}

TEST_CASE("pooling on the tape: chains, accumulates, and records nothing without grad") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  auto xv = test::random_vec(2 * 3 * 8 * 8, seed);
  Var x(ctx.from_host(xv, {2, 3, 8, 8}), true);
  // max pool -> avg pool -> global avg pool on the tape, then the same again without zero_grad.
  auto run = [&] { return global_avg_pool(ctx, avg_pool2d(ctx, max_pool2d(ctx, "m", x, PoolParams{}), PoolParams{})); };
  Var y = run();
  CHECK(y.shape() == Shape{2, 3});
  CHECK(ctx.tape().size() == 3);
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"m:maxpool2d", ":avg_pool2d", ":global_avg_pool"});
  ctx.tape().backward(ctx, y);
  auto g1 = x.grad().to_host_f32();
  // The 8x8 plane -> 4x4 (max) -> 2x2 (avg, 1/4 each) -> mean of 4 (1/4 each): each window
  // maximum gets 1/16, the other three inputs of its window 0.
  int nonzero = 0;
  for (float g : g1) {
    CHECK((g == 0.0f || g == 1.0f / 16));
    nonzero += g != 0.0f;
  }
  CHECK(nonzero == 2 * 3 * 16);
  Var y2 = run();
  ctx.tape().backward(ctx, y2);
  auto g2 = x.grad().to_host_f32();
  for (std::size_t i = 0; i < g1.size(); ++i) CHECK(g2[i] == 2 * g1[i]);

  NoGradGuard guard(ctx);
  Var z = max_pool2d(ctx, "m", x, PoolParams{});
  CHECK_FALSE(z.requires_grad());
  CHECK(ctx.tape().size() == 0);
  Var z2 = global_avg_pool(ctx, avg_pool2d(ctx, x, PoolParams{}));
  CHECK_FALSE(z2.requires_grad());
  CHECK(ctx.tape().size() == 0);
}
