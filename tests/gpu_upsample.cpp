// Upsampling on the GPU: forward and both backward variants (atomic, gather) against the double
// reference for nearest and bilinear (align_corners both ways) at scale 2, non-integer scales and a
// downsampling; the gather bit-identical over 10 calls and the atomic scatter shown to differ; the
// manifest entries; and DETERMINISM lines with the time per backward call at the realistic
// size (2x of 128x64x64x64).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/upsample.h"
#include "kernels/upsample_ref.h"
#include "support.h"

using namespace ditto;

using test::us_per_call;

namespace {

const UpsampleBwd kVariants[] = {UpsampleBwd::Atomic, UpsampleBwd::Gather};

struct Geometry {
  int64_t h, w, oh, ow;
};

ref::UpsampleDims dims_of(int64_t planes, const Geometry& g, const UpsampleParams& p) {
  ref::UpsampleDims d;
  d.planes = planes, d.h = g.h, d.w = g.w, d.oh = g.oh, d.ow = g.ow;
  d.bilinear = p.mode == UpsampleMode::Bilinear;
  d.align_corners = p.align_corners;
  return d;
}

// How many contributions each input receives (4 taps per bilinear output, 1 per nearest one).
std::vector<double> tap_counts(const ref::UpsampleDims& d) {
  std::vector<double> n(std::size_t(d.h * d.w), 0.0);
  for (int64_t oh = 0; oh < d.oh; ++oh)
    for (int64_t ow = 0; ow < d.ow; ++ow) {
      if (!d.bilinear) {
        n[std::size_t(ref::nearest_src(oh, d.h, d.oh) * d.w + ref::nearest_src(ow, d.w, d.ow))] += 1;
        continue;
      }
      const auto th = ref::linear_tap<double>(oh, d.h, d.oh, d.align_corners);
      const auto tw = ref::linear_tap<double>(ow, d.w, d.ow, d.align_corners);
      for (int64_t r : {th.i0, th.i1})
        for (int64_t c : {tw.i0, tw.i1}) n[std::size_t(r * d.w + c)] += 1;
    }
  return n;
}

}  // namespace

