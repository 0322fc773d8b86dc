// Ops the model zoo needs, on the CPU: sigmoid, SiLU, ReLU6, concatenation along
// channels, the squeeze-and-excitation channel multiply and adaptive average pooling. For each:
// the op's values against hand-computed numbers (forward and backward through the tape), and a
// central-difference gradient check of the double-precision reference.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/tensor_ops.h"
#include "kernels/activation.h"
#include "kernels/activation_ref.h"
#include "kernels/concat.h"
#include "kernels/concat_ref.h"
#include "kernels/pool.h"
#include "kernels/pool_ref.h"
#include "support.h"

using namespace ditto;

namespace {

void check_values(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(double(got[i]) - want[i]) <= tol);
  }
}

// Random values in [lo, hi) at least `gap` away from each kink, so central differences with
// eps = 1e-6 never straddle one.
std::vector<double> away_from(std::size_t n, uint64_t seed, double lo, double hi, std::vector<double> kinks,
                              double gap = 1e-3) {
  auto v = test::random_vec<double>(n, seed, lo, hi);
  for (auto& x : v)
    for (double k : kinks)
      if (std::fabs(x - k) < gap) x = k + (x < k ? -gap : gap);
  return v;
}

}  // namespace

TEST_CASE("sigmoid, silu, relu6: values and tape gradients against hand-computed numbers") {
  Context ctx;
  const double ln3 = std::log(3.0);
  std::vector<float> xv = {0.f, float(ln3), float(-ln3), -1.f, 3.f, 6.f, 7.f, 100.f, -100.f};
  std::vector<float> dyv = {2.f, 4.f, 8.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f};
  const double xln3 = double(float(ln3));  // the float input actually used
  const double s3 = 1.0 / (1.0 + std::exp(-xln3)), sm3 = 1.0 - s3;  // ~0.75, ~0.25

  SECTION("sigmoid: y = 1/(1+e^-x), dx = dy*y*(1-y); no overflow at +-100") {
    Var x(ctx.from_host(xv, {9}), true);
    Var y = sigmoid(ctx, x);
    const double s1 = 1 / (1 + std::exp(1.0));
    check_values(y.value().to_host_f32(),
                 {0.5, s3, sm3, s1, 1 / (1 + std::exp(-3.0)), 1 / (1 + std::exp(-6.0)), 1 / (1 + std::exp(-7.0)), 1.0,
                  std::exp(-100.0)});
    ctx.tape().backward(ctx, y, ctx.from_host(dyv, {9}));
    check_values(x.grad().to_host_f32(), {2 * 0.25, 4 * s3 * sm3, 8 * s3 * sm3, s1 * (1 - s1),
                                          1 / (1 + std::exp(-3.0)) * (1 - 1 / (1 + std::exp(-3.0))),
                                          1 / (1 + std::exp(-6.0)) * (1 - 1 / (1 + std::exp(-6.0))),
                                          1 / (1 + std::exp(-7.0)) * (1 - 1 / (1 + std::exp(-7.0))), 0.0, 0.0});
  }
  SECTION("silu: y = x*sigmoid(x), dx = dy*(s + x*s*(1-s))") {
    Var x(ctx.from_host(xv, {9}), true);
    Var y = silu(ctx, x);
    auto sg = [](double v) { return 1 / (1 + std::exp(-v)); };
    std::vector<double> want_y, want_dx;
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const double v = xv[i], s = sg(v);
      want_y.push_back(v * s);
      want_dx.push_back(dyv[i] * (s + v * s * (1 - s)));
    }
    want_y[0] = 0.0, want_y[1] = xln3 * s3;  // 0 * 0.5 and ln3 * 0.75, spelled out
    want_dx[0] = 2 * 0.5;                   // silu'(0) = 1/2
    check_values(y.value().to_host_f32(), want_y, 1e-5);
    ctx.tape().backward(ctx, y, ctx.from_host(dyv, {9}));
    check_values(x.grad().to_host_f32(), want_dx);
  }
  SECTION("relu6: clamp to [0, 6]; gradient 0 at both kinks") {
    Var x(ctx.from_host(std::vector<float>{-1.f, 0.f, 3.f, 6.f, 7.f, 5.5f}, {2, 3}), true);
    Var y = relu6(ctx, x);
    check_values(y.value().to_host_f32(), {0, 0, 3, 6, 6, 5.5});
    ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    check_values(x.grad().to_host_f32(), {0, 0, 3, 0, 0, 6});
  }
  SECTION("relu still behaves as before") {
    Var x(ctx.from_host(std::vector<float>{-1.f, 0.f, 2.f}, {3}), true);
    Var y = relu(ctx, x);
    check_values(y.value().to_host_f32(), {0, 0, 2});
    ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{5, 6, 7}, {3}));
    check_values(x.grad().to_host_f32(), {0, 0, 7});
  }
}

