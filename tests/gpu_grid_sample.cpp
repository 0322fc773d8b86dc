// Spatial transformer on the GPU: every grid_sample and affine_grid backward variant against the
// CPU reference in double (grids on a 1/64 lattice, so the unnormalized positions and bilinear
// weights are exact in float and the tolerances only cover the sums); determinism over 10 runs on a
// grid that squeezes every output onto a few input pixels (bit-equal where promised, more than one
// result for the atomic variants and for cuDNN's grid generator backward, which cuDNN does not list
// as non-reproducible but an H100 showed so; cuDNN's sampler observed and printed); the
// PolicyError for cuDNN without align_corners; one DETERMINISM line per variant with the time of
// forward + backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/grid_sample.h"
#include "kernels/grid_sample_ref.h"
#include "support.h"

using namespace ditto;

namespace {

constexpr double kU = 0x1p-24;
const GridSampleBwd kSampleVariants[] = {GridSampleBwd::Atomic, GridSampleBwd::Deterministic, GridSampleBwd::Cudnn};
const AffineGridBwd kAffineVariants[] = {AffineGridBwd::Atomic, AffineGridBwd::Deterministic, AffineGridBwd::Cudnn};

// Grid coordinates k/64, k in [-80, 80]: (g + 1) * W and (g + 1) / 2 * (W - 1) are exact in float
// for W <= 64, so positions, corner choices and weights (<= 14 fractional bits) are exact too.
std::vector<float> lattice_grid(std::size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(int(g() % 161) - 80) / 64.f;
  return v;
}

// The largest number of (position, corner) contributions any input pixel receives.
int64_t max_contributions(const std::vector<float>& grid, const ref::GridSampleDims& d) {
  std::map<int64_t, int64_t> hits;
  int64_t worst = 1;
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t p = 0; p < d.oh * d.ow; ++p) {
      const float* g = grid.data() + (n * d.oh * d.ow + p) * 2;
      const auto b = ref::bilinear_at(g[0], g[1], d.h, d.w, d.align_corners);
      for (int k = 0; k < 4; ++k)
        if (b.valid[k]) worst = std::max(worst, ++hits[n * d.h * d.w + b.iy[k] * d.w + b.ix[k]]);
    }
  return worst;
}

struct SampleGrads {
  Tensor y, dx, dgrid;
};

SampleGrads sample_step(Context& ctx, const std::string& layer, const Tensor& x, const Tensor& grid, const Tensor& dy,
                        bool ac) {
  Var xv(x, true), gv(grid, true);
  Var y = grid_sample(ctx, layer, xv, gv, ac);
  ctx.tape().backward(ctx, y, ctx.to_device(dy));
  return {y.value(), xv.grad(), gv.grad()};
}

}  // namespace

