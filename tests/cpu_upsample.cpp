// Upsampling on the CPU: gradient checks of the reference in double (nearest and bilinear, both
// align_corners settings, scale 2, non-integer scales and downsampling), PyTorch's values on small
// inputs, the GPU's gather backward (ref::upsample_gather_at, the function the CUDA kernel calls)
// against the reference's scatter — in double on random gradients and in float, contribution by
// contribution, bit for bit — the CPU op path, errors and the `bwd` knob.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/upsample.h"
#include "kernels/upsample_ref.h"
#include "support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

ref::UpsampleDims dims(int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow, bool bilinear, bool align) {
  ref::UpsampleDims d;
  d.planes = planes, d.h = h, d.w = w, d.oh = oh, d.ow = ow, d.bilinear = bilinear, d.align_corners = align;
  return d;
}

std::string describe(const ref::UpsampleDims& d) {
  return std::to_string(d.h) + "x" + std::to_string(d.w) + " -> " + std::to_string(d.oh) + "x" + std::to_string(d.ow) +
         (d.bilinear ? " bilinear" : " nearest") + (d.align_corners ? " align_corners" : "");
}

// The gather backward, run on the host for every input of every plane, its taps from `taps`.
template <class C, class T, class Taps>
std::vector<T> gather_all(const std::vector<T>& dy, const ref::UpsampleDims& d, const Taps& taps) {
  std::vector<T> dx(std::size_t(d.planes * d.h * d.w));
  for (int64_t pl = 0; pl < d.planes; ++pl)
    for (int64_t ih = 0; ih < d.h; ++ih)
      for (int64_t iw = 0; iw < d.w; ++iw)
        dx[std::size_t((pl * d.h + ih) * d.w + iw)] =
            static_cast<T>(ref::upsample_gather_at<C>(dy.data() + pl * d.oh * d.ow, ih, iw, d, taps));
  return dx;
}

// The GPU's atomic backward, run sequentially on the host in float: each output sends
// (wy * wx) * dy to its taps (the same host/device functions, rounding as the device does).
std::vector<float> scatter_float(const std::vector<float>& dy, const ref::UpsampleDims& d) {
  std::vector<float> dx(std::size_t(d.planes * d.h * d.w), 0.f);
  for (int64_t pl = 0; pl < d.planes; ++pl)
    for (int64_t oh = 0; oh < d.oh; ++oh)
      for (int64_t ow = 0; ow < d.ow; ++ow) {
        float* p = dx.data() + pl * d.h * d.w;
        const float g = dy[std::size_t((pl * d.oh + oh) * d.ow + ow)];
        if (!d.bilinear) {
          p[ref::nearest_src(oh, d.h, d.oh) * d.w + ref::nearest_src(ow, d.w, d.ow)] += g;
          continue;
        }
        const auto th = ref::linear_tap<float>(oh, d.h, d.oh, d.align_corners);
        const auto tw = ref::linear_tap<float>(ow, d.w, d.ow, d.align_corners);
        p[th.i0 * d.w + tw.i0] += ref::mul_rn(ref::mul_rn(th.l0, tw.l0), g);
        p[th.i0 * d.w + tw.i1] += ref::mul_rn(ref::mul_rn(th.l0, tw.l1), g);
        p[th.i1 * d.w + tw.i0] += ref::mul_rn(ref::mul_rn(th.l1, tw.l0), g);
        p[th.i1 * d.w + tw.i1] += ref::mul_rn(ref::mul_rn(th.l1, tw.l1), g);
      }
  return dx;
}

}  // namespace

