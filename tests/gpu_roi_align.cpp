// ROI align on the GPU: both backward variants against the CPU reference in double, on rois whose
// sample positions are exact in float (8x8 bins, 2 samples, coordinates on a 1/16 lattice: the
// tolerances cover only the sums) and on realistic ones (7x7 bins, adaptive sampling, random boxes:
// the tolerances add the float rounding of the positions); determinism over 10 runs at the
// detection size of the issue (512 rois crowded around a few objects on 8x256x64x64); bad rois as
// NaN; one DETERMINISM line per variant with the time of forward + backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "engine/context.h"
#include "kernels/roi_align.h"
#include "kernels/roi_align_ref.h"
#include "support.h"

using namespace ditto;

namespace {

constexpr double kU = 0x1p-24;
const RoiAlignBwd kVariants[] = {RoiAlignBwd::Atomic, RoiAlignBwd::Deterministic};

ref::RoiAlignDims dims(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, const RoiAlignParams& p) {
  ref::RoiAlignDims d;
  d.n = n, d.c = c, d.h = h, d.w = w, d.rois = k, d.ph = p.out_h, d.pw = p.out_w;
  d.spatial_scale = p.spatial_scale, d.sampling_ratio = p.sampling_ratio, d.aligned = p.aligned;
  return d;
}

// K rois with corners drawn from [lo, hi] in image coordinates, rounded to multiples of `quantum`
// (0: not rounded).
std::vector<float> random_rois(int64_t k, int64_t n, double lo_y, double hi_y, double lo_x, double hi_x,
                               double quantum, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> uy(lo_y, hi_y), ux(lo_x, hi_x);
  auto q = [&](double v) { return quantum > 0 ? std::round(v / quantum) * quantum : v; };
  std::vector<float> r;
  for (int64_t i = 0; i < k; ++i) {
    const double x1 = q(ux(g)), x2 = q(ux(g)), y1 = q(uy(g)), y2 = q(uy(g));
    r.insert(r.end(), {float(g() % uint64_t(n)), float(std::min(x1, x2)), float(std::min(y1, y2)),
                       float(std::max(x1, x2)), float(std::max(y1, y2))});
  }
  return r;
}

// Per dx element: the number of corner contributions it receives, the sum of |dy| / count * w over
// them (the scale of the summation error) and the sum of |dy| / count (the scale of the error that
// float sample positions bring: each weight moves by at most twice the position error).
struct Contributions {
  std::vector<double> count, abs_sum, abs_dy;
  double max_count = 1, max_g = 0;  // max_g: the largest |dy| / count
};

Contributions contributions(const std::vector<float>& rois, const std::vector<float>& dy, const ref::RoiAlignDims& d) {
  const int64_t plane = d.h * d.w, bins = d.ph * d.pw;
  Contributions c;
  c.count.assign(std::size_t(d.n * d.c * plane), 0.0);
  c.abs_sum = c.abs_dy = c.count;
  for (int64_t k = 0; k < d.rois; ++k) {
    const auto g = ref::roi_geometry<double>(rois.data() + k * 5, d);
    if (!g.ok) continue;
    for (int64_t ch = 0; ch < d.c; ++ch)
      for (int64_t py = 0; py < d.ph; ++py)
        for (int64_t px = 0; px < d.pw; ++px) {
          const double gy = std::fabs(double(dy[(k * d.c + ch) * bins + py * d.pw + px])) / g.count;
          c.max_g = std::max(c.max_g, gy);
          ref::roi_for_each_sample(g, py, px, d, [&](const ref::RoiBilinear<double>& b) {
            const int64_t at[4] = {b.y_low * d.w + b.x_low, b.y_low * d.w + b.x_high, b.y_high * d.w + b.x_low,
                                   b.y_high * d.w + b.x_high};
            for (int q = 0; q < 4; ++q) {
              const std::size_t i = std::size_t((g.batch * d.c + ch) * plane + at[q]);
              c.count[i] += 1;
              c.abs_sum[i] += gy * b.w[q];
              c.abs_dy[i] += gy;
              c.max_count = std::max(c.max_count, c.count[i]);
            }
          });
        }
  }
  return c;
}

void check_against_reference(Context& gpu, const ref::RoiAlignDims& d, const RoiAlignParams& p,
                             const std::vector<float>& rv, uint64_t seed, double position_error) {
  auto xv = test::random_vec(std::size_t(d.n * d.c * d.h * d.w), seed);
  auto dyv = test::random_vec(std::size_t(d.rois * d.c * d.ph * d.pw), seed + 1);
  std::vector<double> xd(xv.begin(), xv.end()), dyd(dyv.begin(), dyv.end()), rd(rv.begin(), rv.end());
  std::vector<double> y_ref(dyv.size()), dx_ref(xv.size());
  ref::roi_align_fwd(xd.data(), rd.data(), y_ref.data(), d);
  ref::roi_align_bwd(rd.data(), dyd.data(), dx_ref.data(), d);
  const Contributions con = contributions(rv, dyv, d);
  for (RoiAlignBwd v : kVariants) {
    INFO("variant " << name_of(v) << ", aligned " << p.aligned << ", sampling_ratio " << p.sampling_ratio);
    gpu.policy().pin("roi", v);
    Var x(gpu.from_host(xv, {d.n, d.c, d.h, d.w}), true);
    Var y = roi_align(gpu, "roi", x, gpu.from_host(rv, {d.rois, 5}), p);
    gpu.tape().backward(gpu, y, gpu.from_host(dyv, y.shape()));
    // Forward: per sample four products (one rounding each) and three adds, at most count samples
    // summed, then a division: relative (16 + count)u of sum |w x| <= count (|x| <= 1), divided
    // by count: <= 20u absolute for count <= 4 (exact case). Positions off by delta move each
    // sample by at most 2 * 2 * delta (|slope| <= 2 per axis).
    const double fwd_tol = 20 * kU + 4 * position_error;
    auto f = test::all_close(y.value().to_host_f32(), y_ref, fwd_tol, 0.0);
    INFO("y: " << f.str());
    CHECK(f.ok);
    // dx: k contributions (dy / count) * w, each rounded twice, summed in any order:
    // <= (k + 2) u sum|term|; float positions move each weight by <= 2 * delta. A sample within
    // delta of a pixel line may put its corners one pixel over (with weights <= delta there): a
    // floor of 4 * delta * max |dy| / count covers a pixel that gains or loses such a corner.
    auto got = x.grad().to_host_f32();
    double worst = 0;
    std::size_t worst_i = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double tol = (con.count[i] + 2) * kU * con.abs_sum[i] + 2 * position_error * con.abs_dy[i] +
                         4 * position_error * con.max_g + 1e-30;
      const double excess = std::fabs(got[i] - dx_ref[i]) / tol;
      if (!(excess <= worst)) worst = excess, worst_i = i;
    }
    INFO("dx worst at " << worst_i << ": got " << got[worst_i] << ", reference " << dx_ref[worst_i] << ", "
                        << con.count[worst_i] << " contributions; error / tolerance " << worst);
    CHECK(worst <= 1.0);
    const ManifestEntry* e = gpu.manifest().find("roi", "bwd");
    REQUIRE(e != nullptr);
    CHECK(e->variant == name_of(v));
    CHECK(e->guarantee == (v == RoiAlignBwd::Deterministic ? Guarantee::GpuToGpu : Guarantee::NotGuaranteed));
  }
}

}  // namespace

