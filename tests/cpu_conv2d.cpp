// conv2d on the CPU: gradient checks of the reference in double (stride, padding, dilation,
// groups, non-square everything), the op against the reference, shape errors, the tape, and
// the policy/manifest on the CPU's single path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/bias_ref.h"
#include "kernels/conv2d.h"
#include "kernels/conv2d_ref.h"
#include "nets/module.h"
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
      {"depthwise (groups = C = 4), stride 2, pad 1", {2, 4, 7, 6}, {4, 1, 3, 3}, make(2, 2, 1, 1, 1, 1, 4)},
      {"depthwise with multiplier 2 (groups = C = 3, K = 6), dilation 2, pad 2x1, 3x2 kernel", {1, 3, 7, 8},
       {6, 1, 3, 2}, make(1, 1, 2, 1, 2, 2, 3)},
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

TEST_CASE("conv2d reference: hand-computed grouped and depthwise values") {
  Context ctx;
  SECTION("groups 2: each output sees only its own group's input channels") {
    // x 1x4x1x1 = [1, 2, 3, 4]; groups 2, so outputs 0-1 read channels 0-1 and outputs 2-3
    // read channels 2-3. w 4x2x1x1: [1, 10], [-1, 0] | [100, 1000], [0, 1].
    Tensor x = ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 4, 1, 1});
    Tensor w = ctx.from_host(std::vector<float>{1, 10, -1, 0, 100, 1000, 0, 1}, {4, 2, 1, 1});
    Conv2dParams p;
    p.groups = 2;
    // 1*1 + 10*2, -1*1, 100*3 + 1000*4, 1*4; without groups output 0 would also read 3 and 4.
    CHECK(conv2d_forward(ctx, "g", x, w, p).to_host_f32() == std::vector<float>{21, -1, 4300, 4});
  }
  SECTION("depthwise (groups = C = 2): one 2x2 filter per channel") {
    // channel 0 = 1..9 with [1 0; 0 -1]: x[i][j] - x[i+1][j+1] = -4 everywhere.
    // channel 1 = 10..90 with [0 1; 1 0]: x[i][j+1] + x[i+1][j] = 20+40, 30+50, 50+70, 60+80.
    Tensor x = ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30, 40, 50, 60, 70, 80, 90},
                             {1, 2, 3, 3});
    Tensor w = ctx.from_host(std::vector<float>{1, 0, 0, -1, 0, 1, 1, 0}, {2, 1, 2, 2});
    Conv2dParams p;
    p.groups = 2;
    CHECK(conv2d_forward(ctx, "dw", x, w, p).to_host_f32() == std::vector<float>{-4, -4, -4, -4, 60, 80, 120, 140});
    // pad 1, stride 2: output (oh, ow) has its kernel origin at input (2oh - 1, 2ow - 1); padding reads 0.
    //   channel 0, x[h0][w0] - x[h0+1][w0+1]: (0,0) 0 - 1, (0,1) 0 - 3, (1,0) 0 - 7, (1,1) 5 - 9
    //   channel 1, x[h0][w0+1] + x[h0+1][w0]: (0,0) 0 + 0, (0,1) 0 + 20, (1,0) 40 + 0, (1,1) 60 + 80
    p.pad_h = p.pad_w = 1;
    p.stride_h = p.stride_w = 2;
    CHECK(conv2d_forward(ctx, "dw", x, w, p).to_host_f32() == std::vector<float>{-1, -3, -7, -4, 0, 20, 40, 140});
  }
}

