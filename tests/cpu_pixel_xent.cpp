// Pixel-wise cross-entropy and the sum / mean reductions on the CPU: gradient checks of the
// references in double; the pixel loss against softmax_cross_entropy on the same pixels as rows;
// the ignore index; labels out of range; the `reduce` knobs of op kinds pixel_xent and reduce and
// their manifest entries.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/loss.h"
#include "kernels/pixel_xent.h"
#include "kernels/pool.h"
#include "kernels/pixel_xent_ref.h"
#include "kernels/reduction.h"
#include "kernels/reduction_ref.h"
#include "support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

// Labels in [0, c), with about one pixel in five set to `ignore`.
std::vector<int32_t> random_labels(std::size_t n, int c, int ignore, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(0, 5 * c - 1);
  std::vector<int32_t> v(n);
  for (auto& l : v) {
    const int r = d(g);
    l = r < c ? ignore : r % c;
  }
  return v;
}

}  // namespace

TEST_CASE("pixel cross-entropy reference: gradient check in double, with ignored pixels") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 2, c = 4, hw = 3 * 5;
  auto x = test::random_vec<double>(n * c * hw, seed, -3, 3);
  auto labels = random_labels(std::size_t(n * hw), int(c), 255, seed);
  int64_t count = 0;
  ref::pixel_xent_fwd(x.data(), labels.data(), n, c, hw, 255, &count);
  REQUIRE(count > 0);
  const double dl = 0.7;
  auto loss = [&](const std::vector<double>& in) {
    return dl * ref::pixel_xent_fwd(in.data(), labels.data(), n, c, hw, 255, nullptr);
  };
  std::vector<double> dx(x.size());
  ref::pixel_xent_bwd(x.data(), labels.data(), n, c, hw, 255, count, dl, dx.data());
  CHECK(test::gradcheck(loss, x, dx) < 1e-6);
}

TEST_CASE("pixel_cross_entropy on the CPU equals softmax_cross_entropy over the pixels as rows") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 3, c = 5, h = 4, w = 6, hw = h * w;
  auto xv = test::random_vec(std::size_t(n * c * hw), seed, -4, 4);
  auto labels = random_labels(std::size_t(n * hw), int(c), -1, seed);
  for (auto& l : labels) l = l < 0 ? 0 : l;  // no ignored pixels: every pixel is a row
  std::vector<float> rows(xv.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t s = 0; s < hw; ++s) rows[std::size_t((i * hw + s) * c + k)] = xv[std::size_t((i * c + k) * hw + s)];
  Var xp(ctx.from_host(xv, {n, c, h, w}), true), xr(ctx.from_host(rows, {n * hw, c}), true);
  Var lp = pixel_cross_entropy(ctx, "seg", xp, ctx.from_host(labels, {n, h, w}));
  ctx.tape().backward(ctx, lp);  // a backward pass clears the tape: one loss at a time
  Var lr = softmax_cross_entropy(ctx, "loss", xr, ctx.from_host(labels, {n * hw}));
  ctx.tape().backward(ctx, lr);
  // Both are double sums of the same terms rounded once (in another order: 1e-15 relative).
  CHECK(std::fabs(lp.value().to_host_f32()[0] - lr.value().to_host_f32()[0]) <=
        1e-6f * std::fabs(lr.value().to_host_f32()[0]));
  auto gp = xp.grad().to_host_f32(), gr = xr.grad().to_host_f32();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t s = 0; s < hw; ++s) {
        const float a = gp[std::size_t((i * c + k) * hw + s)], b = gr[std::size_t((i * hw + s) * c + k)];
        CHECK(std::fabs(a - b) <= 1e-7f);  // one rounding each of |g| < 1/72
      }
}

