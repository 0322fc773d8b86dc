// ditto's own convolution backward on the CPU: the plans of ditto-gemm and ditto-direct
// (kernels/detail/conv2d_own.h) and the index maps their CUDA kernels use, run here in double
// through the same decomposition (im2col -> per-item GEMM -> fold, GEMM -> col2im gather, the
// depthwise gathers) and compared with the reference (kernels/conv2d_ref.h), which the
// finite-difference tests of tests/cpu_conv2d.cpp check. A wrong tap, item or group offset in a
// map shows here as a mismatch far above double rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/policy.h"
#include "engine/tuning.h"
#include "kernels/conv2d_ref.h"
#include "kernels/detail/conv2d_own.h"
#include "support.h"

using namespace ditto;

namespace {

own::ConvGeom geom_of(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ref::Conv2dGeom r = ref::conv2d_geom(x, w, p);
  own::ConvGeom g;
  g.N = r.N, g.C = r.C, g.H = r.H, g.W = r.W, g.K = r.K, g.R = r.R, g.S = r.S, g.Ho = r.Ho, g.Wo = r.Wo;
  g.sh = r.stride_h, g.sw = r.stride_w, g.ph = r.pad_h, g.pw = r.pad_w, g.dh = r.dil_h, g.dw = r.dil_w, g.G = r.groups;
  return g;
}

// ditto-gemm's bwd_filter as the CUDA code runs it, in double: per conv group, items of
// images_per_item images (the remainder as one item), im2col through im2col_source, the item's
// product dY_g . cols^T, and the fold over items in order.
std::vector<double> gemm_bwd_filter(const own::ConvGeom& g, const std::vector<double>& x,
                                    const std::vector<double>& dy) {
  const own::GemmPlan p = own::plan_gemm(g, true);
  const int64_t kg = g.Kg(), crs = g.CRSg(), howo = g.HoWo();
  std::vector<double> dw(static_cast<std::size_t>(g.K * crs), 0.0);
  for (int64_t grp = 0; grp < g.G; ++grp)
    for (int64_t n0 = 0; n0 < g.N; n0 += p.images_per_item) {
      const int64_t images = std::min(p.images_per_item, g.N - n0);
      std::vector<double> cols(static_cast<std::size_t>(crs * images * howo));
      for (int64_t r = 0; r < crs; ++r)
        for (int64_t b = 0; b < images; ++b)
          for (int64_t pos = 0; pos < howo; ++pos) {
            const int64_t src = own::im2col_source<int64_t>(g, n0 + b, grp, r, pos);
            cols[static_cast<std::size_t>((r * images + b) * howo + pos)] = src < 0 ? 0.0 : x[static_cast<std::size_t>(src)];
          }
      for (int64_t k = 0; k < kg; ++k)
        for (int64_t r = 0; r < crs; ++r) {
          double acc = 0;
          for (int64_t b = 0; b < images; ++b)
            for (int64_t pos = 0; pos < howo; ++pos)
              acc += dy[static_cast<std::size_t>(((n0 + b) * g.K + grp * kg + k) * howo + pos)] *
                     cols[static_cast<std::size_t>((r * images + b) * howo + pos)];
          dw[static_cast<std::size_t>((grp * kg + k) * crs + r)] += acc;
        }
    }
  return dw;
}

// ditto-gemm's bwd_data: cols = W_g^T . dY_g per image, then the col2im gather through tap_target.
std::vector<double> gemm_bwd_data(const own::ConvGeom& g, const std::vector<double>& w, const std::vector<double>& dy) {
  const int64_t kg = g.Kg(), cg = g.Cg(), crs = g.CRSg(), howo = g.HoWo();
  std::vector<double> dx(static_cast<std::size_t>(g.N * g.C * g.HW()), 0.0);
  for (int64_t grp = 0; grp < g.G; ++grp)
    for (int64_t n = 0; n < g.N; ++n) {
      std::vector<double> cols(static_cast<std::size_t>(crs * howo), 0.0);
      for (int64_t r = 0; r < crs; ++r)
        for (int64_t pos = 0; pos < howo; ++pos) {
          double acc = 0;
          for (int64_t k = 0; k < kg; ++k)
            acc += w[static_cast<std::size_t>((grp * kg + k) * crs + r)] *
                   dy[static_cast<std::size_t>((n * g.K + grp * kg + k) * howo + pos)];
          cols[static_cast<std::size_t>(r * howo + pos)] = acc;
        }
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t h = 0; h < g.H; ++h)
          for (int64_t x = 0; x < g.W; ++x) {
            double acc = 0;
            for (int64_t r = 0; r < g.R; ++r)
              for (int64_t s = 0; s < g.S; ++s) {
                const int64_t pos = own::tap_target<int64_t>(g, h, x, r, s);
                if (pos >= 0) acc += cols[static_cast<std::size_t>(((c * g.R + r) * g.S + s) * howo + pos)];
              }
            dx[static_cast<std::size_t>(((n * g.C + grp * cg + c) * g.H + h) * g.W + x)] = acc;
          }
    }
  return dx;
}

