// Spatial transformer on the CPU: central-difference gradient checks of the references in double
// (grid sampling to the input and to the grid, the affine grid to theta, and the chain of both),
// hand-computed values (identity transforms, the two align_corners conventions, zero padding),
// the CPU op against the reference, NaN grids, shape errors, the policy's knobs and mode words,
// the manifest entries and the tape.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/grid_sample.h"
#include "kernels/grid_sample_ref.h"
#include "support.h"

using namespace ditto;

namespace {

ref::GridSampleDims dims(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, bool ac) {
  ref::GridSampleDims d;
  d.n = n, d.c = c, d.h = h, d.w = w, d.oh = oh, d.ow = ow, d.align_corners = ac;
  return d;
}

}  // namespace

TEST_CASE("grid sample reference: gradient check in double, to the input and to the grid") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (bool ac : {false, true}) {
    INFO("align_corners " << ac);
    const auto d = dims(2, 3, 5, 6, 4, 7, ac);
    const std::size_t nx = std::size_t(d.n * d.c * d.h * d.w), ng = std::size_t(d.n * d.oh * d.ow * 2),
                      ny = std::size_t(d.n * d.c * d.oh * d.ow);
    auto x = test::random_vec<double>(nx, seed);
    // Coordinates beyond [-1, 1] too, so zero padding is exercised; a sample within 1e-6 of a
    // pixel line would make the difference quotient straddle a kink, which random doubles do not.
    auto g = test::random_vec<double>(ng, seed + 1, -1.3, 1.3);
    auto w = test::loss_weights(ny, seed);
    std::vector<double> dx(nx), dg(ng);
    ref::grid_sample_bwd(x.data(), g.data(), w.data(), dx.data(), dg.data(), d);
    auto loss_x = [&](const std::vector<double>& xin) {
      std::vector<double> y(ny);
      ref::grid_sample_fwd(xin.data(), g.data(), y.data(), d);
      return test::weighted_sum(y, w);
    };
    auto loss_g = [&](const std::vector<double>& gin) {
      std::vector<double> y(ny);
      ref::grid_sample_fwd(x.data(), gin.data(), y.data(), d);
      return test::weighted_sum(y, w);
    };
    CHECK(test::gradcheck(loss_x, x, dx) < 1e-6);
    CHECK(test::gradcheck(loss_g, g, dg) < 1e-6);
  }
}

TEST_CASE("affine grid reference: gradient check in double, alone and chained into grid sampling") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (bool ac : {false, true}) {
    INFO("align_corners " << ac);
    const int64_t n = 2, h = 5, w = 4;
    auto theta = test::random_vec<double>(n * 6, seed, -1.0, 1.0);
    auto wg = test::loss_weights(n * h * w * 2, seed);
    std::vector<double> dtheta(n * 6);
    ref::affine_grid_bwd(wg.data(), dtheta.data(), n, h, w, ac);
    auto loss = [&](const std::vector<double>& th) {
      std::vector<double> grid(n * h * w * 2);
      ref::affine_grid_fwd(th.data(), grid.data(), n, h, w, ac);
      return test::weighted_sum(grid, wg);
    };
    CHECK(test::gradcheck(loss, theta, dtheta) < 1e-6);

    // theta -> grid -> sample: dtheta through both backward passes.
    const auto d = dims(n, 2, 6, 7, h, w, ac);
    auto x = test::random_vec<double>(std::size_t(d.n * d.c * d.h * d.w), seed + 2);
    auto wy = test::loss_weights(std::size_t(d.n * d.c * d.oh * d.ow), seed + 3);
    auto chain = [&](const std::vector<double>& th) {
      std::vector<double> grid(n * h * w * 2), y(wy.size());
      ref::affine_grid_fwd(th.data(), grid.data(), n, h, w, ac);
      ref::grid_sample_fwd(x.data(), grid.data(), y.data(), d);
      return test::weighted_sum(y, wy);
    };
    std::vector<double> grid(n * h * w * 2), dgrid(grid.size()), dth(n * 6);
    ref::affine_grid_fwd(theta.data(), grid.data(), n, h, w, ac);
    ref::grid_sample_bwd(x.data(), grid.data(), wy.data(), static_cast<double*>(nullptr), dgrid.data(), d);
    ref::affine_grid_bwd(dgrid.data(), dth.data(), n, h, w, ac);
    CHECK(test::gradcheck(chain, theta, dth) < 1e-6);
  }
}