TEST_CASE("conv2d + bias reference with groups: gradient check in double of dx, dw and db") {
  // What a grouped Conv2d layer computes: y = conv(x, w) + b[k]; dL/db is the bias reduction of
  // dL/dy, dL/dx and dL/dw are the convolution's backward passes of the same dL/dy.
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const auto& c : configs()) {
    if (c.p.groups == 1) continue;
    INFO("config " << c.name);
    auto g = ref::conv2d_geom(c.x, c.w, c.p);
    const int64_t spatial = g.Ho * g.Wo;
    auto x = test::random_vec<double>(static_cast<std::size_t>(shape_numel(c.x)), seed);
    auto w = test::random_vec<double>(static_cast<std::size_t>(shape_numel(c.w)), seed + 1);
    auto b = test::random_vec<double>(static_cast<std::size_t>(g.K), seed + 2);
    auto fwd = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      auto conv = ref_fwd(c, xv, wv);
      std::vector<double> y(conv.size());
      ref::bias_fwd(conv.data(), bv.data(), y.data(), g.N, g.K, spatial);
      return y;
    };
    auto lw = test::loss_weights(static_cast<std::size_t>(g.N * g.K * spatial), seed);  // dL/dy
    std::vector<double> dx(x.size()), dw(w.size()), db(b.size());
    ref::conv2d_bwd_data(g, lw.data(), w.data(), dx.data());
    ref::conv2d_bwd_filter(g, x.data(), lw.data(), dw.data());
    ref::bias_bwd_db(lw.data(), db.data(), g.N, g.K, spatial);
    CHECK(test::gradcheck([&](const std::vector<double>& v) { return test::weighted_sum(fwd(v, w, b), lw); }, x, dx) <
          1e-6);
    CHECK(test::gradcheck([&](const std::vector<double>& v) { return test::weighted_sum(fwd(x, v, b), lw); }, w, dw) <
          1e-6);
    CHECK(test::gradcheck([&](const std::vector<double>& v) { return test::weighted_sum(fwd(x, w, v), lw); }, b, db) <
          1e-6);
  }
}

TEST_CASE("Conv2d layer with groups: weight shape, forward and the tape's dx, dw, db equal the reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  struct LayerCase {
    const char* name;
    int in, out, kernel, stride, pad, groups;
  };
  for (const LayerCase& lc : {LayerCase{"grouped", 4, 6, 3, 1, 1, 2}, LayerCase{"depthwise", 4, 4, 3, 2, 1, 4},
                              LayerCase{"depthwise x2", 3, 6, 3, 1, 1, 3}}) {
    INFO(lc.name);
    Context ctx;
    Conv2d layer(ctx, "dwconv", lc.in, lc.out, lc.kernel, lc.stride, lc.pad, true, Init::HeNormal, lc.groups);
    CHECK(layer.groups() == lc.groups);
    const Shape ws{lc.out, lc.in / lc.groups, lc.kernel, lc.kernel}, xs{2, lc.in, 7, 6};
    REQUIRE(layer.weight.value().shape() == ws);
    REQUIRE(layer.bias.value().shape() == Shape{lc.out});
    Conv2dParams p;
    p.stride_h = p.stride_w = lc.stride;
    p.pad_h = p.pad_w = lc.pad;
    p.groups = lc.groups;
    auto g = ref::conv2d_geom(xs, ws, p);
    const int64_t spatial = g.Ho * g.Wo;
    auto xf = test::random_vec(static_cast<std::size_t>(shape_numel(xs)), seed);
    auto wf = test::random_vec(static_cast<std::size_t>(shape_numel(ws)), seed + 1);
    auto bf = test::random_vec(static_cast<std::size_t>(lc.out), seed + 2);
    const Shape ys{2, lc.out, g.Ho, g.Wo};
    auto dyf = test::random_vec(static_cast<std::size_t>(shape_numel(ys)), seed + 3);
    layer.weight = Var(ctx.from_host(wf, ws), true);
    layer.bias = Var(ctx.from_host(bf, {lc.out}), true);
    Var x(ctx.from_host(xf, xs), true);
    Var y = layer(ctx, x);
    REQUIRE(y.shape() == ys);
    ctx.tape().backward(ctx, y, ctx.from_host(dyf, ys));
    // The CPU ops are the references (double sums rounded once), so equality is exact.
    std::vector<float> conv(dyf.size()), want_y(dyf.size()), dx(xf.size()), dw(wf.size()), db(bf.size());
    ref::conv2d_fwd(g, xf.data(), wf.data(), conv.data());
    ref::bias_fwd(conv.data(), bf.data(), want_y.data(), g.N, g.K, spatial);
    ref::conv2d_bwd_data(g, dyf.data(), wf.data(), dx.data());
    ref::conv2d_bwd_filter(g, xf.data(), dyf.data(), dw.data());
    ref::bias_bwd_db(dyf.data(), db.data(), g.N, g.K, spatial);
    CHECK(y.value().to_host_f32() == want_y);
    CHECK(x.grad().to_host_f32() == dx);
    CHECK(layer.weight.grad().to_host_f32() == dw);
    CHECK(layer.bias.grad().to_host_f32() == db);
  }
  SECTION("existing calls keep groups 1 and the full weight") {
    Context ctx;
    Conv2d plain(ctx, "conv1", 3, 8, 5, 1, 2);
    CHECK(plain.groups() == 1);
    CHECK(plain.weight.value().shape() == Shape{8, 3, 5, 5});
  }
}