// ditto-direct's depthwise gathers.
std::vector<double> direct_bwd_data(const own::ConvGeom& g, const std::vector<double>& w, const std::vector<double>& dy) {
  const int64_t mult = g.Kg(), howo = g.HoWo();
  std::vector<double> dx(static_cast<std::size_t>(g.N * g.C * g.HW()), 0.0);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t x = 0; x < g.W; ++x) {
          double acc = 0;
          for (int64_t m = 0; m < mult; ++m)
            for (int64_t r = 0; r < g.R; ++r)
              for (int64_t s = 0; s < g.S; ++s) {
                const int64_t pos = own::tap_target<int64_t>(g, h, x, r, s), k = c * mult + m;
                if (pos >= 0)
                  acc += w[static_cast<std::size_t>((k * g.R + r) * g.S + s)] *
                         dy[static_cast<std::size_t>((n * g.K + k) * howo + pos)];
              }
          dx[static_cast<std::size_t>(((n * g.C + c) * g.H + h) * g.W + x)] = acc;
        }
  return dx;
}

// ditto-direct's implicit GEMM (not depthwise): parts of implicit_part_length positions, each
// part's products summed per weight, then the parts in order.
std::vector<double> implicit_bwd_filter(const own::ConvGeom& g, const std::vector<double>& x,
                                        const std::vector<double>& dy) {
  const int64_t parts = own::direct_filter_parts(g), len = own::implicit_part_length(g), howo = g.HoWo();
  const int64_t total = g.N * howo, kg = g.Kg(), crsg = g.CRSg();
  REQUIRE(len % own::kImplicitStage == 0);
  REQUIRE(parts == (total + len - 1) / len);
  std::vector<double> dw(static_cast<std::size_t>(g.K * crsg), 0.0);
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t grp = 0; grp < g.G; ++grp)
      for (int64_t k = 0; k < kg; ++k)
        for (int64_t crs = 0; crs < crsg; ++crs) {
          double acc = 0;
          for (int64_t pos = p * len; pos < std::min(total, (p + 1) * len); ++pos) {
            const int64_t n = pos / howo, rem = pos % howo;
            const int64_t src = own::im2col_source<int64_t>(g, n, grp, crs, rem);
            if (src >= 0)
              acc += dy[static_cast<std::size_t>((n * g.K + grp * kg + k) * howo + rem)] * x[static_cast<std::size_t>(src)];
          }
          dw[static_cast<std::size_t>((grp * kg + k) * crsg + crs)] += acc;
        }
  return dw;
}