TEST_CASE("sigmoid, silu, relu6 references: gradient check in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const std::size_t n = 200;
  auto w = test::loss_weights(n, seed);
  {
    auto x = test::random_vec<double>(n, seed, -8, 8);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(n);
      ref::sigmoid_fwd(in.data(), y.data(), int64_t(n));
      return test::weighted_sum(y, w);
    };
    std::vector<double> y(n), dx(n);
    ref::sigmoid_fwd(x.data(), y.data(), int64_t(n));
    ref::sigmoid_bwd(y.data(), w.data(), dx.data(), int64_t(n));
    CHECK(test::gradcheck(loss, x, dx) < 1e-6);
  }
  {
    auto x = test::random_vec<double>(n, seed + 1, -8, 8);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(n);
      ref::silu_fwd(in.data(), y.data(), int64_t(n));
      return test::weighted_sum(y, w);
    };
    std::vector<double> dx(n);
    ref::silu_bwd(x.data(), w.data(), dx.data(), int64_t(n));
    CHECK(test::gradcheck(loss, x, dx) < 1e-6);
  }
  {
    auto x = away_from(n, seed + 2, -3, 9, {0.0, 6.0});
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(n);
      ref::relu6_fwd(in.data(), y.data(), int64_t(n));
      return test::weighted_sum(y, w);
    };
    std::vector<double> dx(n);
    ref::relu6_bwd(x.data(), w.data(), dx.data(), int64_t(n));
    CHECK(test::gradcheck(loss, x, dx) < 1e-6);
  }
}

TEST_CASE("concat_channels: values, sliced gradients, inputs without grad, shape errors") {
  Context ctx;
  // x0: N=2, C=1, 1x2; x1: N=2, C=2, 1x2. y: N=2, C=3: per batch item x0's plane, then x1's two.
  Var x0(ctx.from_host(std::vector<float>{1, 2, 7, 8}, {2, 1, 1, 2}), true);
  Var x1(ctx.from_host(std::vector<float>{3, 4, 5, 6, 9, 10, 11, 12}, {2, 2, 1, 2}), true);
  Var frozen(ctx.from_host(std::vector<float>{13, 14, 15, 16}, {2, 1, 1, 2}), false);
  Var y = concat_channels(ctx, {x0, x1, frozen});
  REQUIRE(y.shape() == Shape{2, 4, 1, 2});
  check_values(y.value().to_host_f32(), {1, 2, 3, 4, 5, 6, 13, 14, 7, 8, 9, 10, 11, 12, 15, 16});
  std::vector<float> dy(16);
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(10 * (i + 1));
  ctx.tape().backward(ctx, y, ctx.from_host(dy, {2, 4, 1, 2}));
  check_values(x0.grad().to_host_f32(), {10, 20, 90, 100});
  check_values(x1.grad().to_host_f32(), {30, 40, 50, 60, 110, 120, 130, 140});
  CHECK_FALSE(frozen.grad().defined());

  CHECK_THROWS_AS(concat_channels(ctx, {}), ShapeError);
  Var wrong_h(ctx.from_host(std::vector<float>(4, 0.f), {2, 1, 2, 1}), false);
  CHECK_THROWS_AS(concat_channels(ctx, {x0, wrong_h}), ShapeError);
}

TEST_CASE("concat reference: gradient check in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t batch = 2, hw = 6, c0 = 2, c1 = 3, c = c0 + c1;
  const std::size_t n0 = std::size_t(batch * c0 * hw), n1 = std::size_t(batch * c1 * hw), ny = n0 + n1;
  auto w = test::loss_weights(ny, seed);
  auto x = test::random_vec<double>(n0 + n1, seed);  // x0's values, then x1's
  auto fwd = [&](const std::vector<double>& in) {
    std::vector<double> y(ny);
    ref::copy_channels(in.data(), c0, 0, y.data(), c, 0, batch, c0, hw);
    ref::copy_channels(in.data() + n0, c1, 0, y.data(), c, c0, batch, c1, hw);
    return y;
  };
  auto loss = [&](const std::vector<double>& in) { return test::weighted_sum(fwd(in), w); };
  std::vector<double> dx(n0 + n1);
  ref::copy_channels(w.data(), c, 0, dx.data(), c0, 0, batch, c0, hw);
  ref::copy_channels(w.data(), c, c0, dx.data() + n0, c1, 0, batch, c1, hw);
  CHECK(test::gradcheck(loss, x, dx) < 1e-6);
}