TEST_CASE("pixel_cross_entropy on the CPU: ignored pixels count for nothing; all ignored is NaN with zero gradient") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cpu(), Policy::parse({"seg.reduce=deterministic"}));
  const int64_t n = 2, c = 3, h = 3, w = 4;
  auto xv = test::random_vec(std::size_t(n * c * h * w), seed, -2, 2);
  auto labels = random_labels(std::size_t(n * h * w), int(c), 7, seed);
  labels[0] = 7;
  labels[1] = 1;
  Tensor lab = ctx.from_host(labels, {n, h, w});
  Var x(ctx.from_host(xv, {n, c, h, w}), true);
  Var l = pixel_cross_entropy(ctx, "seg", x, lab, 7);
  int64_t count = 0;
  const double want = ref::pixel_xent_fwd(xv.data(), labels.data(), n, c, h * w, 7, &count);
  CHECK(l.value().to_host_f32()[0] == static_cast<float>(want));
  ctx.tape().backward(ctx, l);
  auto g = x.grad().to_host_f32();
  for (int64_t k = 0; k < c; ++k) CHECK(g[std::size_t(k * h * w)] == 0.0f);  // pixel 0 is ignored
  // Changing an ignored pixel's logits changes nothing.
  auto xv2 = xv;
  xv2[0] += 5.f;
  CHECK(pixel_cross_entropy(ctx, "seg", Var(ctx.from_host(xv2, {n, c, h, w})), lab, 7).value().to_host_f32() ==
        l.value().to_host_f32());
  const ManifestEntry* e = ctx.manifest().find("seg", "reduce");
  REQUIRE(e != nullptr);
  CHECK(e->op == "pixel_xent");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "deterministic");  // the variant's name is also the mode word

  Var all(ctx.from_host(xv, {n, c, h, w}), true);
  Var nan = pixel_cross_entropy(ctx, "seg", all, ctx.from_host(std::vector<int32_t>(std::size_t(n * h * w), 7), {n, h, w}), 7);
  CHECK(std::isnan(nan.value().to_host_f32()[0]));
  ctx.tape().backward(ctx, nan);
  for (float v : all.grad().to_host_f32()) CHECK(v == 0.0f);
}

TEST_CASE("pixel_cross_entropy: bad labels and shapes are errors naming the pixel or the operand") {
  Context ctx;
  Var x(ctx.zeros({2, 3, 2, 2}), false);
  std::vector<int32_t> labels(8, 0);
  labels[6] = 3;  // image 1, row 1, column 0
  CHECK_THROWS_WITH(pixel_cross_entropy(ctx, "seg", x, ctx.from_host(labels, {2, 2, 2})),
                    Contains("seg") && Contains("pixel (n 1, h 1, w 0)") && Contains("label 3") && Contains("-100"));
  labels[6] = -100;
  CHECK_NOTHROW(pixel_cross_entropy(ctx, "seg", x, ctx.from_host(labels, {2, 2, 2})));
  CHECK_THROWS_WITH(pixel_cross_entropy(ctx, "seg", x, ctx.from_host(labels, {2, 4})), Contains("{N, H, W}"));
  CHECK_THROWS_WITH(pixel_cross_entropy(ctx, "seg", x, ctx.zeros({2, 2, 2})), Contains("must be i32"));
  CHECK_THROWS_WITH(pixel_cross_entropy(ctx, "seg", Var(ctx.zeros({2, 3, 4})), ctx.zeros({2, 4}, DType::I32)),
                    Contains("4 dimensions"));
  CHECK(Policy().variant<Reduction>("seg", op::pixel_xent) == Reduction::Atomic);
  CHECK(Policy::parse({"*=deterministic"}).variant<Reduction>("seg", op::pixel_xent) == Reduction::Deterministic);
  CHECK_THROWS_AS(Policy().variant<Reduction>("pool", op::maxpool2d), Error);  // a knob its op kind lacks
}

TEST_CASE("pixel_nll on the CPU: -log_probs[label] averaged over counted pixels; dx -1/count at the labels") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cpu(), Policy::parse({"seg.reduce=deterministic"}));
  const int64_t n = 2, c = 4, h = 3, w = 5, hw = h * w;
  auto xv = test::random_vec(std::size_t(n * c * hw), seed, -4, 0);
  auto labels = random_labels(std::size_t(n * hw), int(c), 255, seed);
  labels[2] = 255;
  labels[3] = 2;
  Var x(ctx.from_host(xv, {n, c, h, w}), true);
  Var l = pixel_nll(ctx, "seg", x, ctx.from_host(labels, {n, h, w}), 255);
  // The definition, summed here in pixel order.
  double total = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p)
      if (labels[std::size_t(i * hw + p)] != 255) {
        total -= xv[std::size_t((i * c + labels[std::size_t(i * hw + p)]) * hw + p)];
        ++counted;
      }
  CHECK(l.value().to_host_f32()[0] == static_cast<float>(total / double(counted)));
  ctx.tape().backward(ctx, l);
  const auto g = x.grad().to_host_f32();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t p = 0; p < hw; ++p) {
        const int32_t label = labels[std::size_t(i * hw + p)];
        const float want = label != 255 && label == k ? static_cast<float>(-1.0 / double(counted)) : 0.f;
        REQUIRE(g[std::size_t((i * c + k) * hw + p)] == want);
      }
  // It is the cross-entropy's NLL half: on log-softmax values the two losses agree.
  std::vector<float> lsm(xv.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p) {
      const double lse = ref::pixel_logsumexp(xv.data() + i * c * hw + p, c, hw);
      for (int64_t k = 0; k < c; ++k)
        lsm[std::size_t((i * c + k) * hw + p)] = static_cast<float>(xv[std::size_t((i * c + k) * hw + p)] - lse);
    }
  const float nll = pixel_nll(ctx, "seg", Var(ctx.from_host(lsm, {n, c, h, w})), ctx.from_host(labels, {n, h, w}), 255)
                        .value()
                        .to_host_f32()[0];
  const float xent = pixel_cross_entropy(ctx, "seg", Var(ctx.from_host(xv, {n, c, h, w})),
                                         ctx.from_host(labels, {n, h, w}), 255)
                         .value()
                         .to_host_f32()[0];
  CHECK(std::fabs(nll - xent) <= 1e-5f * std::fabs(xent));
  const ManifestEntry* e = ctx.manifest().find("seg", "reduce");
  REQUIRE(e != nullptr);
  CHECK(e->op == "pixel_xent");
  // Every pixel ignored: NaN, as PyTorch; bad labels name the pixel.
  CHECK(std::isnan(pixel_nll(ctx, "seg", x, ctx.from_host(std::vector<int32_t>(std::size_t(n * hw), 255), {n, h, w}), 255)
                       .value()
                       .to_host_f32()[0]));
  labels[hw + 6] = 4;  // image 1, row 1, column 1
  CHECK_THROWS_WITH(pixel_nll(ctx, "seg", x, ctx.from_host(labels, {n, h, w}), 255),
                    Contains("pixel_nll") && Contains("pixel (n 1, h 1, w 1)") && Contains("label 4"));
  CHECK_THROWS_WITH(pixel_nll(ctx, "seg", x, ctx.from_host(labels, {n, hw}), 255), Contains("log_probs"));
}