TEST_CASE("grid sample on the CPU: identity transforms return the input, both conventions") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 2, c = 3, h = 5, w = 7;
  auto xv = test::random_vec(std::size_t(n * c * h * w), seed);
  for (bool ac : {false, true}) {
    INFO("align_corners " << ac);
    Var theta(ctx.from_host(std::vector<float>{1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0}, {n, 2, 3}), false);
    Var grid = affine_grid(ctx, "grid", theta, h, w, ac);
    Var y = grid_sample(ctx, "sample", Var(ctx.from_host(xv, {n, c, h, w})), grid, ac);
    // Each identity sample lands on a pixel centre up to float rounding of the grid (a few ulp of
    // coordinates <= 7), so the blend differs from x by at most that fraction of |x| <= 1.
    auto r = test::all_close(y.value().to_host_f32(), xv, 1e-5, 0.0);
    INFO(r.str());
    CHECK(r.ok);
  }
}

TEST_CASE("grid sample on the CPU: hand-computed samples, zero padding and the two conventions") {
  Context ctx;
  // One 2x2 plane [[1, 2], [3, 4]].
  Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 1, 2, 2}), false);
  // Grid points (0, 0) centre, (-1, -1) corner, (1, -1), (2, 0) outside.
  Var g(ctx.from_host(std::vector<float>{0, 0, -1, -1, 1, -1, 2, 0}, {1, 1, 4, 2}), false);
  // align_corners: -1/+1 are the corner pixels' centres. Centre = mean 2.5; (-1,-1) = 1; (1,-1) =
  // 2; x = 2 maps to ix = 1.5 (half on pixel 1, half outside), y = 0 to iy = 0.5: 0.5*(2+4)/2 = 1.5.
  CHECK(grid_sample(ctx, "s", x, g, true).value().to_host_f32() == std::vector<float>{2.5f, 1.f, 2.f, 1.5f});
  // Without: -1/+1 are the outer edges. (-1,-1) -> (-0.5, -0.5): a quarter of pixel (0,0);
  // (1, -1) -> (1.5, -0.5): a quarter of pixel (0, 1); x = 2 -> ix = 2.5: nothing inside.
  CHECK(grid_sample(ctx, "s", x, g, false).value().to_host_f32() == std::vector<float>{2.5f, 0.25f, 0.5f, 0.f});
}

TEST_CASE("grid sample and affine grid on the CPU: the op against the reference, values and gradients") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const auto d = dims(3, 4, 9, 8, 6, 5, false);
  auto thv = test::random_vec(std::size_t(d.n * 6), seed, -1.2, 1.2);
  auto xv = test::random_vec(std::size_t(d.n * d.c * d.h * d.w), seed + 1);
  auto dyv = test::random_vec(std::size_t(d.n * d.c * d.oh * d.ow), seed + 2);
  Var theta(ctx.from_host(thv, {d.n, 2, 3}), true);
  Var x(ctx.from_host(xv, {d.n, d.c, d.h, d.w}), true);
  Var grid = affine_grid(ctx, "grid", theta, d.oh, d.ow, false);
  Var y = grid_sample(ctx, "sample", x, grid, false);
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"grid:affine_grid", "sample:grid_sample"});
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, y.shape()));

  std::vector<float> gref(std::size_t(d.n * d.oh * d.ow * 2)), yref(dyv.size()), dxref(xv.size()),
      dgref(gref.size()), dthref(thv.size());
  ref::affine_grid_fwd(thv.data(), gref.data(), d.n, d.oh, d.ow, false);
  ref::grid_sample_fwd(xv.data(), gref.data(), yref.data(), d);
  ref::grid_sample_bwd(xv.data(), gref.data(), dyv.data(), dxref.data(), dgref.data(), d);
  ref::affine_grid_bwd(dgref.data(), dthref.data(), d.n, d.oh, d.ow, false);
  CHECK(grid.value().to_host_f32() == gref);
  CHECK(y.value().to_host_f32() == yref);
  CHECK(x.grad().to_host_f32() == dxref);
  CHECK(theta.grad().to_host_f32() == dthref);
}

TEST_CASE("grid sample: a NaN grid coordinate gives NaN outputs and grid gradient, not zeros") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 2, 2}), true);
  Var g(ctx.from_host(std::vector<float>{0.f, 0.f, NAN, 0.f}, {1, 1, 2, 2}), true);
  Var y = grid_sample(ctx, "s", x, g, true);
  auto yv = y.value().to_host_f32();
  CHECK(yv[0] == 2.5f);
  CHECK(std::isnan(yv[1]));
  CHECK(yv[2] == 6.5f);
  CHECK(std::isnan(yv[3]));
  ctx.tape().backward(ctx, y);
  auto dg = g.grad().to_host_f32();
  CHECK(std::isfinite(dg[0]));
  CHECK(std::isnan(dg[2]));
  CHECK(std::isnan(dg[3]));
}