TEST_CASE("channel_mul: values and gradients for s of shape N,C and N,C,1,1; shape errors") {
  Context ctx;
  // x: N=1, C=2, 1x2 = [[1, 2], [3, 4]]; s = [10, 100].
  for (Shape sshape : {Shape{1, 2}, Shape{1, 2, 1, 1}}) {
    Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 2, 1, 2}), true);
    Var s(ctx.from_host(std::vector<float>{10, 100}, sshape), true);
    Var y = channel_mul(ctx, x, s);
    REQUIRE(y.shape() == Shape{1, 2, 1, 2});
    check_values(y.value().to_host_f32(), {10, 20, 300, 400});
    ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 2, 1, 2}));
    check_values(x.grad().to_host_f32(), {10, 20, 300, 400});  // dy * s
    REQUIRE(s.grad().shape() == sshape);
    check_values(s.grad().to_host_f32(), {1 * 1 + 2 * 2, 3 * 3 + 4 * 4});  // sum dy * x per plane
  }
  Var x(ctx.from_host(std::vector<float>(8, 1.f), {1, 2, 2, 2}), false);
  CHECK_THROWS_AS(channel_mul(ctx, x, Var(ctx.from_host(std::vector<float>{1, 2, 3}, {1, 3}))), ShapeError);
  CHECK_THROWS_AS(channel_mul(ctx, x, Var(ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 2, 2, 1}))), ShapeError);
}

// Stochastic depth multiplies by a mask that needs no gradient: the backward then reads only dy
// and s, and must not keep x's memory alive until it runs (EfficientNet's residual branches).
// Both forms (float32, and bf16 through the any-dtype path); the gradients stay right either way.
TEST_CASE("channel_mul: x is kept for backward only when s needs a gradient") {
  Context ctx;
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool s_grad : {false, true}) {
      INFO(dtype_name(dt) << ", s requires grad: " << s_grad);
      const Tensor xt = to_dtype(ctx, ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 2, 1, 2}), dt);
      Var x(xt, true);
      Var s(to_dtype(ctx, ctx.from_host(std::vector<float>{10, 100}, {1, 2, 1, 1}), dt), s_grad);
      Var y = channel_mul(ctx, x, s);
      // xt and x's value; a third holder is the backward closure.
      CHECK(detail::storage_of(xt).use_count() == (s_grad ? 3 : 2));
      ctx.tape().backward(ctx, y, to_dtype(ctx, ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 2, 1, 2}), dt));
      check_values(to_dtype(ctx, x.grad(), DType::F32).to_host_f32(), {10, 20, 300, 400});
      if (s_grad) check_values(to_dtype(ctx, s.grad(), DType::F32).to_host_f32(), {5, 25});
    }
  }
}

TEST_CASE("channel_mul reference: gradient check in double for x and s") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t planes = 6, hw = 15;
  const std::size_t nx = std::size_t(planes * hw), ns = std::size_t(planes);
  auto w = test::loss_weights(nx, seed);
  auto x = test::random_vec<double>(nx, seed);
  auto s = test::random_vec<double>(ns, seed + 1);
  std::vector<double> dx(nx), ds(ns);
  ref::channel_mul_bwd(x.data(), s.data(), w.data(), dx.data(), ds.data(), planes, hw);
  auto loss_x = [&](const std::vector<double>& in) {
    std::vector<double> y(nx);
    ref::channel_mul_fwd(in.data(), s.data(), y.data(), planes, hw);
    return test::weighted_sum(y, w);
  };
  auto loss_s = [&](const std::vector<double>& in) {
    std::vector<double> y(nx);
    ref::channel_mul_fwd(x.data(), in.data(), y.data(), planes, hw);
    return test::weighted_sum(y, w);
  };
  CHECK(test::gradcheck(loss_x, x, dx) < 1e-6);
  CHECK(test::gradcheck(loss_s, s, ds) < 1e-6);
}

