// conv2d on the CPU: gradient checks of the reference in double (stride, padding, dilation,
// groups, non-square everything), the op against the reference, shape errors, the tape, and
// the policy/manifest on the CPU's single path.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/conv2d.h"
#include "kernels/conv2d_ref.h"
#include "support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

struct Config {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

Conv2dParams make(int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
  Conv2dParams p;
  p.stride_h = sh, p.stride_w = sw, p.pad_h = ph, p.pad_w = pw, p.dilation_h = dh, p.dilation_w = dw, p.groups = groups;
  return p;
}

const std::vector<Config>& configs() {
  static const std::vector<Config> c = {
      {"3x3 stride 2 pad 1", {2, 3, 7, 6}, {4, 3, 3, 3}, make(2, 2, 1, 1, 1, 1, 1)},
      {"non-square kernel, stride 1x2, pad 1x0", {2, 3, 6, 7}, {5, 3, 2, 3}, make(1, 2, 1, 0, 1, 1, 1)},
      {"dilation 2 pad 2", {1, 2, 9, 9}, {3, 2, 3, 3}, make(1, 1, 2, 2, 2, 2, 1)},
      {"groups 2 pad 1", {2, 4, 6, 6}, {6, 2, 3, 3}, make(1, 1, 1, 1, 1, 1, 2)},
      {"groups 3, stride 2x1, pad 1x2, dilation 1x2, 3x2 kernel", {2, 6, 8, 7}, {6, 2, 3, 2}, make(2, 1, 1, 2, 1, 2, 3)},
      {"1x1", {2, 4, 5, 3}, {3, 4, 1, 1}, make(1, 1, 0, 0, 1, 1, 1)},
  };
  return c;
}

std::vector<double> ref_fwd(const Config& c, const std::vector<double>& x, const std::vector<double>& w) {
  auto g = ref::conv2d_geom(c.x, c.w, c.p);
  std::vector<double> y(static_cast<std::size_t>(g.N * g.K * g.Ho * g.Wo));
  ref::conv2d_fwd(g, x.data(), w.data(), y.data());
  return y;
}

}  // namespace

TEST_CASE("conv2d: output shape formula with stride, padding and dilation") {
  CHECK(conv2d_output_shape("c", {4, 8, 16, 16}, {16, 8, 3, 3}, make(1, 1, 1, 1, 1, 1, 1)) == Shape{4, 16, 16, 16});
  CHECK(conv2d_output_shape("c", {4, 8, 16, 16}, {16, 8, 3, 3}, make(2, 2, 1, 1, 1, 1, 1)) == Shape{4, 16, 8, 8});
  // dilation 2: the 3x3 kernel spans 5x5; (16 + 4 - 5)/1 + 1 = 16
  CHECK(conv2d_output_shape("c", {4, 8, 16, 16}, {16, 8, 3, 3}, make(1, 1, 2, 2, 2, 2, 1)) == Shape{4, 16, 16, 16});
  // non-square: H (7 + 2 - 3)/2 + 1 = 4, W (6 + 0 - 2)/1 + 1 = 5
  CHECK(conv2d_output_shape("c", {1, 4, 7, 6}, {2, 2, 3, 2}, make(2, 1, 1, 0, 1, 1, 2)) == Shape{1, 2, 4, 5});
}

TEST_CASE("conv2d reference: gradient check in double of x and w") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const auto& c : configs()) {
    INFO("config " << c.name);
    auto g = ref::conv2d_geom(c.x, c.w, c.p);
    auto x = test::random_vec<double>(static_cast<std::size_t>(shape_numel(c.x)), seed);
    auto w = test::random_vec<double>(static_cast<std::size_t>(shape_numel(c.w)), seed + 1);
    auto y = ref_fwd(c, x, w);
    auto lw = test::loss_weights(y.size(), seed);  // dL/dy
    std::vector<double> dx(x.size()), dw(w.size());
    ref::conv2d_bwd_data(g, lw.data(), w.data(), dx.data());
    ref::conv2d_bwd_filter(g, x.data(), lw.data(), dw.data());
    auto loss_x = [&](const std::vector<double>& xv) { return test::weighted_sum(ref_fwd(c, xv, w), lw); };
    auto loss_w = [&](const std::vector<double>& wv) { return test::weighted_sum(ref_fwd(c, x, wv), lw); };
    CHECK(test::gradcheck(loss_x, x, dx) < 1e-6);
    CHECK(test::gradcheck(loss_w, w, dw) < 1e-6);
  }
}