std::vector<double> direct_bwd_filter(const own::ConvGeom& g, const std::vector<double>& x,
                                      const std::vector<double>& dy) {
  if (!g.depthwise()) return implicit_bwd_filter(g, x, dy);
  const int64_t parts = own::direct_filter_parts(g), howo = g.HoWo(), taps = g.R * g.S;
  std::vector<double> dw(static_cast<std::size_t>(g.K * taps), 0.0);
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t lo = p * g.N / parts, hi = (p + 1) * g.N / parts;
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t c = k / g.Kg();
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t r = t / g.S, s = t % g.S;
        double acc = 0;
        for (int64_t n = lo; n < hi; ++n)
          for (int64_t pos = 0; pos < howo; ++pos) {
            const int64_t ho = pos / g.Wo, wo = pos % g.Wo;
            const int64_t h = ho * g.sh - g.ph + r * g.dh, xx = wo * g.sw - g.pw + s * g.dw;
            if (h < 0 || h >= g.H || xx < 0 || xx >= g.W) continue;
            acc += dy[static_cast<std::size_t>((n * g.K + k) * howo + pos)] *
                   x[static_cast<std::size_t>(((n * g.C + c) * g.H + h) * g.W + xx)];
          }
        dw[static_cast<std::size_t>(k * taps + t)] += acc;
      }
    }
  }
  return dw;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(b[i])));
  return worst;
}

struct OwnCase {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

Conv2dParams params(int stride, int pad, int dil, int groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dil;
  p.groups = groups;
  return p;
}

}  // namespace

TEST_CASE("ditto-gemm plans: images per item, in-place pointwise, workspace, chunks") {
  // 56x56 maps hold 3136 >= 2048 positions: one image per item; a 1x1 stride-1 convolution then
  // reads x in place (no im2col).
  own::ConvGeom g = geom_of({128, 64, 56, 56}, {256, 64, 1, 1}, params(1, 0, 1, 1));
  own::GemmPlan p = own::plan_gemm(g, true);
  CHECK(p.images_per_item == 1);
  CHECK(p.in_place);
  CHECK(!p.transpose_dy);
  CHECK(p.cols_floats == 0);
  CHECK(p.partial_floats == std::size_t(256 * 64) * std::size_t(p.items_per_chunk));
  CHECK(p.items_per_chunk == 128);  // 64 KiB of partials per image: the whole batch in one chunk
  // 7x7 maps: 64 images per item reach 3136 positions; dY is rearranged; no longer in place.
  g = geom_of({128, 2048, 7, 7}, {512, 2048, 1, 1}, params(1, 0, 1, 1));
  p = own::plan_gemm(g, true);
  CHECK(p.images_per_item == 64);
  CHECK(!p.in_place);
  CHECK(p.transpose_dy);
  // Never more images per item than the batch has.
  g = geom_of({3, 8, 4, 4}, {8, 8, 3, 3}, params(1, 1, 1, 1));
  CHECK(own::plan_gemm(g, false).images_per_item == 2);
  // A large im2col is cut into chunks of at most kChunkBytes.
  g = geom_of({128, 64, 56, 56}, {64, 64, 3, 3}, params(1, 1, 1, 1));
  p = own::plan_gemm(g, true);
  CHECK(p.items_per_chunk < 128);
  CHECK(p.items_per_chunk >= 1);
  CHECK(p.workspace_bytes() <= own::kChunkBytes);
  CHECK(p.cols_floats == std::size_t(64 * 9 * 3136) * std::size_t(p.items_per_chunk));
}