TEST_CASE("adaptive_avg_pool2d: torchvision's windows, hand-computed values and gather backward") {
  Context ctx;
  // 3x3 -> 2x2: rows/cols of window 0 are [0, 2), of window 1 are [1, 3) (they overlap).
  Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}), true);
  Var y = adaptive_avg_pool2d(ctx, x, 2, 2);
  REQUIRE(y.shape() == Shape{1, 1, 2, 2});
  check_values(y.value().to_host_f32(), {3, 4, 6, 7});
  ctx.tape().backward(ctx, y, ctx.from_host(std::vector<float>{4, 8, 12, 16}, {1, 1, 2, 2}));
  // dy / 4 = [1, 2, 3, 4], summed over the windows containing each input.
  check_values(x.grad().to_host_f32(), {1, 3, 2, 4, 10, 6, 3, 7, 4});

  SECTION("upsampling 2 -> 3 columns: windows [0,1), [0,2), [1,2)") {
    Var a(ctx.from_host(std::vector<float>{2, 6}, {1, 1, 1, 2}), true);
    Var b = adaptive_avg_pool2d(ctx, a, 1, 3);
    check_values(b.value().to_host_f32(), {2, 4, 6});
    ctx.tape().backward(ctx, b, ctx.from_host(std::vector<float>{1, 2, 3}, {1, 1, 1, 3}));
    check_values(a.grad().to_host_f32(), {1 + 1, 1 + 3});
  }
  SECTION("1x1 output equals global_avg_pool") {
    Var a(ctx.from_host(test::random_vec(2 * 3 * 5 * 4, 11), {2, 3, 5, 4}), false);
    check_values(adaptive_avg_pool2d(ctx, a, 1, 1).value().to_host_f32(),
                 test::to_double(global_avg_pool(ctx, a).value().to_host_f32()), 1e-6);
  }
  CHECK_THROWS_AS(adaptive_avg_pool2d(ctx, x, 0, 2), ShapeError);
  CHECK_THROWS_AS(adaptive_avg_pool2d(ctx, Var(ctx.from_host(std::vector<float>(3, 0.f), {3})), 1, 1), ShapeError);
}

TEST_CASE("adaptive avg pool reference: gradient check in double, gather equals scatter") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  struct Case {
    int64_t h, w, oh, ow;
  };
  for (Case k : {Case{7, 5, 3, 4}, Case{2, 3, 3, 5}, Case{6, 6, 3, 3}, Case{7, 7, 7, 7}, Case{9, 4, 1, 2}}) {
    INFO(k.h << "x" << k.w << " -> " << k.oh << "x" << k.ow);
    ref::AdaptivePoolDims d;
    d.planes = 3, d.h = k.h, d.w = k.w, d.oh = k.oh, d.ow = k.ow;
    const std::size_t nx = std::size_t(d.planes * d.h * d.w), ny = std::size_t(d.planes * d.oh * d.ow);
    auto x = test::random_vec<double>(nx, seed);
    auto w = test::loss_weights(ny, seed);
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> y(ny);
      ref::adaptive_avg_pool_fwd(in.data(), y.data(), d);
      return test::weighted_sum(y, w);
    };
    std::vector<double> dx(nx);
    ref::adaptive_avg_pool_bwd(w.data(), dx.data(), d);
    CHECK(test::gradcheck(loss, x, dx) < 1e-6);
    // The natural scatter (every output spreads dy evenly over its window) gives the same
    // gradient: the gather's window-membership formulas are right.
    std::vector<double> scatter(nx, 0.0);
    for (int64_t p = 0; p < d.planes; ++p)
      for (int64_t oh = 0; oh < d.oh; ++oh)
        for (int64_t ow = 0; ow < d.ow; ++ow) {
          const int64_t h0 = ref::adaptive_start(oh, d.h, d.oh), h1 = ref::adaptive_end(oh, d.h, d.oh);
          const int64_t w0 = ref::adaptive_start(ow, d.w, d.ow), w1 = ref::adaptive_end(ow, d.w, d.ow);
          const double g = w[std::size_t((p * d.oh + oh) * d.ow + ow)] / double((h1 - h0) * (w1 - w0));
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) scatter[std::size_t((p * d.h + ih) * d.w + iw)] += g;
        }
    auto r = test::all_close(dx, scatter, 1e-12, 0.0);
    INFO(r.str());
    CHECK(r.ok);
  }
}