TEST_CASE("Conv2d layer: a group count that does not divide the channels is an error naming the layer") {
  Context ctx;
  CHECK_THROWS_MATCHES(Conv2d(ctx, "block3.dw", 6, 12, 3, 1, 1, true, Init::HeNormal, 4), ShapeError,
                       Catch::Matchers::Message(
                           "conv2d layer 'block3.dw': groups = 4 must be positive and divide in_channels = 6 and "
                           "out_channels = 12"));
  CHECK_THROWS_WITH(Conv2d(ctx, "block3.pw", 8, 6, 1, 1, 0, false, Init::HeNormal, 4),
                    Contains("block3.pw") && Contains("out_channels = 6"));
  CHECK_THROWS_AS(Conv2d(ctx, "block3.z", 8, 8, 1, 1, 0, false, Init::HeNormal, 0), ShapeError);
  // The op itself rejects a weight whose per-group channel count does not match.
  Conv2d ok(ctx, "block3.ok", 8, 8, 3, 1, 1, false, Init::HeNormal, 8);
  Var x(ctx.zeros({1, 4, 5, 5}));
  CHECK_THROWS_WITH(ok(ctx, x), Contains("block3.ok") && Contains("C = 4 is not divisible by groups = 8"));
}

// The references' loops written as the formulas read, one output element at a time (what the
// row-wise references must equal bit for bit: same terms, same order, same double sums).
namespace {
namespace direct {

template <class T>
void fwd(const ref::Conv2dGeom& g, const T* x, const T* w, T* y) {
  const int64_t Cg = g.Cg(), Kg = g.Kg();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t ho = 0; ho < g.Ho; ++ho)
        for (int64_t wo = 0; wo < g.Wo; ++wo) {
          double acc = 0;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < g.R; ++r)
              for (int64_t s = 0; s < g.S; ++s) {
                const int64_t h = ho * g.stride_h - g.pad_h + r * g.dil_h, ww = wo * g.stride_w - g.pad_w + s * g.dil_w;
                if (h < 0 || h >= g.H || ww < 0 || ww >= g.W) continue;
                acc += double(x[((n * g.C + (k / Kg) * Cg + c) * g.H + h) * g.W + ww]) *
                       double(w[((k * Cg + c) * g.R + r) * g.S + s]);
              }
          y[((n * g.K + k) * g.Ho + ho) * g.Wo + wo] = T(acc);
        }
}

template <class T>
void bwd_data(const ref::Conv2dGeom& g, const T* dy, const T* w, T* dx) {
  const int64_t Cg = g.Cg(), Kg = g.Kg();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t ci = 0; ci < g.C; ++ci)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t wi = 0; wi < g.W; ++wi) {
          double acc = 0;
          for (int64_t k = (ci / Cg) * Kg; k < (ci / Cg + 1) * Kg; ++k)
            for (int64_t r = 0; r < g.R; ++r)
              for (int64_t s = 0; s < g.S; ++s) {
                const int64_t th = h + g.pad_h - r * g.dil_h, tw = wi + g.pad_w - s * g.dil_w;
                if (th < 0 || tw < 0 || th % g.stride_h || tw % g.stride_w) continue;
                const int64_t ho = th / g.stride_h, wo = tw / g.stride_w;
                if (ho >= g.Ho || wo >= g.Wo) continue;
                acc += double(dy[((n * g.K + k) * g.Ho + ho) * g.Wo + wo]) *
                       double(w[((k * Cg + ci % Cg) * g.R + r) * g.S + s]);
              }
          dx[((n * g.C + ci) * g.H + h) * g.W + wi] = T(acc);
        }
}

template <class T>
void bwd_filter(const ref::Conv2dGeom& g, const T* x, const T* dy, T* dw) {
  const int64_t Cg = g.Cg(), Kg = g.Kg();
  for (int64_t k = 0; k < g.K; ++k)
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t r = 0; r < g.R; ++r)
        for (int64_t s = 0; s < g.S; ++s) {
          double acc = 0;
          for (int64_t n = 0; n < g.N; ++n)
            for (int64_t ho = 0; ho < g.Ho; ++ho)
              for (int64_t wo = 0; wo < g.Wo; ++wo) {
                const int64_t h = ho * g.stride_h - g.pad_h + r * g.dil_h, ww = wo * g.stride_w - g.pad_w + s * g.dil_w;
                if (h < 0 || h >= g.H || ww < 0 || ww >= g.W) continue;
                acc += double(dy[((n * g.K + k) * g.Ho + ho) * g.Wo + wo]) *
                       double(x[((n * g.C + (k / Kg) * Cg + c) * g.H + h) * g.W + ww]);
              }
          dw[((k * Cg + c) * g.R + r) * g.S + s] = T(acc);
        }
}

