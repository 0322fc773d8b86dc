// Pixel-wise cross-entropy on the GPU: both `reduce` variants against the double reference (loss
// and gradient, with ignored pixels); the deterministic variant bit-identical over 10 calls, the
// atomic one shown to differ; labels out of range made NaN; every pixel ignored giving NaN with a
// zero gradient; the manifest; DETERMINISM lines with the time of one forward call at a
// segmentation size (16 x 21 classes x 256 x 256).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/pixel_xent.h"
#include "kernels/pixel_xent_ref.h"
#include "support.h"

using namespace ditto;

using test::us_per_call;

namespace {

const Reduction kVariants[] = {Reduction::Atomic, Reduction::Deterministic};

std::vector<int32_t> random_labels(std::size_t n, int c, int ignore, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(0, 5 * c - 1);
  std::vector<int32_t> v(n);
  for (auto& l : v) {
    const int r = d(g);
    l = r < c ? ignore : r % c;  // about one pixel in five ignored
  }
  return v;
}

// A segmentation-shaped problem: 4 images, 21 classes, 33 x 47 pixels, inputs uniform in [lo, hi],
// labels with about one pixel in five ignored (255).
struct SegProblem {
  int64_t n = 4, c = 21, h = 33, w = 47;
  std::vector<float> x;
  std::vector<int32_t> labels;
  SegProblem(uint64_t seed, float lo, float hi)
      : x(test::random_vec(std::size_t(n * c * h * w), seed, lo, hi)),
        labels(random_labels(std::size_t(n * h * w), int(c), 255, seed)) {}
};

}  // namespace

TEST_CASE("gpu pixel_cross_entropy: both variants against the double reference, with ignored pixels") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const SegProblem sp(seed, -4, 4);
  const int64_t n = sp.n, c = sp.c, h = sp.h, w = sp.w, hw = h * w, pixels = n * hw;
  const auto& xv = sp.x;
  const auto& labels = sp.labels;
  std::vector<double> xd(xv.begin(), xv.end());
  int64_t count = 0;
  const double want = ref::pixel_xent_fwd(xd.data(), labels.data(), n, c, hw, 255, &count);
  const double dl = 1.3;
  std::vector<double> g_ref(xd.size());
  ref::pixel_xent_bwd(xd.data(), labels.data(), n, c, hw, 255, count, dl, g_ref.data());
  // A pixel's loss is lse - x[label] with |x| <= 4: C exponentials and additions, one log, a few
  // roundings of values <= 8 + ln C: |error| <= (C + 10) * 2^-24 * (8 + ln C). The mean adds the
  // pixel losses along a path of at most pixels / 32 additions (the atomic variant's warp sums in
  // arrival order; the fixed tree is much shallower), each within 2^-24 of the running sum, which
  // stays below the mean times the count: relative 2^-24 * pixels / 32 on the mean.
  const double lse_err = double(c + 10) * (8 + std::log(double(c))) * std::ldexp(1.0, -24);
  const double loss_tol = lse_err + double(pixels / 32 + 24) * std::ldexp(1.0, -24) * std::fabs(want);
  // Gradient: softmax from the float lse (error lse_err, so relative lse_err on p), minus the
  // one-hot, times dl / count: |error| <= (lse_err + 4 * 2^-24) * dl / count.
  const double grad_tol = (lse_err + 4 * std::ldexp(1.0, -24)) * dl / double(count);
  for (Reduction r : kVariants) {
    INFO("reduce=" << name_of(r));
    gpu.policy().pin("seg", r);
    Var x(gpu.from_host(xv, {n, c, h, w}), true);
    Var l = pixel_cross_entropy(gpu, "seg", x, gpu.from_host(labels, {n, h, w}), 255);
    CHECK(std::fabs(double(l.value().to_host_f32()[0]) - want) <= loss_tol);
    gpu.tape().backward(gpu, l, gpu.from_host(std::vector<float>{float(dl)}, {1}));
    auto gr = test::all_close(x.grad().to_host_f32(), g_ref, grad_tol, 0.0);
    INFO(gr.str());
    CHECK(gr.ok);
    const ManifestEntry* e = gpu.manifest().find("seg", "reduce");
    REQUIRE(e != nullptr);
    CHECK(e->op == "pixel_xent");
    CHECK(e->variant == name_of(r));
    CHECK(e->device == "cuda:0");
    CHECK(e->deterministic == (r == Reduction::Deterministic ? Determinism::Yes : Determinism::No));
    CHECK(e->guarantee == (r == Reduction::Deterministic ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
  }
}

TEST_CASE("gpu pixel_nll: both variants against the double reference; the gradient exact; deterministic repeats") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const SegProblem sp(seed, -8, 0);
  const int64_t n = sp.n, c = sp.c, h = sp.h, w = sp.w, hw = h * w, pixels = n * hw;
  const auto& xv = sp.x;
  const auto& labels = sp.labels;
  int64_t count = 0;
  const double want = ref::pixel_nll_fwd(xv.data(), labels.data(), n, c, hw, 255, &count);
  // The mean adds values <= 8 along a path of at most pixels / 32 + 24 additions (see above).
  const double loss_tol = double(pixels / 32 + 24) * std::ldexp(1.0, -24) * 8.0;
  // -1/count where the label is, computed as the kernel does (a float division).
  std::vector<float> g_ref(xv.size(), 0.f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < hw; ++p)
      if (const int32_t label = labels[std::size_t(i * hw + p)]; label != 255)
        g_ref[std::size_t((i * c + label) * hw + p)] = -1.f / static_cast<float>(count);
  for (Reduction r : kVariants) {
    INFO("reduce=" << name_of(r));
    gpu.policy().pin("seg", r);
    auto run = [&] {
      Var x(gpu.from_host(xv, {n, c, h, w}), true);
      Var l = pixel_nll(gpu, "seg", x, gpu.from_host(labels, {n, h, w}), 255);
      gpu.tape().backward(gpu, l);
      return std::make_pair(l.value(), x.grad());
    };
    const auto [loss, grad] = run();
    CHECK(std::fabs(double(loss.to_host_f32()[0]) - want) <= loss_tol);
    CHECK(grad.to_host_f32() == g_ref);  // -1/count in float, written once per element
    if (r == Reduction::Deterministic) CHECK(test::distinct_results(10, [&] { return run().first; }) == 1);
    const ManifestEntry* e = gpu.manifest().find("seg", "reduce");
    REQUIRE(e != nullptr);
    CHECK(e->variant == name_of(r));
  }
}

