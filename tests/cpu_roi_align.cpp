// ROI align on the CPU: the reference's gradient to the image against central differences in
// double (aligned both ways, adaptive and fixed sampling, rois reaching past the image), values on
// images whose bilinear samples are known (a constant, a ramp: each bin returns its centre), the CPU
// op against the reference, bad rois as DataErrors, shape errors, knobs and the manifest.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/roi_align.h"
#include "kernels/roi_align_ref.h"
#include "support.h"

using namespace ditto;

namespace {

// K random rois over batch n, corners in [-4, w + 4] x [-4, h + 4] (some reach past the image).
std::vector<double> random_rois(int64_t k, int64_t n, int64_t h, int64_t w, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> uy(-4.0, double(h) + 4.0), ux(-4.0, double(w) + 4.0);
  std::vector<double> r;
  for (int64_t i = 0; i < k; ++i) {
    double x1 = ux(g), x2 = ux(g), y1 = uy(g), y2 = uy(g);
    r.insert(r.end(), {double(g() % uint64_t(n)), std::min(x1, x2), std::min(y1, y2), std::max(x1, x2),
                       std::max(y1, y2)});
  }
  return r;
}

ref::RoiAlignDims dims(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, const RoiAlignParams& p) {
  ref::RoiAlignDims d;
  d.n = n, d.c = c, d.h = h, d.w = w, d.rois = k, d.ph = p.out_h, d.pw = p.out_w;
  d.spatial_scale = p.spatial_scale, d.sampling_ratio = p.sampling_ratio, d.aligned = p.aligned;
  return d;
}

}  // namespace

TEST_CASE("roi align reference: gradient to the image against central differences in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (bool aligned : {false, true})
    for (int sr : {-1, 2}) {
      INFO("aligned " << aligned << ", sampling_ratio " << sr);
      const RoiAlignParams p{3, 2, 0.5f, sr, aligned};
      const auto d = dims(2, 2, 7, 9, 5, p);
      auto rois = random_rois(d.rois, d.n, 2 * d.h, 2 * d.w, seed);  // scale 0.5: image coordinates
      auto x = test::random_vec<double>(std::size_t(d.n * d.c * d.h * d.w), seed + 1);
      const std::size_t ny = std::size_t(d.rois * d.c * d.ph * d.pw);
      auto w = test::loss_weights(ny, seed);
      std::vector<double> dx(x.size());
      ref::roi_align_bwd(rois.data(), w.data(), dx.data(), d);
      auto loss = [&](const std::vector<double>& xin) {
        std::vector<double> y(ny);
        ref::roi_align_fwd(xin.data(), rois.data(), y.data(), d);
        return test::weighted_sum(y, w);
      };
      CHECK(test::gradcheck(loss, x, dx) < 1e-6);
    }
}

TEST_CASE("roi align on the CPU: a constant image returns the constant, a ramp returns bin centres") {
  Context ctx;
  const int64_t h = 12, w = 16;
  std::vector<float> ones(h * w, 1.f), ramp(h * w);
  for (int64_t i = 0; i < h * w; ++i) ramp[i] = float(i % w);  // value = column index
  // Box x from 2 to 10, y from 3 to 9, in the interior.
  Tensor rois = ctx.from_host(std::vector<float>{0, 2, 3, 10, 9}, {1, 5});
  for (bool aligned : {false, true}) {
    INFO("aligned " << aligned);
    const RoiAlignParams p{2, 4, 1.f, -1, aligned};
    auto yc = roi_align(ctx, "r", Var(ctx.from_host(ones, {1, 1, h, w})), rois, p).value().to_host_f32();
    for (float v : yc) CHECK(std::fabs(v - 1.f) <= 1e-6f);
    // Bilinear sampling reproduces a linear function, and each bin's samples are symmetric about
    // its centre: output = the bin's centre column, start + (pw + 1/2) * 2 with start = 2 - offset.
    auto yr = roi_align(ctx, "r", Var(ctx.from_host(ramp, {1, 1, h, w})), rois, p).value().to_host_f32();
    const float start = aligned ? 1.5f : 2.f;
    for (int64_t py = 0; py < 2; ++py)
      for (int64_t px = 0; px < 4; ++px) CHECK(std::fabs(yr[py * 4 + px] - (start + 1.f + 2.f * px)) <= 1e-5f);
  }
}

TEST_CASE("roi align on the CPU: the op against the reference, values and gradient") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const RoiAlignParams p{7, 7, 0.25f, 0, true};
  const auto d = dims(3, 4, 16, 20, 12, p);
  auto rd = random_rois(d.rois, d.n, 4 * d.h, 4 * d.w, seed);
  std::vector<float> rv(rd.begin(), rd.end());
  auto xv = test::random_vec(std::size_t(d.n * d.c * d.h * d.w), seed + 1);
  auto dyv = test::random_vec(std::size_t(d.rois * d.c * d.ph * d.pw), seed + 2);
  Var x(ctx.from_host(xv, {d.n, d.c, d.h, d.w}), true);
  Var y = roi_align(ctx, "roi", x, ctx.from_host(rv, {d.rois, 5}), p);
  CHECK(y.shape() == Shape{d.rois, d.c, 7, 7});
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, y.shape()));
  std::vector<float> yref(dyv.size()), dxref(xv.size());
  ref::roi_align_fwd(xv.data(), rv.data(), yref.data(), d);
  ref::roi_align_bwd(rv.data(), dyv.data(), dxref.data(), d);
  CHECK(y.value().to_host_f32() == yref);
  CHECK(x.grad().to_host_f32() == dxref);
}