TEST_CASE("ditto-gemm and ditto-direct say which problems they take, and why not") {
  std::string why;
  const own::ConvGeom dense = geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(1, 1, 1, 1));
  CHECK(own::gemm_supports(dense, &why));
  CHECK_FALSE(own::direct_supports(dense, false, &why));  // bwd_data: depthwise only
  CHECK_THAT(why, Catch::Contains("depthwise"));
  CHECK(own::direct_supports(dense, true, &why));  // bwd_filter: the implicit GEMM takes any
  const own::ConvGeom dw = geom_of({2, 128, 8, 8}, {128, 1, 3, 3}, params(1, 1, 1, 128));
  CHECK(own::direct_supports(dw, false, &why));
  CHECK(own::direct_supports(dw, true, &why));
  CHECK_FALSE(own::gemm_supports(dw, &why));  // 128 groups: one GEMM each is not ditto-gemm's job
  CHECK_THAT(why, Catch::Contains("128") && Catch::Contains("ditto-direct"));
  const own::ConvGeom big = geom_of({2, 4, 20, 20}, {4, 1, 9, 9}, params(1, 4, 1, 4));
  CHECK_FALSE(own::direct_supports(big, false, &why));
  CHECK_THAT(why, Catch::Contains("9x9"));
  CHECK(own::direct_filter_parts(dw) >= 1);
  // The implicit GEMM's parts: a shape-fixed length, a multiple of the stage, about 2048 blocks.
  const own::ConvGeom stem = geom_of({128, 3, 224, 224}, {64, 3, 7, 7}, params(2, 3, 1, 1));
  const int64_t len = own::implicit_part_length(stem);
  CHECK(len % own::kImplicitStage == 0);
  CHECK(own::direct_filter_parts(stem) == (128 * 112 * 112 + len - 1) / len);
  CHECK(own::direct_filter_parts(stem) * 3 >= 1024);  // 3 tiles of 64 over c*r*s = 147
  CHECK(own::direct_filter_workspace_bytes(dw) == std::size_t(own::direct_filter_parts(dw) * 128 * 9) * sizeof(float));
}

TEST_CASE("ditto-gemm's and ditto-direct's decompositions equal the reference (double, index maps of the kernels)") {
  Conv2dParams rect = params(1, 0, 1, 1);
  rect.pad_w = 3;
  Conv2dParams mixed = params(2, 1, 1, 1);
  mixed.stride_w = 1;
  mixed.dilation_w = 2;
  mixed.pad_w = 2;
  const std::vector<OwnCase> cases = {
      {"3x3 pad 1, N=7 (items of 4 + remainder 3)", {7, 3, 6, 6}, {4, 3, 3, 3}, params(1, 1, 1, 1)},
      {"1x1", {2, 5, 9, 9}, {3, 5, 1, 1}, params(1, 0, 1, 1)},
      {"1x1 stride 2", {3, 4, 7, 7}, {6, 4, 1, 1}, params(2, 0, 1, 1)},
      {"3x3 stride 2 pad 1 groups 2", {3, 4, 7, 7}, {6, 2, 3, 3}, params(2, 1, 1, 2)},
      {"1x7 pad (0, 3)", {2, 3, 5, 9}, {2, 3, 1, 7}, rect},
      {"5x5 dilation 2 pad 3", {2, 2, 11, 11}, {3, 2, 5, 5}, params(1, 3, 2, 1)},
      {"3x3 stride (2, 1) dilation (1, 2) pad (1, 2)", {2, 3, 9, 8}, {4, 3, 3, 3}, mixed},
      {"3x3 depthwise x2 stride 2 pad 1", {3, 4, 9, 9}, {8, 1, 3, 3}, params(2, 1, 1, 4)},
      {"5x5 depthwise pad 2", {2, 6, 8, 8}, {6, 1, 5, 5}, params(1, 2, 1, 6)},
  };
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const auto& c : cases) {
    INFO(c.name);
    const own::ConvGeom g = geom_of(c.x, c.w, c.p);
    const ref::Conv2dGeom rg = ref::conv2d_geom(c.x, c.w, c.p);
    const Shape ys = conv2d_output_shape("t", c.x, c.w, c.p);
    auto x = test::random_vec<double>(std::size_t(shape_numel(c.x)), seed);
    auto w = test::random_vec<double>(std::size_t(shape_numel(c.w)), seed + 1);
    auto dy = test::random_vec<double>(std::size_t(shape_numel(ys)), seed + 2);
    std::vector<double> want_dx(x.size()), want_dw(w.size());
    ref::conv2d_bwd_data(rg, dy.data(), w.data(), want_dx.data());
    ref::conv2d_bwd_filter(rg, x.data(), dy.data(), want_dw.data());
    // Double rounding of sums of at most a few hundred unit-size products: far below 1e-12.
    CHECK(max_rel_diff(gemm_bwd_filter(g, x, dy), want_dw) < 1e-12);
    CHECK(max_rel_diff(gemm_bwd_data(g, w, dy), want_dx) < 1e-12);
    CHECK(max_rel_diff(direct_bwd_filter(g, x, dy), want_dw) < 1e-12);
    if (g.depthwise()) CHECK(max_rel_diff(direct_bwd_data(g, w, dy), want_dx) < 1e-12);
  }
}