TEST_CASE("upsample reference: gradient check in double, both modes, both align_corners, many scales") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const std::vector<std::array<int64_t, 4>> sizes = {{4, 5, 8, 10}, {4, 6, 6, 9}, {5, 3, 8, 7}, {7, 6, 3, 4}, {1, 3, 4, 7}};
  for (const auto& s : sizes)
    for (bool bilinear : {false, true})
      for (bool align : {false, true}) {
        if (align && !bilinear) continue;
        const auto d = dims(2, s[0], s[1], s[2], s[3], bilinear, align);
        INFO(describe(d));
        const std::size_t nx = std::size_t(d.planes * d.h * d.w), ny = std::size_t(d.planes * d.oh * d.ow);
        auto x = test::random_vec<double>(nx, seed);
        auto w = test::loss_weights(ny, seed);
        auto loss = [&](const std::vector<double>& in) {
          std::vector<double> y(ny);
          ref::upsample_fwd(in.data(), y.data(), d);
          return test::weighted_sum(y, w);
        };
        std::vector<double> dx(nx);
        ref::upsample_bwd(w.data(), dx.data(), d);
        CHECK(test::gradcheck(loss, x, dx) < 1e-6);
      }
}

TEST_CASE("upsample2d on the CPU: PyTorch's values on a 2x2 input") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4}, {1, 1, 2, 2}), true);
  UpsampleParams p;
  p.out_h = p.out_w = 4;
  CHECK(upsample2d(ctx, "up", x, p).value().to_host_f32() ==
        std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  p.mode = UpsampleMode::Bilinear;
  // torch.nn.functional.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False)
  CHECK(upsample2d(ctx, "up", x, p).value().to_host_f32() ==
        std::vector<float>{1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3, 3.25f, 3.75f, 4});
  p.align_corners = true;
  p.out_h = p.out_w = 3;
  CHECK(upsample2d(ctx, "up", x, p).value().to_host_f32() == std::vector<float>{1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4});
  // Nearest 2 -> 3 (scale 1.5): sources floor(o * 2 / 3) = 0, 0, 1.
  UpsampleParams n;
  n.out_h = 3;
  n.out_w = 3;
  CHECK(upsample2d(ctx, "up", x, n).value().to_host_f32() == std::vector<float>{1, 1, 2, 1, 1, 2, 3, 3, 4});
  CHECK(upsample_size(5, 1.5) == 7);
  CHECK(upsample_size(64, 2.0) == 128);
}

TEST_CASE("upsample gather backward (the GPU's) equals the reference's scatter, in double, on many geometries") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  // Every side from 1 to 7 in, 1 to 17 out, both modes and settings: the range search of
  // ref::linear_out_range must find exactly the outputs whose taps name each input.
  for (int64_t in = 1; in <= 7; ++in)
    for (int64_t out = 1; out <= 17; ++out)
      for (int mode = 0; mode < 3; ++mode) {
        const bool bilinear = mode > 0, align = mode == 2;
        const auto d = dims(2, in, 3, out, 5, bilinear, align);
        INFO(describe(d));
        auto dy = test::random_vec<double>(std::size_t(d.planes * d.oh * d.ow), seed + uint64_t(in * 100 + out));
        std::vector<double> want(std::size_t(d.planes * d.h * d.w));
        ref::upsample_bwd(dy.data(), want.data(), d);
        // Sums of at most (2 * ceil(out / in) + 2)^2 terms of size <= 1 in another order: 1e-12 is
        // far above double rounding and far below any missing or extra term.
        auto r = test::all_close(gather_all<double>(dy, d, ref::ComputedTaps<double>{&d}), want, 1e-12, 0.0);
        INFO(r.str());
        CHECK(r.ok);
      }
}

TEST_CASE("upsample gather backward in float sends every output the same contributions as the atomic scatter") {
  // With a one-hot output gradient both sums hold a single nonzero term, so the gather (GPU
  // arithmetic: float taps, products rounded before adding) must equal the scatter bit for bit:
  // the same taps, the same weights, nothing missing, nothing extra.
  // Small planes in both directions, and the GPU tests' and benchmark's sides (64 -> 128, 64 -> 96)
  // one axis at a time.
  for (const auto& s : std::vector<std::array<int64_t, 4>>{{5, 4, 8, 10}, {4, 4, 8, 8}, {7, 9, 3, 4}, {3, 2, 10, 7},
                                                          {1, 6, 4, 9}, {64, 1, 128, 1}, {1, 64, 1, 96}, {64, 1, 96, 1}})
    for (int mode = 0; mode < 3; ++mode) {
      const auto d = dims(1, s[0], s[1], s[2], s[3], mode > 0, mode == 2);
      INFO(describe(d));
      const auto tables = ref::build_tap_tables(d);  // what the CUDA table kernel fills
      int64_t mismatches = 0;
      for (int64_t o = 0; o < d.oh * d.ow; ++o) {
        std::vector<float> dy(std::size_t(d.oh * d.ow), 0.f);
        dy[std::size_t(o)] = 0.7f;
        const auto a = gather_all<float>(dy, d, tables.view()), b = scatter_float(dy, d);
        for (std::size_t i = 0; i < a.size(); ++i) mismatches += a[i] != b[i];
      }
      CHECK(mismatches == 0);
    }
}