TEST_CASE("grid sample and affine grid: shape errors name the op, layer and operand") {
  Context ctx;
  using Catch::Matchers::Contains;
  Var x(ctx.zeros({2, 3, 4, 4}), false);
  CHECK_THROWS_WITH(grid_sample(ctx, "stn", x, Var(ctx.zeros({2, 4, 4, 3})), true),
                    Contains("grid_sample (layer 'stn')") && Contains("{N, OH, OW, 2}"));
  CHECK_THROWS_WITH(grid_sample(ctx, "stn", x, Var(ctx.zeros({1, 4, 4, 2})), true), Contains("batch size 2"));
  CHECK_THROWS_AS(grid_sample(ctx, "stn", Var(ctx.zeros({3, 4, 4})), Var(ctx.zeros({3, 4, 4, 2})), true),
                  ShapeError);
  CHECK_THROWS_WITH(affine_grid(ctx, "loc", Var(ctx.zeros({2, 3, 2})), 4, 4, false),
                    Contains("affine_grid (layer 'loc')") && Contains("{N, 2, 3}"));
  CHECK_THROWS_WITH(affine_grid(ctx, "loc", Var(ctx.zeros({2, 2, 3})), 0, 4, false), Contains("at least 1x1"));
}

TEST_CASE("grid sample and affine grid: knobs, mode words and the manifest") {
  Policy p;
  CHECK(p.variant<GridSampleBwd>("s", op::grid_sample) == GridSampleBwd::Atomic);           // PyTorch's native kernel
  CHECK(p.variant<AffineGridBwd>("g", op::affine_grid) == AffineGridBwd::Deterministic);    // PyTorch's batched GEMM
  p.set("*=deterministic");
  CHECK(p.variant<GridSampleBwd>("s", op::grid_sample) == GridSampleBwd::Deterministic);
  CHECK(p.variant<AffineGridBwd>("g", op::affine_grid) == AffineGridBwd::Deterministic);
  p.set("*=nondeterministic");
  CHECK(p.variant<GridSampleBwd>("s", op::grid_sample) == GridSampleBwd::Atomic);
  CHECK(p.variant<AffineGridBwd>("g", op::affine_grid) == AffineGridBwd::Atomic);
  p.pin("s", GridSampleBwd::Cudnn).pin("g", AffineGridBwd::Cudnn);
  CHECK(p.variant<GridSampleBwd>("s", op::grid_sample) == GridSampleBwd::Cudnn);
  CHECK(p.variant<AffineGridBwd>("g", op::affine_grid) == AffineGridBwd::Cudnn);
  CHECK(p.requested("s", "bwd", op::grid_sample) == "pinned");
  CHECK_THROWS_WITH(Policy::parse({"s.bwd=gather"}).variant<GridSampleBwd>("s", op::grid_sample),
                    Catch::Matchers::Contains("not a variant of bwd") && Catch::Matchers::Contains("deterministic"));
  CHECK(std::string(op_kind_name(op::grid_sample)) == "grid_sample");
  CHECK(std::string(op_kind_name(op::affine_grid)) == "affine_grid");
  // The noise lab's candidates: every variant but ditto's fixed-order one (cuDNN's grid generator
  // backward measured nondeterministic on an H100 although cuDNN does not list it).
  for (const KnobSpec& k : knobs()) {
    if (k.op == op::affine_grid) CHECK(k.nondeterministic() == std::vector<std::string>{"cudnn", "atomic"});
    if (k.op == op::grid_sample) CHECK(k.nondeterministic() == std::vector<std::string>{"cudnn", "atomic"});
  }

  Context ctx(Device::cpu(), Policy::parse({"stn.bwd=cudnn"}));  // the CPU runs its reference whatever is pinned
  Var theta(ctx.from_host(test::random_vec(6, 1), {1, 2, 3}), true);
  Var x(ctx.from_host(test::random_vec(2 * 16, 2), {1, 2, 4, 4}), true);
  Var y = grid_sample(ctx, "stn", x, affine_grid(ctx, "loc", theta, 3, 3, true), true);
  const ManifestEntry* e = ctx.manifest().find("stn", "bwd");
  REQUIRE(e != nullptr);
  CHECK(e->op == "grid_sample");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "pinned");
  CHECK(e->guarantee == Guarantee::RunToRun);
  const ManifestEntry* g = ctx.manifest().find("loc", "bwd");
  REQUIRE(g != nullptr);
  CHECK(g->op == "affine_grid");
  CHECK(g->requested == "heuristic");
  ctx.tape().backward(ctx, y);
  CHECK(theta.grad().defined());
  CHECK(x.grad().defined());

  NoGradGuard guard(ctx);
  Var z = grid_sample(ctx, "stn", x, affine_grid(ctx, "loc", theta, 3, 3, true), true);
  CHECK_FALSE(z.requires_grad());
  CHECK(ctx.tape().size() == 0);
}