TEST_CASE("ditto-winograd: which problems it takes, its plan, and its algorithm against the reference") {
  std::string why;
  CHECK(own::winograd_supports(geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(1, 1, 1, 1)), &why));
  CHECK_FALSE(own::winograd_supports(geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(2, 1, 1, 1)), &why));
  CHECK_THAT(why, Catch::Contains("stride 2x2") && Catch::Contains("ditto-gemm takes any"));
  CHECK_FALSE(own::winograd_supports(geom_of({2, 8, 9, 9}, {8, 8, 5, 5}, params(1, 2, 1, 1)), &why));
  CHECK_THAT(why, Catch::Contains("5x5"));
  CHECK_FALSE(own::winograd_supports(geom_of({2, 8, 8, 8}, {8, 4, 3, 3}, params(1, 1, 1, 2)), &why));
  CHECK_THAT(why, Catch::Contains("2 groups"));
  CHECK_FALSE(own::winograd_supports(geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(1, 3, 1, 1)), &why));
  CHECK_THAT(why, Catch::Contains("padding of at most 2"));
  // ditto.torch's conv2d row: 8x8 tiles, 32 images per part (2048 positions), 4 parts in one chunk.
  const own::WinogradPlan p = own::plan_winograd(geom_of({128, 128, 16, 16}, {128, 128, 3, 3}, params(1, 1, 1, 1)));
  CHECK(p.tiles_h == 8);
  CHECK(p.images_per_part == 32);
  CHECK(p.parts == 4);
  CHECK(p.parts_per_chunk == 4);
  CHECK(p.u_floats == std::size_t(16 * 4 * 128 * 2048));
  // A large problem is cut into chunks of parts (the workspace stays near kChunkBytes).
  const own::WinogradPlan big = own::plan_winograd(geom_of({256, 512, 28, 28}, {512, 512, 3, 3}, params(1, 1, 1, 1)));
  CHECK(big.parts_per_chunk < big.parts);
  CHECK(big.workspace_bytes() < 2 * own::kChunkBytes);

  // The algorithm in float (its transforms, index maps, padding images and part folds) against the
  // double reference. With inputs that are small integers every step is exact in float (the transforms
  // add and halve; every partial sum is a multiple of 1/4 below 2^20), so the result must equal the
  // reference exactly: a wrong tap, tile, padding or part shows as a mismatch. With random floats the
  // rounding stays within a bound: each transformed product is a sum of at most 16 products of the
  // inputs' scale, added over at most `positions` terms, and At . A adds 9 sums:
  // |error| <= 64 * positions * 2^-24 * sum |x dy| per weight.
  const std::vector<OwnCase> cases = {
      {"pad 1, even sides, one part", {3, 4, 6, 6}, {5, 4, 3, 3}, params(1, 1, 1, 1)},
      {"pad 0, odd output (half tiles), two parts, the last with padding images", {200, 1, 9, 7}, {2, 1, 3, 3},
       params(1, 0, 1, 1)},
      {"pad 2: the output larger than the input", {2, 3, 5, 4}, {2, 3, 3, 3}, params(1, 2, 1, 1)},
  };
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const auto& c : cases) {
    INFO(c.name);
    const own::ConvGeom g = geom_of(c.x, c.w, c.p);
    REQUIRE(own::winograd_supports(g, &why));
    if (c.x[0] == 200) CHECK(own::plan_winograd(g).parts == 2);
    const ref::Conv2dGeom rg = ref::conv2d_geom(c.x, c.w, c.p);
    const Shape ys = conv2d_output_shape("t", c.x, c.w, c.p);
    const auto x = test::random_vec<float>(std::size_t(shape_numel(c.x)), seed);
    const auto dy = test::random_vec<float>(std::size_t(shape_numel(ys)), seed + 1);
    std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end()), want(std::size_t(shape_numel(c.w)));
    ref::conv2d_bwd_filter(rg, xd.data(), dyd.data(), want.data());
    std::vector<double> xa(xd.size()), dya(dyd.size()), bound(want.size());
    for (std::size_t i = 0; i < xd.size(); ++i) xa[i] = std::fabs(xd[i]);
    for (std::size_t i = 0; i < dyd.size(); ++i) dya[i] = std::fabs(dyd[i]);
    ref::conv2d_bwd_filter(rg, xa.data(), dya.data(), bound.data());
    std::vector<float> got(want.size());
    own::winograd_filter_cpu(g, x.data(), dy.data(), got.data());
    const double positions = double(own::plan_winograd(g).part_positions());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      bad += !(std::fabs(double(got[i]) - want[i]) <= 64 * positions * std::ldexp(1.0, -24) * bound[i]);
    CHECK(bad == 0);
    // Small integers: exact.
    std::vector<float> xi(x.size()), dyi(dy.size());
    for (std::size_t i = 0; i < x.size(); ++i) xi[i] = std::round(3 * x[i]);
    for (std::size_t i = 0; i < dy.size(); ++i) dyi[i] = std::round(3 * dy[i]);
    std::vector<double> xid(xi.begin(), xi.end()), dyid(dyi.begin(), dyi.end()), exact(want.size());
    ref::conv2d_bwd_filter(rg, xid.data(), dyid.data(), exact.data());
    own::winograd_filter_cpu(g, xi.data(), dyi.data(), got.data());
    CHECK(std::vector<double>(got.begin(), got.end()) == exact);
  }
}