TEST_CASE("upsample2d on the CPU: matches the reference through the tape; errors; the bwd knob") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cpu(), Policy::parse({"up.bwd=gather"}));
  const Shape xs = {2, 3, 5, 6};
  auto xv = test::random_vec(std::size_t(shape_numel(xs)), seed);
  UpsampleParams p;
  p.mode = UpsampleMode::Bilinear;
  p.out_h = 8;
  p.out_w = 9;
  Var x(ctx.from_host(xv, xs), true);
  Var y = upsample2d(ctx, "up", x, p);
  REQUIRE(y.shape() == Shape{2, 3, 8, 9});
  const auto d = dims(6, 5, 6, 8, 9, true, false);
  std::vector<float> want(std::size_t(6 * 8 * 9));
  ref::upsample_fwd(xv.data(), want.data(), d);
  CHECK(y.value().to_host_f32() == want);
  auto g = test::random_vec(want.size(), seed + 1);
  ctx.tape().backward(ctx, y, ctx.from_host(g, y.shape()));
  std::vector<float> dx(xv.size());
  ref::upsample_bwd(g.data(), dx.data(), d);
  CHECK(x.grad().to_host_f32() == dx);
  const ManifestEntry* e = ctx.manifest().find("up", "bwd");
  REQUIRE(e != nullptr);
  CHECK(e->op == "upsample");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "pinned");

  UpsampleParams bad = p;
  bad.mode = UpsampleMode::Nearest;
  bad.align_corners = true;
  CHECK_THROWS_WITH(upsample2d(ctx, "up", x, bad), Contains("align_corners") && Contains("up"));
  bad = p;
  bad.out_w = 0;
  CHECK_THROWS_WITH(upsample2d(ctx, "up", x, bad), Contains("at least 1x1"));
  CHECK_THROWS_WITH(upsample2d(ctx, "up", Var(ctx.zeros({3, 4, 4})), p), Contains("4 dimensions"));
  CHECK_THROWS_WITH(upsample2d_backward(ctx, "up", ctx.zeros({2, 3, 8, 8}), xs, p), Contains("expected [2, 3, 8, 9]"));
  CHECK_THROWS_AS(upsample_size(3, 0.2), ShapeError);
  CHECK_THROWS_AS(upsample_size(3, -1.0), ShapeError);

  Policy pol;
  CHECK(pol.variant<UpsampleBwd>("up", op::upsample) == UpsampleBwd::Atomic);  // heuristic: PyTorch's bilinear backward
  CHECK(Policy::parse({"*=deterministic"}).variant<UpsampleBwd>("up", op::upsample) == UpsampleBwd::Gather);
  CHECK(Policy::parse({"*.bwd=gather"}).variant<UpsampleBwd>("up", op::upsample) == UpsampleBwd::Gather);  // as for max pools
  CHECK(Policy::parse({"*.bwd=cudnn"}).variant<UpsampleBwd>("up", op::upsample) == UpsampleBwd::Atomic);  // not an upsample variant
  pol.pin("up", UpsampleBwd::Gather);
  CHECK(pol.rules().back() == "up.bwd=gather");
  CHECK_THROWS_WITH(Policy::parse({"up.bwd=cudnn"}).check_layers({{"up", op::upsample}}),
                    Contains("not a variant of bwd"));
}