TEST_CASE("conv2d reference: a hand-computed value") {
  // x 1x1x3x3 = 1..9, w 1x1x2x2 = [1 0; 0 -1], stride 1, pad 0: y = x[i][j] - x[i+1][j+1] = -4 everywhere.
  Context ctx;
  Tensor x = ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = ctx.from_host(std::vector<float>{1, 0, 0, -1}, {1, 1, 2, 2});
  CHECK(conv2d_forward(ctx, "c", x, w, {}).to_host_f32() == std::vector<float>{-4, -4, -4, -4});
  // pad 1 corner: y[0][0] sees only x[0][0] through w[1][1] = -1.
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  CHECK(conv2d_forward(ctx, "c", x, w, p).to_host_f32()[0] == -1.f);
}

TEST_CASE("conv2d CPU op: values equal the double reference rounded once, in every direction") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  for (const auto& c : configs()) {
    INFO("config " << c.name);
    auto g = ref::conv2d_geom(c.x, c.w, c.p);
    auto xf = test::random_vec(static_cast<std::size_t>(shape_numel(c.x)), seed);
    auto wf = test::random_vec(static_cast<std::size_t>(shape_numel(c.w)), seed + 1);
    Shape ys = conv2d_output_shape("c", c.x, c.w, c.p);
    auto dyf = test::random_vec(static_cast<std::size_t>(shape_numel(ys)), seed + 2);
    Tensor x = ctx.from_host(xf, c.x), w = ctx.from_host(wf, c.w), dy = ctx.from_host(dyf, ys);
    // Products of floats are exact in double and the sums run in the same order, so the float
    // op must equal the double reference rounded to float, bit for bit.
    auto xd = test::to_double(xf), wd = test::to_double(wf), dyd = test::to_double(dyf);
    std::vector<double> y(static_cast<std::size_t>(shape_numel(ys))), dx(xd.size()), dw(wd.size());
    ref::conv2d_fwd(g, xd.data(), wd.data(), y.data());
    ref::conv2d_bwd_data(g, dyd.data(), wd.data(), dx.data());
    ref::conv2d_bwd_filter(g, xd.data(), dyd.data(), dw.data());
    auto rounded = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    CHECK(conv2d_forward(ctx, "c", x, w, c.p).to_host_f32() == rounded(y));
    CHECK(conv2d_backward_data(ctx, "c", dy, w, c.x, c.p).to_host_f32() == rounded(dx));
    CHECK(conv2d_backward_filter(ctx, "c", x, dy, c.w, c.p).to_host_f32() == rounded(dw));
  }
}