TEST_CASE("ditto-winograd fwd and bwd_data: the problems, the plan, and F(2x2, 3x3) against the reference") {
  std::string why;
  CHECK(own::winograd_conv_supports(geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(1, 1, 1, 1)), &why));
  CHECK_FALSE(own::winograd_conv_supports(geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(2, 1, 1, 1)), &why));
  CHECK_THAT(why, Catch::Contains("stride 2x2"));
  CHECK_FALSE(own::winograd_conv_supports(geom_of({2, 8, 8, 8}, {8, 8, 3, 3}, params(1, 3, 1, 1)), &why));
  CHECK_THAT(why, Catch::Contains("padding of at most 2"));
  // bwd_data is the forward convolution of dY [N][K][Ho][Wo] by the turned filter, padding 2 - p, back to
  // x's size.
  const own::ConvGeom row = geom_of({128, 128, 16, 16}, {256, 128, 3, 3}, params(1, 0, 1, 1));
  const own::WinogradConv data = own::winograd_conv_of(row, true);
  CHECK((data.Ci == 256 && data.Co == 128 && data.H == 14 && data.Ho == 16 && data.ph == 2 && data.flip));
  CHECK(data.tap(5, 7, 0, 1) == (7 * 128 + 5) * 9 + 2 * 3 + 1);
  const own::WinogradConv fwd = own::winograd_conv_of(row, false);
  CHECK((fwd.Ci == 128 && fwd.Co == 256 && fwd.Ho == 14 && fwd.tiles() == 49 && !fwd.flip));
  CHECK(fwd.tap(5, 7, 0, 1) == (5 * 128 + 7) * 9 + 1);
  // ditto.torch's conv2d row fits one chunk; a large problem is cut into chunks of images whose
  // transformed input and products stay within kChunkBytes.
  const own::WinogradConvPlan p =
      own::plan_winograd_conv(own::winograd_conv_of(geom_of({128, 128, 16, 16}, {128, 128, 3, 3}, params(1, 1, 1, 1)), false));
  CHECK((p.images_per_chunk == 128 && p.chunks == 1));
  CHECK(p.v_floats == std::size_t(16 * 128 * 128 * 64));
  const own::WinogradConvPlan big =
      own::plan_winograd_conv(own::winograd_conv_of(geom_of({256, 256, 56, 56}, {256, 256, 3, 3}, params(1, 1, 1, 1)), true));
  CHECK(big.chunks > 1);
  CHECK((big.v_floats + big.m_floats) * sizeof(float) <= own::kChunkBytes);

  // winograd_conv_cpu (its transforms, tiles, padding and the turned filter) against the double reference.
  // Small integers: every step is exact in float (the filter transform halves, every partial sum is a
  // multiple of 1/4 far below 2^24), so the result must equal the reference exactly. Random floats: each
  // of the 16 products sums Ci terms whose factors are sums of at most 16 inputs' and 9 weights' sizes, and
  // At . A adds 9 of them: |error| <= 16 * (Ci + 16) * 2^-24 * sum over i of (sum |w[o][i]|) (sum of |in[i]|
  // over the tile's window).
  const std::vector<OwnCase> cases = {
      {"pad 1, even sides", {3, 4, 6, 6}, {5, 4, 3, 3}, params(1, 1, 1, 1)},
      {"pad 0, odd output (half tiles)", {2, 3, 9, 7}, {2, 3, 3, 3}, params(1, 0, 1, 1)},
      {"pad 2: the output larger than the input", {2, 3, 5, 4}, {2, 3, 3, 3}, params(1, 2, 1, 1)},
  };
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const auto& c : cases)
    for (bool bwd_data : {false, true}) {
      INFO(c.name << (bwd_data ? ", bwd_data" : ", fwd"));
      const own::ConvGeom g = geom_of(c.x, c.w, c.p);
      REQUIRE(own::winograd_conv_supports(g, &why));
      const own::WinogradConv wc = own::winograd_conv_of(g, bwd_data);
      const ref::Conv2dGeom rg = ref::conv2d_geom(c.x, c.w, c.p);
      const Shape ys = conv2d_output_shape("t", c.x, c.w, c.p);
      const Shape& in_shape = bwd_data ? ys : c.x;
      const Shape& out_shape = bwd_data ? c.x : ys;
      auto want_of = [&](const std::vector<double>& in, const std::vector<double>& w) {
        std::vector<double> out(std::size_t(shape_numel(out_shape)));
        if (bwd_data) ref::conv2d_bwd_data(rg, in.data(), w.data(), out.data());
        else ref::conv2d_fwd(rg, in.data(), w.data(), out.data());
        return out;
      };
      const auto in = test::random_vec<float>(std::size_t(shape_numel(in_shape)), seed + bwd_data);
      const auto w = test::random_vec<float>(std::size_t(shape_numel(c.w)), seed + 2);
      std::vector<float> got(std::size_t(shape_numel(out_shape)));
      own::winograd_conv_cpu(wc, in.data(), w.data(), got.data());
      const std::vector<double> want = want_of({in.begin(), in.end()}, {w.begin(), w.end()});
      std::size_t bad = 0;
      for (int64_t n = 0; n < wc.N; ++n)
        for (int64_t o = 0; o < wc.Co; ++o)
          for (int64_t h = 0; h < wc.Ho; ++h)
            for (int64_t x = 0; x < wc.Wo; ++x) {
              double bound = 0;
              for (int64_t i = 0; i < wc.Ci; ++i) {
                double wsum = 0, window = 0;
                for (int r = 0; r < 3; ++r)
                  for (int s = 0; s < 3; ++s) wsum += std::fabs(w[std::size_t(wc.tap(o, i, r, s))]);
                for (int a = 0; a < 4; ++a)
                  for (int b = 0; b < 4; ++b) {
                    const int64_t hh = h / 2 * 2 - wc.ph + a, xx = x / 2 * 2 - wc.pw + b;
                    if (hh >= 0 && hh < wc.H && xx >= 0 && xx < wc.W)
                      window += std::fabs(in[std::size_t(((n * wc.Ci + i) * wc.H + hh) * wc.W + xx)]);
                  }
                bound += wsum * window;
              }
              const std::size_t k = std::size_t(((n * wc.Co + o) * wc.Ho + h) * wc.Wo + x);
              bad += !(std::fabs(double(got[k]) - want[k]) <= 16 * double(wc.Ci + 16) * std::ldexp(1.0, -24) * bound);
            }
      CHECK(bad == 0);
      std::vector<float> ini(in.size()), wi(w.size());
      for (std::size_t i = 0; i < in.size(); ++i) ini[i] = std::round(3 * in[i]);
      for (std::size_t i = 0; i < w.size(); ++i) wi[i] = std::round(3 * w[i]);
      own::winograd_conv_cpu(wc, ini.data(), wi.data(), got.data());
      CHECK(std::vector<double>(got.begin(), got.end()) == want_of({ini.begin(), ini.end()}, {wi.begin(), wi.end()}));
    }
}