TEST_CASE("gpu grid sample: every backward variant against the CPU reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  for (bool ac : {false, true}) {
    ref::GridSampleDims d;
    d.n = 4, d.c = 5, d.h = 24, d.w = 32, d.oh = 40, d.ow = 36, d.align_corners = ac;
    auto xv = test::random_vec(std::size_t(d.n * d.c * d.h * d.w), seed);
    auto gvv = lattice_grid(std::size_t(d.n * d.oh * d.ow * 2), seed + 1);
    auto dyv = test::random_vec(std::size_t(d.n * d.c * d.oh * d.ow), seed + 2);
    std::vector<double> xd(xv.begin(), xv.end()), gd(gvv.begin(), gvv.end()), dyd(dyv.begin(), dyv.end());
    std::vector<double> y_ref(dyv.size()), dx_ref(xv.size()), dg_ref(gvv.size());
    ref::grid_sample_fwd(xd.data(), gd.data(), y_ref.data(), d);
    ref::grid_sample_bwd(xd.data(), gd.data(), dyd.data(), dx_ref.data(), dg_ref.data(), d);
    const double k = double(max_contributions(gvv, d));
    Tensor x = gpu.from_host(xv, {d.n, d.c, d.h, d.w}), grid = gpu.from_host(gvv, {d.n, d.oh, d.ow, 2});
    Tensor dy = gpu.from_host(dyv, {d.n, d.c, d.oh, d.ow});
    for (GridSampleBwd v : kSampleVariants) {
      if (v == GridSampleBwd::Cudnn && !ac) continue;  // refused: a separate test
      INFO("variant " << name_of(v) << ", align_corners " << ac << ", max contributions " << k);
      gpu.policy().pin("stn", v);
      auto r = sample_step(gpu, "stn", x, grid, dy, ac);
      // Forward: four exact weights times |x| <= 1, products and three adds rounded: <= 7u.
      auto f = test::all_close(r.y.to_host_f32(), y_ref, 8 * kU, 0.0);
      INFO("y: " << f.str());
      CHECK(f.ok);
      // dx: up to k products dy * w (|.| <= 1, one rounding each) summed in any order:
      // <= (k + 1) * k * u.
      auto b = test::all_close(r.dx.to_host_f32(), dx_ref, (k + 2) * k * kU, 0.0);
      INFO("dx: " << b.str());
      CHECK(b.ok);
      // dgrid: per channel (v1 - v0)(1 - fy) + (v3 - v2) fy (|.| <= 2, <= 5 roundings) times dy,
      // C of them summed, times the exact scale s <= W/2: s * C * (12 + 2C) u.
      const double s = ac ? (d.w - 1) / 2.0 : d.w / 2.0;
      auto g = test::all_close(r.dgrid.to_host_f32(), dg_ref, 2 * s * double(d.c) * (12 + 2 * d.c) * kU, 0.0);
      INFO("dgrid: " << g.str());
      CHECK(g.ok);
      const ManifestEntry* e = gpu.manifest().find("stn", "bwd");
      REQUIRE(e != nullptr);
      CHECK(e->op == "grid_sample");
      CHECK(e->variant == name_of(v));
      CHECK(e->device == "cuda:0");
      CHECK(e->deterministic == (v == GridSampleBwd::Deterministic ? Determinism::Yes : Determinism::No));
      CHECK(e->guarantee == (v == GridSampleBwd::Deterministic ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
    }
  }
}

TEST_CASE("gpu affine grid: every backward variant against the CPU reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const int64_t n = 6, h = 64, w = 48;
  auto thv = test::random_vec(std::size_t(n * 6), seed);
  auto dgv = test::random_vec(std::size_t(n * h * w * 2), seed + 1);
  std::vector<double> thd(thv.begin(), thv.end()), dgd(dgv.begin(), dgv.end());
  for (bool ac : {false, true}) {
    std::vector<double> g_ref(dgv.size()), dth_ref(thv.size()), abs_sum(thv.size(), 0.0);
    ref::affine_grid_fwd(thd.data(), g_ref.data(), n, h, w, ac);
    ref::affine_grid_bwd(dgd.data(), dth_ref.data(), n, h, w, ac);
    // sum over the points of |dgrid * base|, per dtheta entry: the scale of its rounding error.
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j) {
          const double base[3] = {std::fabs(ref::affine_base<double>(j, w, ac)),
                                  std::fabs(ref::affine_base<double>(i, h, ac)), 1.0};
          for (int r = 0; r < 2; ++r)
            for (int k = 0; k < 3; ++k)
              abs_sum[b * 6 + r * 3 + k] += std::fabs(dgd[((b * h + i) * w + j) * 2 + r]) * base[k];
        }
    for (AffineGridBwd v : kAffineVariants) {
      if (v == AffineGridBwd::Cudnn && !ac) continue;
      INFO("variant " << name_of(v) << ", align_corners " << ac);
      gpu.policy().pin("loc", v);
      Var th(gpu.from_host(thv, {n, 2, 3}), true);
      Var grid = affine_grid(gpu, "loc", th, h, w, ac);
      gpu.tape().backward(gpu, grid, gpu.from_host(dgv, grid.shape()));
      // Grid: th0*bx + th1*by + th2 with |theta|, |base| <= 1, base itself one rounding: <= 12u.
      auto f = test::all_close(grid.value().to_host_f32(), g_ref, 16 * kU, 0.0);
      INFO("grid: " << f.str());
      CHECK(f.ok);
      // dtheta sums h*w products (base rounded once, product once). ditto's chains are at most
      // h*w/256 sequential adds, a 5-level warp tree, 8 warps and <= 256 partials; cuDNN's order is
      // its own, so for it the bound of a fully sequential sum. With m = the chain length,
      // |error| <= (m + 3) u * sum |dgrid * base|.
      const double m = v == AffineGridBwd::Cudnn ? double(h * w) : double(h * w) / 256 + 5 + 8 + 256;
      auto got = th.grad().to_host_f32();
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("dtheta[" << i << "] got " << got[i] << " reference " << dth_ref[i]);
        CHECK(std::fabs(got[i] - dth_ref[i]) <= (m + 3) * kU * (std::fabs(abs_sum[i]) + 1e-30) + 1e-30);
      }
      const ManifestEntry* e = gpu.manifest().find("loc", "bwd");
      REQUIRE(e != nullptr);
      CHECK(e->variant == name_of(v));
      CHECK(e->guarantee == (v == AffineGridBwd::Deterministic ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
    }
  }
}

TEST_CASE("gpu grid sample and affine grid: determinism of each variant over 10 runs, heavy collisions") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  // Every output of a 64x64 grid samples the central ~3x3 pixels of a 64x64 input (a zoom by 20):
  // each of those pixels receives ~1800 contributions per channel.
  const int64_t n = 16, c = 16, hw = 64;
  std::vector<float> theta_v;
  for (int64_t i = 0; i < n; ++i) theta_v.insert(theta_v.end(), {0.05f, 0.f, 0.f, 0.f, 0.05f, 0.f});
  Tensor theta = gpu.from_host(theta_v, {n, 2, 3});
  Tensor x = gpu.from_host(test::random_vec(std::size_t(n * c * hw * hw), seed), {n, c, hw, hw});
  Tensor dy = gpu.from_host(test::random_vec(std::size_t(n * c * hw * hw), seed + 1), {n, c, hw, hw});
  for (GridSampleBwd v : kSampleVariants) {
    gpu.policy().pin("stn", v);
    gpu.policy().pin("loc", AffineGridBwd::Deterministic);
    Tensor grid = affine_grid(gpu, "loc", Var(theta), hw, hw, true).value();
    std::map<std::string, std::size_t> distinct;
    distinct["dx"] = test::distinct_results(10, [&] { return sample_step(gpu, "stn", x, grid, dy, true).dx; });
    distinct["dgrid"] = test::distinct_results(10, [&] { return sample_step(gpu, "stn", x, grid, dy, true).dgrid; });
    distinct["y"] = test::distinct_results(10, [&] { return sample_step(gpu, "stn", x, grid, dy, true).y; });
    const double us = test::us_per_call(gpu, [&] { sample_step(gpu, "stn", x, grid, dy, true); });
    std::printf("DETERMINISM | grid_sample | bwd=%s | dx %zu/10, dgrid %zu/10, y %zu/10 | %.1f us\n", name_of(v),
                distinct["dx"], distinct["dgrid"], distinct["y"], us);
    INFO("variant " << name_of(v) << ": dx " << distinct["dx"] << ", dgrid " << distinct["dgrid"]);
    if (v != GridSampleBwd::Cudnn) CHECK(distinct["y"] == 1);  // ditto's forward: one thread per output
    if (v == GridSampleBwd::Deterministic) {
      CHECK(distinct["dx"] == 1);
      CHECK(distinct["dgrid"] == 1);
      // A stronger zoom, shifted (theta 0.01, x moved by -0.015: every output on the central 2x3
      // pixels) gives pixels (31, 31) and (32, 31) 4096 records each, starting 1856 records into a
      // tile of the segmented sum (2048 records): their sums cross a whole tile. dx against the
      // reference, with the first test case's bound. Positions stay >= 0.0025 pixel from a corner
      // boundary (float rounding moves them by < 1e-5), so float and double pick the same corners.
      std::vector<float> tight_v;
      for (int64_t i = 0; i < n; ++i) tight_v.insert(tight_v.end(), {0.01f, 0.f, -0.015f, 0.f, 0.01f, 0.f});
      Tensor tight = affine_grid(gpu, "loc", Var(gpu.from_host(tight_v, {n, 2, 3})), hw, hw, true).value();
      ref::GridSampleDims d;
      d.n = n, d.c = c, d.h = hw, d.w = hw, d.oh = hw, d.ow = hw, d.align_corners = true;
      const auto gv = tight.to_host_f32();
      const auto xv = x.to_host_f32(), dyv = dy.to_host_f32();
      std::vector<double> gd(gv.begin(), gv.end()), xd(xv.begin(), xv.end()), dyd(dyv.begin(), dyv.end());
      std::vector<double> dx_ref(xd.size());
      ref::grid_sample_bwd(xd.data(), gd.data(), dyd.data(), dx_ref.data(), static_cast<double*>(nullptr), d);
      const double k = double(max_contributions(gv, d));
      INFO("max contributions " << k);
      CHECK(k == 4096);
      auto b = test::all_close(sample_step(gpu, "stn", x, tight, dy, true).dx.to_host_f32(), dx_ref,
                               (k + 2) * k * kU, 0.0);
      INFO("dx: " << b.str());
      CHECK(b.ok);
    }
    if (v == GridSampleBwd::Atomic) {
      CHECK(distinct["dx"] > 1);
      CHECK(distinct["dgrid"] == 1);  // the grid gradient is each thread's own channel sum
    }
    // cudnn: cuDNN lists cudnnSpatialTfSamplerBackward as non-reproducible; the counts printed
    // above are an observation, nothing is asserted.
  }
  // dtheta over a 256x256 grid: 64 blocks of 8 warps add into each of the six entries per image.
  const int64_t big = 256;
  Tensor dgrid = gpu.from_host(test::random_vec(std::size_t(n * big * big * 2), seed + 2), {n, big, big, 2});
  for (AffineGridBwd v : kAffineVariants) {
    gpu.policy().pin("loc", v);
    auto step = [&] {
      Var th(theta, true);
      Var g = affine_grid(gpu, "loc", th, big, big, true);
      gpu.tape().backward(gpu, g, gpu.to_device(dgrid));
      return th.grad();
    };
    const std::size_t distinct = test::distinct_results(10, step);
    const double us = test::us_per_call(gpu, [&] { step(); });
    std::printf("DETERMINISM | affine_grid | bwd=%s | %zu/10 | %.1f us\n", name_of(v), distinct, us);
    if (v == AffineGridBwd::Deterministic) CHECK(distinct == 1);
    // atomic by construction; cuDNN's is not on its non-reproducible list, yet gave 10 results in 10
    // calls on an H100 with cuDNN 9.14: a finding this test keeps watching.
    if (v != AffineGridBwd::Deterministic) CHECK(distinct > 1);
  }
}