TEST_CASE("conv2d: shape errors name the layer, the problem and the shapes") {
  Context ctx;
  auto err = [&](Shape xs, Shape ws, Conv2dParams p) -> std::string {
    try {
      Var x(ctx.zeros(xs)), w(ctx.zeros(ws));
      conv2d(ctx, "conv7", x, w, p);
    } catch (const ShapeError& e) {
      return e.what();
    }
    return "no error";
  };
  Conv2dParams g2;
  g2.groups = 2;
  CHECK_THAT(err({2, 3, 8, 8}, {4, 1, 3, 3}, g2),
             Contains("conv7") && Contains("C = 3 is not divisible by groups = 2") && Contains("[2, 3, 8, 8]"));
  CHECK_THAT(err({2, 4, 8, 8}, {3, 2, 3, 3}, g2), Contains("K = 3 is not divisible by groups = 2") && Contains("[3, 2, 3, 3]"));
  CHECK_THAT(err({2, 4, 8, 8}, {4, 4, 3, 3}, g2),
             Contains("w has 4 input channels per group, x has C/groups = 2") && Contains("conv7"));
  CHECK_THAT(err({2, 4, 8, 8}, {4, 3, 3, 3}, {}), Contains("w has 3 input channels per group, x has C/groups = 4"));
  CHECK_THAT(err({2, 4, 2, 8}, {4, 4, 3, 3}, {}), Contains("larger than the padded input"));
  CHECK_THAT(err({4, 8, 8}, {4, 4, 3, 3}, {}), Contains("x must be 4-D") && Contains("[4, 8, 8]"));
  CHECK_THAT(err({2, 4, 8, 8}, {4, 4, 3}, {}), Contains("w must be 4-D"));
  Conv2dParams bad;
  bad.stride_h = 0;
  CHECK_THAT(err({2, 4, 8, 8}, {4, 4, 3, 3}, bad), Contains("strides, dilations and groups must be positive"));
  // dy of the wrong shape in the directional entry points.
  Tensor w = ctx.zeros({4, 4, 3, 3});
  CHECK_THROWS_WITH(conv2d_backward_data(ctx, "conv7", ctx.zeros({2, 4, 5, 5}), w, {2, 4, 8, 8}, {}),
                    Contains("dy has shape [2, 4, 5, 5]") && Contains("[2, 4, 6, 6]"));
  CHECK_THROWS_AS(conv2d_backward_filter(ctx, "conv7", ctx.zeros({2, 4, 8, 8}), ctx.zeros({2, 4, 5, 5}), {4, 4, 3, 3}, {}),
                  ShapeError);
  // An int32 operand.
  CHECK_THROWS_AS(conv2d_forward(ctx, "conv7", ctx.zeros({2, 4, 8, 8}, DType::I32), w, {}), ShapeError);
}