TEST_CASE("ditto's own conv variants are policy values and tuning-file algorithms") {
  Policy p = Policy::parse({"conv1.bwd_filter=ditto-gemm", "conv1.bwd_data=ditto-direct"});
  CHECK(conv_choice<ConvBwdFilterAlgo>(p, "conv1").algo == ConvBwdFilterAlgo::DittoGemm);
  CHECK(conv_choice<ConvBwdDataAlgo>(p, "conv1").algo == ConvBwdDataAlgo::DittoDirect);
  CHECK(std::string(name_of(ConvBwdFilterAlgo::DittoDirect)) == "ditto-direct");
  CHECK(conv_choice<ConvBwdFilterAlgo>(Policy::parse({"conv1.bwd_filter=ditto-winograd"}), "conv1").algo ==
        ConvBwdFilterAlgo::DittoWinograd);
  CHECK(conv_choice<ConvBwdDataAlgo>(Policy::parse({"conv1.bwd_data=ditto-winograd"}), "conv1").algo ==
        ConvBwdDataAlgo::DittoWinograd);
  CHECK(conv_choice<ConvFwdAlgo>(Policy::parse({"conv1.fwd=ditto-winograd"}), "conv1").algo ==
        ConvFwdAlgo::DittoWinograd);
  CHECK_THROWS_AS(Policy::parse({"conv1.fwd=ditto-gemm"}), PolicyError);  // the GEMM form is backward only
  // Not nondeterministic: the noise lab does not list them as candidates.
  for (const auto& k : knobs())
    for (const auto& v : k.nondeterministic()) CHECK(v.rfind("ditto-", 0) != 0);

  const std::string path = "cpu_conv2d_own_tuning.json";
  TuningTable t;
  t.gpu = "NVIDIA H100 80GB HBM3";
  t.cudnn = "9.14.0";
  TuningEntry e;
  e.direction = "bwd_filter";
  e.x = {128, 64, 56, 56};
  e.w = {256, 64, 1, 1};
  e.precision = "fp32";
  e.algo = "ditto-gemm";
  e.time_ms = 0.5;
  t.add(e);
  e.direction = "bwd_data";
  e.algo = "ditto-direct";
  e.w = {64, 1, 3, 3};
  e.groups = 64;
  t.add(e);
  t.save(path);
  TuningTable back = TuningTable::load(path);
  REQUIRE(back.entries().size() == 2);
  CHECK(back.entries()[0].algo == "ditto-gemm");
  CHECK(back.entries()[1].algo == "ditto-direct");
  CHECK(back.entries()[1].groups == 64);
}