TEST_CASE("gpu grid sample and affine grid: cuDNN needs align_corners, and the policy says so at forward") {
  Context gpu(Device::cuda(0), Policy::parse({"stn.bwd=cudnn", "loc.bwd=cudnn"}));
  Var x(gpu.from_host(test::random_vec(2 * 3 * 8 * 8, 3), {2, 3, 8, 8}), true);
  Var theta(gpu.from_host(test::random_vec(12, 4), {2, 2, 3}), true);
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(affine_grid(gpu, "loc", theta, 8, 8, false),
                    Contains("affine_grid (layer 'loc')") && Contains("align_corners") && Contains("deterministic"));
  Var grid = affine_grid(gpu, "loc", theta, 8, 8, true);
  CHECK_THROWS_AS(grid_sample(gpu, "stn", x, grid, false), PolicyError);
  CHECK_THROWS_WITH(grid_sample(gpu, "stn", x, grid, false), Contains("grid_sample (layer 'stn')") && Contains("atomic"));
  Var y = grid_sample(gpu, "stn", x, grid, true);
  CHECK(gpu.manifest().find("stn", "bwd")->variant == "cudnn");
  CHECK(gpu.manifest().find("loc", "bwd")->variant == "cudnn");
  gpu.tape().backward(gpu, y);
  CHECK(x.grad().defined());
  CHECK(theta.grad().defined());
}