TEST_CASE("gpu roi align: both backward variants against the reference, exact sample positions") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  for (bool aligned : {false, true}) {
    // Scale 1/2 of corners on a 1/8 lattice, 8x8 bins, 2 samples per axis: every position is a
    // multiple of 1/512 below 64 and every weight a product of two 9-bit fractions: exact in float.
    const RoiAlignParams p{8, 8, 0.5f, 2, aligned};
    const auto d = dims(3, 6, 20, 28, 40, p);
    auto rv = random_rois(d.rois, d.n, -6, 2 * d.h + 6, -6, 2 * d.w + 6, 1.0 / 8, seed);
    check_against_reference(gpu, d, p, rv, seed + 7, 0.0);
  }
}

TEST_CASE("gpu roi align: both backward variants against the reference, 7x7 adaptive sampling") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  for (bool aligned : {false, true}) {
    const RoiAlignParams p{7, 7, 0.25f, -1, aligned};
    const auto d = dims(2, 5, 24, 30, 48, p);
    // Boxes inside [1, size - 2] in feature coordinates: no sample lies near the -1 / size cut-off,
    // where a rounding of the position could switch a sample off.
    auto rv = random_rois(d.rois, d.n, 4.0, 4.0 * (d.h - 2), 4.0, 4.0 * (d.w - 2), 0.0, seed);
    // Positions are sums of terms up to |coordinate| <= 32 with about 8 roundings: delta <= 8u * 32.
    check_against_reference(gpu, d, p, rv, seed + 7, 8 * kU * 32);
  }
}

TEST_CASE("gpu roi align: both backward variants against the reference, channels over a gather block's 32, "
          "20x20 bins read from global memory") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  for (bool aligned : {false, true}) {
    // 37 channels: a full chunk of 32 and a partial one; 20x40 pixels: partial 16x16 tiles; 20x20
    // bins: too many to stage dy in shared memory, so the gather reads it where it lies.
    const RoiAlignParams p{20, 20, 0.25f, -1, aligned};
    const auto d = dims(2, 37, 20, 40, 12, p);
    auto rv = random_rois(d.rois, d.n, 4.0, 4.0 * (d.h - 2), 4.0, 4.0 * (d.w - 2), 0.0, seed);
    // Coordinates up to 40: positions off by at most about 8 roundings of numbers below 64.
    check_against_reference(gpu, d, p, rv, seed + 7, 8 * kU * 64);
  }
}