TEST_CASE("gpu upsample: forward and both backward variants against the double reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const int64_t n = 2, c = 3;
  const Geometry geometries[] = {{16, 16, 32, 32}, {10, 14, 15, 21}, {7, 9, 12, 20}, {17, 13, 8, 6}, {1, 5, 4, 11}};
  for (const Geometry& g : geometries)
    for (int mode = 0; mode < 3; ++mode) {
      UpsampleParams p;
      p.mode = mode ? UpsampleMode::Bilinear : UpsampleMode::Nearest;
      p.align_corners = mode == 2;
      p.out_h = g.oh;
      p.out_w = g.ow;
      const ref::UpsampleDims d = dims_of(n * c, g, p);
      INFO(g.h << "x" << g.w << " -> " << g.oh << "x" << g.ow << " " << upsample_mode_name(p.mode)
                << (p.align_corners ? " align_corners" : ""));
      auto xv = test::random_vec(std::size_t(n * c * g.h * g.w), seed);
      auto dyv = test::random_vec(std::size_t(n * c * g.oh * g.ow), seed + 1);
      std::vector<double> xd(xv.begin(), xv.end()), dyd(dyv.begin(), dyv.end()), dya(dyv.size());
      for (std::size_t i = 0; i < dyd.size(); ++i) dya[i] = std::fabs(dyd[i]);
      std::vector<double> y_ref(dyv.size()), dx_ref(xv.size()), dx_abs(xv.size());
      ref::upsample_fwd(xd.data(), y_ref.data(), d);
      ref::upsample_bwd(dyd.data(), dx_ref.data(), d);
      ref::upsample_bwd(dya.data(), dx_abs.data(), d);
      const auto counts = tap_counts(d);
      // The GPU computes taps in float: scale = in/out and src = scale * (o + 0.5) - 0.5 are off by
      // at most about 2^-22 * in, so each weight (and, when src lies that close to an integer, the
      // row it is given to) is off by at most 2^-22 * max(h, w). Forward: four weighted terms of
      // |x| <= 1 and about eight roundings.
      const double tap_err = std::ldexp(1.0, -22) * double(std::max(g.h, g.w));
      const double fwd_tol = mode ? 4 * tap_err + 8 * std::ldexp(1.0, -24) : 0.0;
      for (UpsampleBwd v : kVariants) {
        INFO("bwd=" << name_of(v));
        gpu.policy().pin("up", v);
        Var x(gpu.from_host(xv, {n, c, g.h, g.w}), true);
        Var y = upsample2d(gpu, "up", x, p);
        auto f = test::all_close(y.value().to_host_f32(), y_ref, fwd_tol, 0.0);
        INFO(f.str());
        CHECK(f.ok);
        gpu.tape().backward(gpu, y, gpu.from_host(dyv, y.shape()));
        // Backward: input i adds k_i products (wy * wx) * dy, each rounded twice, in some order:
        // (k_i + 2) * 2^-24 * sum |terms|, plus the taps' error, 2 * tap_err * |dy| per term, and up
        // to 4 terms of weight <= tap_err that float taps give an input the double ones do not (when
        // src lies within tap_err of an integer).
        auto got = x.grad().to_host_f32();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const double k = counts[i % counts.size()];
          const double tol = (k + 2) * std::ldexp(1.0, -24) * dx_abs[i] + (mode ? 2 * (k + 4) * tap_err : 0.0);
          bad += !(std::fabs(double(got[i]) - dx_ref[i]) <= tol);
        }
        CHECK(bad == 0);
        const ManifestEntry* e = gpu.manifest().find("up", "bwd");
        REQUIRE(e != nullptr);
        CHECK(e->op == "upsample");
        CHECK(e->variant == name_of(v));
        CHECK(e->requested == "pinned");
        CHECK(e->deterministic == (v == UpsampleBwd::Gather ? Determinism::Yes : Determinism::No));
        CHECK(e->guarantee == (v == UpsampleBwd::Gather ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
      }
    }
}

TEST_CASE("gpu upsample: nearest's forward and gather are the host's bit for bit, whole scales and others") {
  // Whole scale factors take their own kernels (no divisions); the forward must copy what
  // ref::upsample_fwd_at reads, the gather add the same values in the same order as
  // ref::upsample_gather_at, which the other shapes' kernels run.
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0), Policy::parse({"up.bwd=gather"}));
  const Geometry geometries[] = {{16, 16, 32, 32}, {16, 16, 32, 48}, {5, 300, 15, 600}, {7, 9, 7, 9}, {3, 1, 12, 4},
                                 {10, 14, 15, 21}, {64, 33, 128, 99}};
  for (const Geometry& g : geometries) {
    INFO(g.h << "x" << g.w << " -> " << g.oh << "x" << g.ow);
    UpsampleParams p;
    p.mode = UpsampleMode::Nearest;
    p.out_h = g.oh;
    p.out_w = g.ow;
    const int64_t planes = 6;
    const ref::UpsampleDims d = dims_of(planes, g, p);
    auto dyv = test::random_vec(std::size_t(planes * g.oh * g.ow), seed);
    std::vector<float> want(std::size_t(planes * g.h * g.w));
    const ref::HostTapTables none;
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t ih = 0; ih < g.h; ++ih)
        for (int64_t iw = 0; iw < g.w; ++iw)
          want[std::size_t((pl * g.h + ih) * g.w + iw)] =
              ref::upsample_gather_at<float>(dyv.data() + pl * g.oh * g.ow, ih, iw, d, none.view());
    auto xv = test::random_vec(std::size_t(planes * g.h * g.w), seed + 1);
    std::vector<float> want_y(dyv.size());
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oh = 0; oh < g.oh; ++oh)
        for (int64_t ow = 0; ow < g.ow; ++ow)
          want_y[std::size_t((pl * g.oh + oh) * g.ow + ow)] = ref::upsample_fwd_at<float>(xv.data() + pl * g.h * g.w, oh, ow, d);
    Var x(gpu.from_host(xv, {2, 3, g.h, g.w}), true);
    Var y = upsample2d(gpu, "up", x, p);
    CHECK(y.value().to_host_f32() == want_y);
    gpu.tape().backward(gpu, y, gpu.from_host(dyv, y.shape()));
    CHECK(x.grad().to_host_f32() == want);
  }
}