template <class T>
void same_as_direct(const ref::Conv2dGeom& g, const std::vector<T>& x, const std::vector<T>& w,
                    const std::vector<T>& dy) {
  INFO((sizeof(T) == 4 ? "float" : "double"));
  auto bits = [](const std::vector<T>& v) {
    std::vector<unsigned char> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  std::vector<T> y(dy.size()), y0(dy.size()), dx(x.size()), dx0(x.size()), dw(w.size()), dw0(w.size());
  ref::conv2d_fwd(g, x.data(), w.data(), y.data());
  direct::fwd(g, x.data(), w.data(), y0.data());
  ref::conv2d_bwd_data(g, dy.data(), w.data(), dx.data());
  direct::bwd_data(g, dy.data(), w.data(), dx0.data());
  ref::conv2d_bwd_filter(g, x.data(), dy.data(), dw.data());
  direct::bwd_filter(g, x.data(), dy.data(), dw0.data());
  CHECK(bits(y) == bits(y0));
  CHECK(bits(dx) == bits(dx0));
  CHECK(bits(dw) == bits(dw0));
}

}  // namespace direct
}  // namespace

TEST_CASE("conv2d reference: the row-wise loops give every element the direct loops' bits") {
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 pick(seed);
  auto in = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(pick)); };
  std::vector<Config> cases = configs();
  // Random geometries: strides, padding and dilation up to 3 (padding beyond the kernel, kernels
  // wider than the input, outputs of one position), groups, depthwise.
  for (int i = 0; i < 300; ++i) {
    const int groups = in(1, 3), cg = in(1, 3), kg = in(1, 3);
    const int r = in(1, 4), s = in(1, 4), dh = in(1, 3), dw = in(1, 3), ph = in(0, 3), pw = in(0, 3);
    const int h = std::max(in(1, 9), (r - 1) * dh + 1 - 2 * ph), w = std::max(in(1, 9), (s - 1) * dw + 1 - 2 * pw);
    cases.push_back({"random", {in(1, 2), groups * cg, h, w}, {groups * kg, cg, r, s},
                     make(in(1, 3), in(1, 3), ph, pw, dh, dw, groups)});
  }
  for (const auto& c : cases) {
    INFO(c.name << ": x " << shape_str(c.x) << " w " << shape_str(c.w) << " stride " << c.p.stride_h << "x"
                << c.p.stride_w << " pad " << c.p.pad_h << "x" << c.p.pad_w << " dilation " << c.p.dilation_h << "x"
                << c.p.dilation_w << " groups " << c.p.groups);
    const auto g = ref::conv2d_geom(c.x, c.w, c.p);
    // Magnitudes spread over 2^-30..2^30. In float the double sums of exact products are nearly
    // order-free once rounded; in double every addition rounds, so a term taken in another order
    // shows in the bits: both instantiations are checked.
    auto spread = [&](std::size_t n) {
      auto v = test::random_vec(n, pick());
      for (float& e : v) e = std::ldexp(e, in(-30, 30));
      return v;
    };
    const auto x = spread(static_cast<std::size_t>(shape_numel(c.x)));
    const auto w = spread(static_cast<std::size_t>(shape_numel(c.w)));
    const auto dy = spread(static_cast<std::size_t>(g.N * g.K * g.Ho * g.Wo));
    direct::same_as_direct(g, x, w, dy);
    direct::same_as_direct(g, test::to_double(x), test::to_double(w), test::to_double(dy));
  }
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
  Policy pol = Policy::parse({"conv1.fwd=fft", "conv1.bwd_data=algo0", "conv1.bwd_filter=deterministic", "conv1.precision=tf32"});
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
  CHECK(f->precision == "");  // tf32 is not emulated on the CPU
  CHECK(f->workspace_bytes == 0);
  CHECK(ctx.manifest().find("conv1", "bwd_data")->requested == "pinned");
  CHECK(ctx.manifest().find("conv1", "bwd_filter")->requested == "deterministic");
  CHECK(ctx.manifest().find("conv1", "bwd_filter")->variant == "cpu-reference");
}

TEST_CASE("conv_algos needs a CUDA context") {
  Context ctx;
  CHECK_THROWS_WITH(conv_supported_algos(ctx, "fwd", {1, 1, 4, 4}, {1, 1, 3, 3}, {}), Contains("CUDA context"));
}