TEST_CASE("roi align: bad rois are DataErrors on the CPU; bad shapes and parameters are ShapeErrors") {
  Context ctx;
  using Catch::Matchers::Contains;
  Var x(ctx.zeros({2, 3, 8, 8}), true);
  const RoiAlignParams p;
  CHECK_THROWS_WITH(roi_align(ctx, "roi", x, ctx.from_host(std::vector<float>{0, 1, 1, 4, 4, 2, 1, 1, 4, 4}, {2, 5}), p),
                    Contains("roi_align (layer 'roi')") && Contains("roi 1") && Contains("[0, 2)"));
  CHECK_THROWS_AS(roi_align(ctx, "roi", x, ctx.from_host(std::vector<float>{-1, 1, 1, 4, 4}, {1, 5}), p), DataError);
  CHECK_THROWS_AS(roi_align(ctx, "roi", x, ctx.from_host(std::vector<float>{0, NAN, 1, 4, 4}, {1, 5}), p), DataError);
  CHECK_THROWS_WITH(roi_align(ctx, "roi", x, ctx.zeros({3, 4}), p), Contains("{K, 5}"));
  CHECK_THROWS_WITH(roi_align(ctx, "roi", x, ctx.zeros({3, 5}), RoiAlignParams{0, 7}), Contains("at least 1x1"));
  CHECK_THROWS_WITH(roi_align(ctx, "roi", x, ctx.zeros({3, 5}), RoiAlignParams{7, 7, 0.f}), Contains("spatial_scale"));
  CHECK_THROWS_AS(roi_align(ctx, "roi", Var(ctx.zeros({3, 8, 8})), ctx.zeros({3, 5}), p), ShapeError);
  CHECK_THROWS_AS(roi_align(ctx, "roi", x, ctx.zeros({3, 5}, DType::I32), p), ShapeError);
  // No rois: an empty output, and a zero gradient.
  Var y = roi_align(ctx, "roi", x, ctx.zeros({0, 5}), p);
  CHECK(y.shape() == Shape{0, 3, 7, 7});
  ctx.tape().backward(ctx, y, ctx.zeros({0, 3, 7, 7}));
  for (float g : x.grad().to_host_f32()) CHECK(g == 0.f);
}

TEST_CASE("roi align: knobs, mode words, the manifest and the tape") {
  Policy p;
  CHECK(p.variant<RoiAlignBwd>("r", op::roi_align) == RoiAlignBwd::Atomic);  // torchvision's kernel
  CHECK(Policy::parse({"*=deterministic"}).variant<RoiAlignBwd>("r", op::roi_align) == RoiAlignBwd::Deterministic);
  CHECK(Policy::parse({"*=nondeterministic"}).variant<RoiAlignBwd>("r", op::roi_align) == RoiAlignBwd::Atomic);
  CHECK(Policy::parse({"*=fastest"}).variant<RoiAlignBwd>("r", op::roi_align) == RoiAlignBwd::Atomic);
  p.pin("r", RoiAlignBwd::Deterministic);  // the variant's name is also the mode word
  CHECK(p.variant<RoiAlignBwd>("r", op::roi_align) == RoiAlignBwd::Deterministic);
  CHECK(p.requested("r", "bwd", op::roi_align) == "deterministic");
  p.pin("r", RoiAlignBwd::Atomic);
  CHECK(p.variant<RoiAlignBwd>("r", op::roi_align) == RoiAlignBwd::Atomic);
  CHECK(p.requested("r", "bwd", op::roi_align) == "pinned");
  CHECK_THROWS_AS(Policy::parse({"r.bwd=cudnn"}).variant<RoiAlignBwd>("r", op::roi_align), PolicyError);
  CHECK(std::string(op_kind_name(op::roi_align)) == "roi_align");

  Context ctx(Device::cpu(), Policy::parse({"*=deterministic"}));
  Var x(ctx.from_host(test::random_vec(2 * 3 * 8 * 8, 7), {2, 3, 8, 8}), true);
  Var y = roi_align(ctx, "roi", x, ctx.from_host(std::vector<float>{1, 0, 0, 6, 6}, {1, 5}), RoiAlignParams{});
  const ManifestEntry* e = ctx.manifest().find("roi", "bwd");
  REQUIRE(e != nullptr);
  CHECK(e->op == "roi_align");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "deterministic");
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"roi:roi_align"});
  ctx.tape().backward(ctx, y);
  auto g = x.grad().to_host_f32();
  double image0 = 0, image1 = 0;
  for (std::size_t i = 0; i < g.size() / 2; ++i) image0 += std::fabs(g[i]);
  for (std::size_t i = g.size() / 2; i < g.size(); ++i) image1 += std::fabs(g[i]);
  CHECK(image0 == 0.0);  // the roi is on image 1
  CHECK(image1 > 0.0);
  NoGradGuard guard(ctx);
  CHECK_FALSE(roi_align(ctx, "roi", x, ctx.from_host(std::vector<float>{1, 0, 0, 6, 6}, {1, 5}), RoiAlignParams{})
                  .requires_grad());
  CHECK(ctx.tape().size() == 0);
}