TEST_CASE("gpu pixel_cross_entropy: bad labels are NaN, all ignored is NaN with zero gradient") {
  Context gpu(Device::cuda(0));
  const int64_t n = 2, c = 3, h = 4, w = 5;
  auto xv = test::random_vec(std::size_t(n * c * h * w), 5);
  for (Reduction r : kVariants) {
    INFO("reduce=" << name_of(r));
    gpu.policy().pin("seg", r);
    std::vector<int32_t> labels(std::size_t(n * h * w), 1);
    labels[7] = 3;  // outside [0, 3) and not the ignore index
    Var x(gpu.from_host(xv, {n, c, h, w}), true);
    Var l = pixel_cross_entropy(gpu, "seg", x, gpu.from_host(labels, {n, h, w}));
    CHECK(std::isnan(l.value().to_host_f32()[0]));
    gpu.tape().backward(gpu, l);
    auto g = x.grad().to_host_f32();
    for (int64_t k = 0; k < c; ++k) CHECK(std::isnan(g[std::size_t(k * h * w + 7)]));
    CHECK_FALSE(std::isnan(g[0]));

    Var all(gpu.from_host(xv, {n, c, h, w}), true);
    Var nan = pixel_cross_entropy(gpu, "seg", all,
                                  gpu.from_host(std::vector<int32_t>(std::size_t(n * h * w), -100), {n, h, w}));
    CHECK(std::isnan(nan.value().to_host_f32()[0]));
    gpu.tape().backward(gpu, nan);
    for (float v : all.grad().to_host_f32()) CHECK(v == 0.0f);
  }
}

TEST_CASE("gpu pixel_cross_entropy: determinism over 10 calls and DETERMINISM lines at 16x21x256x256") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const int64_t n = 16, c = 21, h = 256, w = 256;
  Tensor x = gpu.from_host(test::random_vec(std::size_t(n * c * h * w), seed, -4, 4), {n, c, h, w});
  Tensor lab = gpu.from_host(random_labels(std::size_t(n * h * w), int(c), 255, seed), {n, h, w});
  double us[2] = {0, 0};
  for (Reduction r : kVariants) {
    gpu.policy().pin("seg", r);
    auto fwd = [&] { return pixel_cross_entropy(gpu, "seg", Var(x), lab, 255).value(); };
    std::size_t distinct = test::distinct_results(10, fwd);
    us[int(r)] = us_per_call(gpu, [&] { fwd(); });
    std::printf("DETERMINISM | pixel_xent 16x21x256x256 | reduce=%s | %zu/10 | %.1f us\n", name_of(r), distinct,
                us[int(r)]);
    INFO("reduce=" << name_of(r) << ": " << distinct << " distinct losses of 10");
    if (r == Reduction::Deterministic)
      CHECK(distinct == 1);
    else
      CHECK(distinct > 1);  // 1M pixel losses, 32768 warp sums added in arrival order
  }
  std::printf("COST | pixel_xent 16x21x256x256 fwd | deterministic / atomic = %.2f (goal <= 1.2)\n", us[1] / us[0]);
}