TEST_CASE("reduce_sum and reduce_mean on the CPU: double sums, broadcast gradients, knob and manifest") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  {  // gradient check of the reference: the sum is linear, so the check holds to rounding
    auto x = test::random_vec<double>(37, seed);
    auto loss = [&](const std::vector<double>& in) { return 1.5 * ref::sum_all(in.data(), int64_t(in.size())); };
    CHECK(test::gradcheck(loss, x, std::vector<double>(x.size(), 1.5)) < 1e-6);
  }
  Context ctx(Device::cpu(), Policy::parse({"*=deterministic"}));
  auto xv = test::random_vec(1000, seed);
  Var x(ctx.from_host(xv, {10, 100}), true);
  Var s = reduce_sum(ctx, "sum", x);
  Var m = reduce_mean(ctx, "mean", x);
  const double want = ref::sum_all(xv.data(), 1000);
  CHECK(s.value().to_host_f32()[0] == static_cast<float>(want));
  CHECK(m.value().to_host_f32()[0] == static_cast<float>(want / 1000));
  ctx.tape().backward(ctx, m, ctx.from_host(std::vector<float>{3.f}, {1}));
  for (float g : x.grad().to_host_f32()) CHECK(g == 0.003f);
  x.zero_grad();
  Var s2 = reduce_sum(ctx, "sum", x);
  ctx.tape().backward(ctx, s2, ctx.from_host(std::vector<float>{-2.f}, {1}));
  for (float g : x.grad().to_host_f32()) CHECK(g == -2.f);
  const ManifestEntry* e = ctx.manifest().find("mean", "reduce");
  REQUIRE(e != nullptr);
  CHECK(e->op == "reduce");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "deterministic");

  Var empty(ctx.zeros({0, 4}), false);
  CHECK(reduce_sum(ctx, "sum", empty).value().to_host_f32()[0] == 0.0f);
  CHECK(std::isnan(reduce_mean(ctx, "mean", empty).value().to_host_f32()[0]));
  CHECK(Policy().variant<Reduction>("sum", op::reduce) == Reduction::Atomic);
  CHECK_THROWS_WITH(Policy::parse({"sum.reduce=sorted"}), Contains("unknown variant 'sorted'"));
  // CUB's sum is a variant of the whole-tensor reduce alone: the losses' reduce knobs lack it.
  const Policy cub = Policy::parse({"sum.reduce=cub", "loss.reduce=cub"});
  CHECK(cub.variant<Reduction>("sum", op::reduce) == Reduction::Cub);
  CHECK(cub.requested("sum", "reduce", op::reduce) == "pinned");
  CHECK_THROWS_WITH(cub.variant<Reduction>("loss", op::softmax_xent), Contains("not a variant of reduce"));
  CHECK_THROWS_WITH(cub.variant<Reduction>("loss", op::pixel_xent), Contains("not a variant of reduce"));
  Context pinned(Device::cpu(), cub);  // the CPU runs its reference whatever is pinned, and says so
  CHECK(reduce_sum(pinned, "sum", Var(pinned.from_host(xv, {10, 100}))).value().to_host_f32()[0] ==
        static_cast<float>(want));
  CHECK(pinned.manifest().find("sum", "reduce")->variant == "cpu-reference");
  CHECK(pinned.manifest().find("sum", "reduce")->requested == "pinned");
}