TEST_CASE("gpu grid sample: gradients reach only the inputs that want them, every variant") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  ref::GridSampleDims d;
  d.n = 2, d.c = 3, d.h = 16, d.w = 16, d.oh = 12, d.ow = 12, d.align_corners = true;
  auto xv = test::random_vec(std::size_t(d.n * d.c * d.h * d.w), seed);
  auto gv = lattice_grid(std::size_t(d.n * d.oh * d.ow * 2), seed + 1);
  for (GridSampleBwd v : kSampleVariants) {
    INFO("variant " << name_of(v));
    gpu.policy().pin("stn", v);
    Var x(gpu.from_host(xv, {d.n, d.c, d.h, d.w}), false), g(gpu.from_host(gv, {d.n, d.oh, d.ow, 2}), true);
    gpu.tape().backward(gpu, grid_sample(gpu, "stn", x, g, true));
    CHECK_FALSE(x.grad().defined());
    CHECK(g.grad().defined());
    Var x2(gpu.from_host(xv, {d.n, d.c, d.h, d.w}), true), g2(gpu.from_host(gv, {d.n, d.oh, d.ow, 2}), false);
    gpu.tape().backward(gpu, grid_sample(gpu, "stn", x2, g2, true));
    CHECK(x2.grad().defined());
    CHECK_FALSE(g2.grad().defined());
  }
}