TEST_CASE("gpu upsample: the gather is bit-identical over 10 calls, the atomic scatter is not; DETERMINISM lines") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  struct Setting {
    UpsampleMode mode;
    bool align;
    const char* name;
  };
  const Setting settings[] = {{UpsampleMode::Nearest, false, "nearest"},
                              {UpsampleMode::Bilinear, false, "bilinear"},
                              {UpsampleMode::Bilinear, true, "bilinear-align"}};
  // Random dy (not ones) so that the order of the float adds shows in the bits.
  {
    Context gpu(Device::cuda(0));
    const Shape xs = {32, 64, 64, 64};
    for (const Setting& s : settings)
      for (const Geometry& g : {Geometry{64, 64, 128, 128}, Geometry{64, 64, 96, 96}}) {
        UpsampleParams p;
        p.mode = s.mode;
        p.align_corners = s.align;
        p.out_h = g.oh;
        p.out_w = g.ow;
        Tensor dy = gpu.from_host(test::random_vec(std::size_t(32 * 64 * g.oh * g.ow), seed), {32, 64, g.oh, g.ow});
        Tensor x = gpu.from_host(test::random_vec(std::size_t(shape_numel(xs)), seed + 1), xs);
        CHECK(test::distinct_results(10, [&] { return upsample2d(gpu, "up", Var(x), p).value(); }) == 1);
        for (UpsampleBwd v : kVariants) {
          gpu.policy().pin("up", v);
          std::size_t distinct = test::distinct_results(10, [&] { return upsample2d_backward(gpu, "up", dy, xs, p); });
          INFO(s.name << " 64 -> " << g.oh << " bwd=" << name_of(v) << ": " << distinct << " distinct dx of 10");
          std::printf("DETERMINISM | upsample %s 32x64x64x64 -> %lldx%lld | bwd=%s | %zu/10\n", s.name,
                      (long long)g.oh, (long long)g.ow, name_of(v), distinct);
          if (v == UpsampleBwd::Gather)
            CHECK(distinct == 1);
          else
            CHECK(distinct > 1);  // every input takes several outputs' adds, from several warps
        }
      }
  }
  // Time per backward call at the size: 2x of 128x64x64x64 (dy is 128x64x128x128).
  {
    Context gpu(Device::cuda(0));
    const Shape xs = {128, 64, 64, 64};
    Tensor dy = gpu.from_host(test::random_vec(std::size_t(128) * 64 * 128 * 128, seed + 2), {128, 64, 128, 128});
    for (const Setting& s : settings) {
      UpsampleParams p;
      p.mode = s.mode;
      p.align_corners = s.align;
      p.out_h = p.out_w = 128;
      double us[2] = {0, 0};
      for (UpsampleBwd v : kVariants) {
        gpu.policy().pin("up", v);
        us[int(v)] = us_per_call(gpu, [&] { upsample2d_backward(gpu, "up", dy, xs, p); });
        std::printf("DETERMINISM | upsample %s bwd 128x64x64x64 x2 | bwd=%s | %.1f us\n", s.name, name_of(v), us[int(v)]);
      }
      std::printf("COST | upsample %s bwd 128x64x64x64 x2 | gather / atomic = %.2f (goal <= 1.2)\n", s.name,
                  us[1] / us[0]);
    }
  }
}

TEST_CASE("gpu upsample: the policy's mode words pick the documented variants") {
  Context gpu(Device::cuda(0));
  Var x(gpu.from_host(test::random_vec(2 * 3 * 8 * 8, 11), {2, 3, 8, 8}), true);
  UpsampleParams p;
  p.mode = UpsampleMode::Bilinear;
  p.out_h = p.out_w = 16;
  upsample2d(gpu, "up", x, p);
  CHECK(gpu.manifest().find("up", "bwd")->variant == "atomic");
  CHECK(gpu.manifest().find("up", "bwd")->requested == "heuristic");
  gpu.policy().set("*=deterministic");
  upsample2d(gpu, "up", x, p);
  CHECK(gpu.manifest().find("up", "bwd")->variant == "gather");
  CHECK(gpu.manifest().find("up", "bwd")->requested == "deterministic");
  gpu.policy().set("up.bwd=nondeterministic");
  upsample2d(gpu, "up", x, p);
  CHECK(gpu.manifest().find("up", "bwd")->variant == "atomic");
}