TEST_CASE("gpu roi align: the deterministic gather refuses output sizes beyond its shared memory, by layer") {
  Context gpu(Device::cuda(0));
  gpu.policy().pin("roi", RoiAlignBwd::Deterministic);
  Var x(gpu.from_host(test::random_vec(2 * 8 * 8, 3), {1, 2, 8, 8}), true);
  Tensor rois = gpu.from_host(std::vector<float>{0, 1, 1, 6, 6}, {1, 5});
  CHECK_THROWS_WITH(roi_align(gpu, "roi", x, rois, RoiAlignParams{400, 400}),
                    Catch::Matchers::Contains("roi_align (layer 'roi')") &&
                        Catch::Matchers::Contains("out_h + out_w <= 760, not 400x400") &&
                        Catch::Matchers::Contains("bwd=atomic"));
  gpu.policy().pin("roi", RoiAlignBwd::Atomic);
  CHECK_NOTHROW(roi_align(gpu, "roi", x, rois, RoiAlignParams{400, 400}));
}

TEST_CASE("gpu roi align: determinism over 10 runs, 512 crowded rois on 8x256x64x64") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  const int64_t n = 8, c = 256, hw = 64, k = 512;
  const RoiAlignParams p{7, 7, 1.f / 16, -1, true};  // a stride-16 feature map of 1024x1024 images
  // Four objects per image; every roi is a jittered box around one of them (as proposals are).
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> centre(200, 824), size(120, 400), jitter(-40, 40);
  std::vector<double> objects;
  for (int64_t i = 0; i < n * 4; ++i) objects.insert(objects.end(), {centre(g), centre(g), size(g), size(g)});
  std::vector<float> rv;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t o = int64_t(g() % uint64_t(n * 4));
    const double cx = objects[o * 4] + jitter(g), cy = objects[o * 4 + 1] + jitter(g);
    const double w = objects[o * 4 + 2] + jitter(g), h = objects[o * 4 + 3] + jitter(g);
    rv.insert(rv.end(), {float(o / 4), float(cx - w / 2), float(cy - h / 2), float(cx + w / 2), float(cy + h / 2)});
  }
  Tensor rois = gpu.from_host(rv, {k, 5});
  Tensor x = gpu.from_host(test::random_vec(std::size_t(n * c * hw * hw), seed + 1), {n, c, hw, hw});
  Tensor dy = gpu.from_host(test::random_vec(std::size_t(k * c * 49), seed + 2), {k, c, 7, 7});
  for (RoiAlignBwd v : kVariants) {
    gpu.policy().pin("roi", v);
    auto step = [&] {
      Var xv(x, true);
      Var y = roi_align(gpu, "roi", xv, rois, p);
      gpu.tape().backward(gpu, y, gpu.to_device(dy));
      return xv.grad();
    };
    const std::size_t distinct = test::distinct_results(10, step);
    const std::size_t distinct_fwd = test::distinct_results(10, [&] { return roi_align(gpu, "roi", Var(x), rois, p).value(); });
    const double us = test::us_per_call(gpu, [&] { step(); });
    std::printf("DETERMINISM | roi_align | bwd=%s | %zu/10 | %.1f us\n", name_of(v), distinct, us);
    INFO("variant " << name_of(v) << ": " << distinct << " distinct dx of 10");
    CHECK(distinct_fwd == 1);
    if (v == RoiAlignBwd::Deterministic) CHECK(distinct == 1);
    if (v == RoiAlignBwd::Atomic) CHECK(distinct > 1);
  }
}

TEST_CASE("gpu roi align: a roi with a bad batch index or a NaN coordinate gives NaN, nothing else changes") {
  Context gpu(Device::cuda(0));
  const int64_t n = 2, c = 3, hw = 8;
  auto xv = test::random_vec(std::size_t(n * c * hw * hw), 11);
  std::vector<float> rv = {0, 1, 1, 6, 6,  //
                           5, 1, 1, 6, 6,  // batch index 5 of 2
                           1, NAN, 1, 6, 6};
  for (RoiAlignBwd v : kVariants) {
    INFO("variant " << name_of(v));
    gpu.policy().pin("roi", v);
    Var x(gpu.from_host(xv, {n, c, hw, hw}), true);
    Var y = roi_align(gpu, "roi", x, gpu.from_host(rv, {3, 5}), RoiAlignParams{2, 2});
    auto yv = y.value().to_host_f32();
    for (int64_t i = 0; i < c * 4; ++i) CHECK(std::isfinite(yv[i]));
    for (int64_t i = c * 4; i < 3 * c * 4; ++i) CHECK(std::isnan(yv[i]));
    gpu.tape().backward(gpu, y, gpu.full(y.shape(), 1.f));
    auto g = x.grad().to_host_f32();
    double image1 = 0;
    for (std::size_t i = g.size() / 2; i < g.size(); ++i) image1 += std::fabs(g[i]);
    CHECK(image1 == 0.0);  // only roi 0 (image 0) is valid
    for (float v2 : g) CHECK(std::isfinite(v2));
  }
}