TEST_CASE("conv2d: the tape delivers dx and dw, only where they are asked for") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const Config& c = configs()[4];  // groups, stride, padding and dilation together
  auto g = ref::conv2d_geom(c.x, c.w, c.p);
  auto xf = test::random_vec(static_cast<std::size_t>(shape_numel(c.x)), seed);
  auto wf = test::random_vec(static_cast<std::size_t>(shape_numel(c.w)), seed + 1);
  Shape ys = conv2d_output_shape("c", c.x, c.w, c.p);
  auto seedf = test::random_vec(static_cast<std::size_t>(shape_numel(ys)), seed + 2);
  std::vector<float> dx(xf.size()), dw(wf.size());
  ref::conv2d_bwd_data(g, seedf.data(), wf.data(), dx.data());
  ref::conv2d_bwd_filter(g, xf.data(), seedf.data(), dw.data());

  SECTION("both require grad") {
    Context ctx;
    Var x(ctx.from_host(xf, c.x), true), w(ctx.from_host(wf, c.w), true);
    Var y = conv2d(ctx, "conv1", x, w, c.p);
    CHECK(y.requires_grad());
    CHECK(y.shape() == ys);
    CHECK(ctx.tape().op_names() == std::vector<std::string>{"conv1:conv2d"});
    ctx.tape().backward(ctx, y, ctx.from_host(seedf, ys));
    CHECK(x.grad().to_host_f32() == dx);
    CHECK(w.grad().to_host_f32() == dw);
    for (const char* knob : {"fwd", "bwd_data", "bwd_filter"}) {
      INFO(knob);
      const ManifestEntry* e = ctx.manifest().find("conv1", knob);
      REQUIRE(e != nullptr);
      CHECK(e->op == "conv2d");
      CHECK(e->variant == "cpu-reference");
      CHECK(e->deterministic == Determinism::Yes);
      CHECK(e->requested == "heuristic");
      CHECK(e->device == "cpu");
    }
    // A second pass accumulates.
    Var y2 = conv2d(ctx, "conv1", x, w, c.p);
    ctx.tape().backward(ctx, y2, ctx.from_host(seedf, ys));
    auto twice = x.grad().to_host_f32();
    for (std::size_t i = 0; i < dx.size(); ++i) CHECK(twice[i] == 2 * dx[i]);
  }
  SECTION("x does not require grad: no dx, no bwd_data run") {
    Context ctx;
    Var x(ctx.from_host(xf, c.x), false), w(ctx.from_host(wf, c.w), true);
    Var y = conv2d(ctx, "conv1", x, w, c.p);
    ctx.tape().backward(ctx, y, ctx.from_host(seedf, ys));
    CHECK_FALSE(x.grad().defined());
    CHECK(w.grad().to_host_f32() == dw);
    CHECK(ctx.manifest().find("conv1", "bwd_data") == nullptr);
    CHECK(ctx.manifest().find("conv1", "bwd_filter") != nullptr);
  }
  SECTION("w does not require grad: no dw") {
    Context ctx;
    Var x(ctx.from_host(xf, c.x), true), w(ctx.from_host(wf, c.w), false);
    Var y = conv2d(ctx, "conv1", x, w, c.p);
    ctx.tape().backward(ctx, y, ctx.from_host(seedf, ys));
    CHECK(x.grad().to_host_f32() == dx);
    CHECK_FALSE(w.grad().defined());
    CHECK(ctx.manifest().find("conv1", "bwd_filter") == nullptr);
  }
  SECTION("nothing requires grad, or grad disabled: nothing recorded") {
    Context ctx;
    Var x(ctx.from_host(xf, c.x), false), w(ctx.from_host(wf, c.w), false);
    CHECK_FALSE(conv2d(ctx, "conv1", x, w, c.p).requires_grad());
    Var xg(ctx.from_host(xf, c.x), true);
    NoGradGuard guard(ctx);
    CHECK_FALSE(conv2d(ctx, "conv1", xg, w, c.p).requires_grad());
    CHECK(ctx.tape().size() == 0);
  }
}

TEST_CASE("conv2d on the CPU: a pinned policy still runs the one CPU path and says so") {
  Policy pol = Policy::parse({"conv1.fwd=fft", "conv1.bwd_data=algo0", "conv1.bwd_filter=deterministic", "conv1.math=tf32"});
  Context ctx(Device::cpu(), pol);
  Var x(ctx.full({1, 2, 5, 5}, 1.f), true), w(ctx.full({3, 2, 3, 3}, 0.5f), true);
  Conv2dParams p;
  p.stride_h = p.stride_w = 2;  // fft could not run this on cuDNN; the CPU reference can
  Var y = conv2d(ctx, "conv1", x, w, p);
  CHECK(y.value().to_host_f32() == std::vector<float>(3 * 2 * 2, 2 * 9 * 0.5f));
  ctx.tape().backward(ctx, y);
  const ManifestEntry* f = ctx.manifest().find("conv1", "fwd");
  REQUIRE(f);
  CHECK(f->variant == "cpu-reference");
  CHECK(f->requested == "pinned");
  CHECK(f->deterministic == Determinism::Yes);
  CHECK(f->math == "");
  CHECK(f->workspace_bytes == 0);
  CHECK(ctx.manifest().find("conv1", "bwd_data")->requested == "pinned");
  CHECK(ctx.manifest().find("conv1", "bwd_filter")->requested == "deterministic");
  CHECK(ctx.manifest().find("conv1", "bwd_filter")->variant == "cpu-reference");
}

TEST_CASE("conv_algos needs a CUDA context") {
  Context ctx;
  CHECK_THROWS_WITH(conv_supported_algos(ctx, "fwd", {1, 1, 4, 4}, {1, 1, 3, 3}, {}), Contains("CUDA context"));
}
