// conv2d on the GPU: every cuDNN algorithm of every direction against the CPU reference,
// the selection modes, determinism (bit-equal repeats of deterministic algorithms, visible
// variation of the atomics ones), grouped and depthwise convolutions (every algorithm, every
// mode, the tuning key, a depthwise layer through the tape), unsupported pins, TF32, and the
// DETERMINISM table.
//
// Tolerances. For output element i let A_i = sum of |a||b| over the products that make it (the
// reference run on |x|, |w| (fwd), |dy|, |w| (bwd_data) or |x|, |dy| (bwd_filter)), L the
// number of products per element (fwd C/groups*R*S, bwd_data at most K/groups*R*S, bwd_filter
// N*Ho*Wo), u = 2^-24 and S = max_i A_i. Then:
//  * Direct-class algorithms (implicit/precomp gemm, gemm, direct, bwd algo0/algo1/algo3) in
//    FMA math: the result is a float32 sum of float32 products in SOME order (tiles, split-K,
//    atomics): whatever the order, |got - ref| <= gamma_{L+1} * A_i with gamma_n = n u/(1 - n u)
//    (Higham, Accuracy and Stability, 3.1). A rigorous bound, not a fudge factor; it is still
//    small next to one product (about A_i / L), so a dropped, doubled or misplaced tap shows.
//  * Transform algorithms (fft, fft_tiling, winograd, winograd_nonfused) are not sums of the
//    products: they transform tiles of x and w, multiply pointwise and transform back. Rounding
//    happens on transformed values, whose size is set by the whole tile (FFT error bounds are
//    ~ u log2(n) ||x_tile|| ||w||; Winograd's transform matrices have entries up to ~8 that
//    amplify input rounding), so the error of an element is not proportional to its own A_i:
//    an output near zero from cancelling large terms gets the same absolute error as its
//    neighbours. They get gamma_{L+1} * A_i + 2^-12 * S: 4096 u of the output's scale (2.4e-4
//    relative), room for log2(tile) ~ 10 times a transform amplification of up to ~25, and
//    still below the average single product (S/L >= S/1024 on these shapes).
//  * TF32 math: tensor cores read each operand with a 10-bit mantissa; truncation (the worst
//    case) errs by up to 2^-10 per operand, so a product by up to 2^-9 (plus 2^-20): every
//    algorithm gets (2^-9 * 1.01 + gamma_{L+1}) * A_i, and transform algorithms additionally
//    2^-7 * S (8 x 2^-10 for the transform amplification of the rounded transformed operands).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/conv2d.h"
#include "engine/tuning.h"
#include "kernels/conv2d_ref.h"
#include "kernels/detail/conv2d_own.h"
#include "nets/module.h"
#include "support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

enum class Dir { Fwd, BwdData, BwdFilter };
const Dir kDirs[] = {Dir::Fwd, Dir::BwdData, Dir::BwdFilter};
std::string knob(Dir d) { return d == Dir::Fwd ? "fwd" : d == Dir::BwdData ? "bwd_data" : "bwd_filter"; }

struct Case {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

Conv2dParams make(int stride, int pad, int dilation, int groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"3x3 pad 1", {4, 8, 16, 16}, {16, 8, 3, 3}, make(1, 1, 1, 1)},
      {"3x3 stride 2 pad 1", {4, 8, 16, 16}, {16, 8, 3, 3}, make(2, 1, 1, 1)},
      {"1x1", {4, 8, 16, 16}, {16, 8, 1, 1}, make(1, 0, 1, 1)},
      {"3x3 groups 2 pad 1", {4, 8, 16, 16}, {16, 4, 3, 3}, make(1, 1, 1, 2)},
      {"3x3 dilation 2 pad 2", {4, 8, 16, 16}, {16, 8, 3, 3}, make(1, 2, 2, 1)},
      {"3x3 depthwise (groups = C = 8) pad 1", {4, 8, 16, 16}, {8, 1, 3, 3}, make(1, 1, 1, 8)},
      {"3x3 depthwise x2 (groups = 8, K = 16) stride 2 pad 1", {4, 8, 16, 16}, {16, 1, 3, 3}, make(2, 1, 1, 8)},
  };
  return c;
}

// The grouped (groups > 1) entries of cases().
std::vector<Case> grouped_cases() {
  std::vector<Case> out;
  for (const auto& c : cases())
    if (c.p.groups > 1) out.push_back(c);
  return out;
}

std::vector<double> absd(const std::vector<float>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(double(v[i]));
  return out;
}

// One problem: random inputs on the device, the double reference of each direction and the
// per-element sums of |products| (A_i above).
struct Problem {
  Case c;
  ref::Conv2dGeom g;
  Shape ys;
  Tensor x, w, dy;
  std::vector<double> want[3], abs_sum[3];

  Problem(Context& ctx, const Case& cs, uint64_t seed, bool with_reference = true)
      : c(cs), g(ref::conv2d_geom(cs.x, cs.w, cs.p)) {
    ys = conv2d_output_shape("ref", c.x, c.w, c.p);
    auto xf = test::random_vec(static_cast<std::size_t>(shape_numel(c.x)), seed);
    auto wf = test::random_vec(static_cast<std::size_t>(shape_numel(c.w)), seed + 1);
    auto dyf = test::random_vec(static_cast<std::size_t>(shape_numel(ys)), seed + 2);
    x = ctx.from_host(xf, c.x);
    w = ctx.from_host(wf, c.w);
    dy = ctx.from_host(dyf, ys);
    if (!with_reference) return;
    auto xd = test::to_double(xf), wd = test::to_double(wf), dyd = test::to_double(dyf);
    auto xa = absd(xf), wa = absd(wf), dya = absd(dyf);
    const std::size_t ny = dyd.size();
    want[0].resize(ny), abs_sum[0].resize(ny);
    want[1].resize(xd.size()), abs_sum[1].resize(xd.size());
    want[2].resize(wd.size()), abs_sum[2].resize(wd.size());
    ref::conv2d_fwd(g, xd.data(), wd.data(), want[0].data());
    ref::conv2d_fwd(g, xa.data(), wa.data(), abs_sum[0].data());
    ref::conv2d_bwd_data(g, dyd.data(), wd.data(), want[1].data());
    ref::conv2d_bwd_data(g, dya.data(), wa.data(), abs_sum[1].data());
    ref::conv2d_bwd_filter(g, xd.data(), dyd.data(), want[2].data());
    ref::conv2d_bwd_filter(g, xa.data(), dya.data(), abs_sum[2].data());
  }

  int64_t products_per_element(Dir d) const {
    if (d == Dir::Fwd) return g.Cg() * g.R * g.S;
    if (d == Dir::BwdData) return g.Kg() * g.R * g.S;
    return g.N * g.Ho * g.Wo;
  }
};

Tensor run(Context& ctx, const std::string& layer, Dir d, const Problem& pr) {
  switch (d) {
    case Dir::Fwd: return conv2d_forward(ctx, layer, pr.x, pr.w, pr.c.p);
    case Dir::BwdData: return conv2d_backward_data(ctx, layer, pr.dy, pr.w, pr.c.x, pr.c.p);
    case Dir::BwdFilter: return conv2d_backward_filter(ctx, layer, pr.x, pr.dy, pr.c.w, pr.c.p);
  }
  return {};
}

bool is_transform(const std::string& algo) {
  return algo.find("fft") != std::string::npos || algo.find("winograd") != std::string::npos;
}

// The bound of the header comment; returns "" when every element is within it.
std::string compare(const std::vector<float>& got, const Problem& pr, Dir d, const std::string& algo, Precision math) {
  const auto& want = pr.want[int(d)];
  const auto& a = pr.abs_sum[int(d)];
  if (got.size() != want.size()) return "size mismatch";
  const double u = std::ldexp(1.0, -24);
  const double n = double(pr.products_per_element(d) + 1);
  const double gamma = n * u / (1 - n * u);
  double scale = 0;
  for (double v : a) scale = std::max(scale, v);
  const bool tf32 = math == Precision::Tf32;
  const double per_elem = gamma + (tf32 ? 1.01 * std::ldexp(1.0, -9) : 0.0);
  const double global = is_transform(algo) ? (tf32 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -12)) * scale : 0.0;
  double worst = 0;
  std::size_t wi = 0;
  bool ok = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]), tol = per_elem * a[i] + global;
    if (!(err <= tol)) {  // NaN fails
      if (ok || err / tol > worst) worst = err / tol, wi = i;
      ok = false;
    }
  }
  if (ok) return "";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "element %zu: got %.9g, reference %.9g, error %.3g = %.3g x tolerance %.3g (A_i %.3g)",
                wi, double(got[wi]), want[wi], std::fabs(double(got[wi]) - want[wi]), worst,
                per_elem * a[wi] + global, a[wi]);
  return buf;
}

Policy pin_policy(const std::string& layer, Dir d, const std::string& value, Precision math = Precision::Fp32) {
  return Policy::parse({layer + "." + knob(d) + "=" + value, layer + ".precision=" + name_of(math)});
}

double micros_per_call(Context& ctx, const std::function<Tensor()>& fn) {
  const int calls = 20;
  ctx.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  ctx.synchronize();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

}  // namespace

TEST_CASE("conv2d GPU: every supported algorithm of every direction matches the reference (fma)") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0));
  for (const auto& c : cases()) {
    INFO("case " << c.name);
    Problem pr(ctx, c, seed);
    for (Dir d : kDirs) {
      auto algos = conv_algos(ctx, knob(d), c.x, c.w, c.p, Precision::Fp32);
      std::string names;
      for (const auto& i : algos) names += i.name + " ";
      std::printf("conv2d %s %s supported (fma): %s\n", c.name, knob(d).c_str(), names.c_str());
      REQUIRE(!algos.empty());
      for (const auto& info : algos) {
        INFO(knob(d) << "=" << info.name);
        ctx.policy() = pin_policy("c", d, info.name);
        Tensor out = run(ctx, "c", d, pr);
        std::string bad = compare(out.to_host_f32(), pr, d, info.name, Precision::Fp32);
        CHECK(bad == "");
        const ManifestEntry* e = ctx.manifest().find("c", knob(d));
        REQUIRE(e != nullptr);
        CHECK(e->op == "conv2d");
        CHECK(e->variant == info.name);
        CHECK(e->requested == "pinned");
        CHECK(e->precision == "fp32");
        CHECK(e->deterministic == info.deterministic);
        CHECK(e->workspace_bytes == info.workspace_bytes);
        CHECK(e->device == "cuda:0");
        if (info.deterministic == Determinism::Unknown)
          WARN("cuDNN reported no determinism label for " << knob(d) << "=" << info.name);
        if (info.deterministic == Determinism::Yes)
          CHECK(test::distinct_results(10, [&] { return run(ctx, "c", d, pr); }) == 1);
      }
    }
  }
}

TEST_CASE("conv2d GPU: TF32 math, every supported algorithm on one shape, looser stated tolerance") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0));
  Problem pr(ctx, cases()[0], seed);
  for (Dir d : kDirs) {
    auto algos = conv_algos(ctx, knob(d), pr.c.x, pr.c.w, pr.c.p, Precision::Tf32);
    REQUIRE(!algos.empty());
    for (const auto& info : algos) {
      INFO(knob(d) << "=" << info.name << " tf32");
      ctx.policy() = pin_policy("t", d, info.name, Precision::Tf32);
      Tensor out = run(ctx, "t", d, pr);
      CHECK(compare(out.to_host_f32(), pr, d, info.name, Precision::Tf32) == "");
      const ManifestEntry* e = ctx.manifest().find("t", knob(d));
      REQUIRE(e != nullptr);
      CHECK(e->precision == "tf32");
      CHECK(e->variant == info.name);
    }
  }
}

TEST_CASE("conv2d GPU: selection modes resolve as documented and are recorded") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0));
  for (const Case& c : {cases()[0], cases()[1]}) {
    INFO("case " << c.name);
    Problem pr(ctx, c, seed);
    for (Dir d : kDirs) {
      INFO(knob(d));
      std::string heuristic_variant;
      for (const char* mode : {"heuristic", "fastest", "deterministic", "nondeterministic"}) {
        INFO("mode " << mode);
        ctx.policy() = pin_policy("m", d, mode);
        Tensor out = run(ctx, "m", d, pr);
        const ManifestEntry* e = ctx.manifest().find("m", knob(d));
        REQUIRE(e != nullptr);
        CHECK(e->requested == mode);
        CHECK(compare(out.to_host_f32(), pr, d, e->variant, Precision::Fp32) == "");
        auto supported = conv_supported_algos(ctx, knob(d), c.x, c.w, c.p);
        CHECK(std::find(supported.begin(), supported.end(), e->variant) != supported.end());
        std::printf("conv2d %s %s=%s -> %s (deterministic: %s, workspace %zu bytes)\n", c.name, knob(d).c_str(), mode,
                    e->variant.c_str(), determinism_name(e->deterministic), e->workspace_bytes);
        if (std::string(mode) == "heuristic") heuristic_variant = e->variant;
        if (std::string(mode) == "deterministic") {
          CHECK(e->deterministic == Determinism::Yes);
          CHECK(test::distinct_results(10, [&] { return run(ctx, "m", d, pr); }) == 1);
        }
        if (std::string(mode) == "nondeterministic") {
          if (d == Dir::Fwd)
            CHECK(e->variant == heuristic_variant);  // no atomics algorithm forward: resolves like heuristic
          else
            CHECK(e->variant == "algo0");
        }
      }
    }
  }
  CHECK(ctx.op_state("conv2d") != nullptr);  // selections are cached per context
}

TEST_CASE("conv2d GPU: grouped and depthwise through every selection mode; deterministic runs bit-equal") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  for (const Case& c : grouped_cases()) {
    INFO("case " << c.name);
    for (Dir d : kDirs) {
      INFO(knob(d));
      for (const char* mode : {"heuristic", "fastest", "deterministic", "nondeterministic"}) {
        INFO("mode " << mode);
        Context ctx(Device::cuda(0), pin_policy("g", d, mode));
        Problem pr(ctx, c, seed);
        Tensor out = run(ctx, "g", d, pr);
        const ManifestEntry* e = ctx.manifest().find("g", knob(d));
        REQUIRE(e != nullptr);
        CHECK(e->requested == mode);
        CHECK(compare(out.to_host_f32(), pr, d, e->variant, Precision::Fp32) == "");
        std::printf("conv2d %s %s=%s -> %s (deterministic: %s, workspace %zu bytes)\n", c.name, knob(d).c_str(), mode,
                    e->variant.c_str(), determinism_name(e->deterministic), e->workspace_bytes);
        if (std::string(mode) == "nondeterministic" && d != Dir::Fwd) CHECK(e->variant == "algo0");
        if (std::string(mode) != "deterministic") continue;
        CHECK(e->deterministic == Determinism::Yes);
        const Fingerprint first = out.fingerprint();
        CHECK(test::distinct_results(10, [&] { return run(ctx, "g", d, pr); }) == 1);
        CHECK(run(ctx, "g", d, pr).fingerprint() == first);
        // A second run in a fresh context (fresh selection cache and cuDNN handle) picks the
        // same algorithm from the heuristic ranking and gives the same bits.
        Context again(Device::cuda(0), pin_policy("g", d, mode));
        Problem pr2(again, c, seed, /*with_reference=*/false);
        CHECK(run(again, "g", d, pr2).fingerprint() == first);
        CHECK(again.manifest().find("g", knob(d))->variant == e->variant);
      }
    }
  }
}

TEST_CASE("conv2d GPU: a tuning table records the real group count") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  auto table = std::make_shared<TuningTable>();
  Context ctx(Device::cuda(0), Policy::parse({"*=deterministic"}));
  ctx.set_tuning(table);
  for (const Case& c : grouped_cases()) {
    INFO("case " << c.name);
    Problem pr(ctx, c, seed);
    for (Dir d : kDirs) {
      INFO(knob(d));
      Tensor out = run(ctx, "t", d, pr);
      CHECK(compare(out.to_host_f32(), pr, d, ctx.manifest().find("t", knob(d))->variant, Precision::Fp32) == "");
      CHECK(test::distinct_results(5, [&] { return run(ctx, "t", d, pr); }) == 1);
      bool found = false;
      for (const auto& e : table->entries())
        if (e.direction == knob(d) && e.w == c.w && e.x == c.x) {
          found = true;
          CHECK(e.groups == c.p.groups);
        }
      CHECK(found);
    }
  }
}

TEST_CASE("conv2d GPU: a depthwise Conv2d layer's forward and tape gradients match the reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  // The layer runs conv2d, then bias_add; its conv part is checked here, the bias op has its own tests.
  const Case& c = cases()[5];  // depthwise, groups = C = 8
  REQUIRE(c.p.groups == 8);
  for (const char* mode : {"heuristic", "deterministic"}) {
    INFO("mode " << mode);
    Context ctx(Device::cuda(0), Policy::parse({std::string("*=") + mode}));
    Problem pr(ctx, c, seed);
    Conv2d layer(ctx, "dw", int(c.x[1]), int(c.w[0]), int(c.w[2]), c.p.stride_h, c.p.pad_h, false, Init::HeNormal,
                 c.p.groups);
    REQUIRE(layer.weight.value().shape() == c.w);
    layer.weight = Var(pr.w, true);
    Var x(pr.x, true);
    Var y = layer(ctx, x);
    REQUIRE(y.shape() == pr.ys);
    CHECK(compare(y.value().to_host_f32(), pr, Dir::Fwd, ctx.manifest().find("dw", "fwd")->variant, Precision::Fp32) == "");
    ctx.tape().backward(ctx, y, pr.dy);
    CHECK(compare(x.grad().to_host_f32(), pr, Dir::BwdData, ctx.manifest().find("dw", "bwd_data")->variant,
                  Precision::Fp32) == "");
    CHECK(compare(layer.weight.grad().to_host_f32(), pr, Dir::BwdFilter, ctx.manifest().find("dw", "bwd_filter")->variant,
                  Precision::Fp32) == "");
  }
}

TEST_CASE("conv2d GPU: ditto-gemm, ditto-direct and ditto-winograd match the reference, repeat bit for bit, record "
          "their guarantee") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Conv2dParams one_by_seven = make(1, 0, 1, 1);
  one_by_seven.pad_w = 3;
  Conv2dParams three_by_five = make(1, 1, 1, 4);
  three_by_five.pad_w = 2;
  // Shapes that walk ditto-gemm's plans (kernels/detail/conv2d_own.h): items of several images
  // with a remainder item, a pointwise convolution read in place, strides, groups, a non-square
  // kernel, dilation, and a problem whose im2col needs two chunks; and ditto-direct's depthwise
  // kernels with 3x3, 5x5, 7x7 (compile-time taps) and 3x5 (run-time taps).
  const std::vector<Case> own_cases = {
      {"N=7 8x8 3x3 pad 1: 4-image items and a 3-image remainder", {7, 8, 8, 8}, {16, 8, 3, 3}, make(1, 1, 1, 1)},
      {"1x1 on 48x48: in place", {2, 16, 48, 48}, {24, 16, 1, 1}, make(1, 0, 1, 1)},
      {"1x1 stride 2", {6, 16, 12, 12}, {8, 16, 1, 1}, make(2, 0, 1, 1)},
      {"3x3 groups 4 stride 2 pad 1, N=5", {5, 16, 10, 10}, {8, 4, 3, 3}, make(2, 1, 1, 4)},
      {"1x7 pad (0, 3)", {3, 8, 9, 11}, {8, 8, 1, 7}, one_by_seven},
      {"5x5 dilation 2 pad 4", {2, 4, 13, 13}, {6, 4, 5, 5}, make(1, 4, 2, 1)},
      {"32 images 64x64 3x3: two chunks", {32, 64, 64, 64}, {8, 64, 3, 3}, make(1, 1, 1, 1)},
      {"7x7 stride 2 pad 3 on 3 channels (a stem), K=80: two k tiles", {6, 3, 40, 40}, {80, 3, 7, 7}, make(2, 3, 1, 1)},
      {"5x5 depthwise stride 2 pad 2", {3, 12, 15, 15}, {12, 1, 5, 5}, make(2, 2, 1, 12)},
      {"3x3 depthwise x2 dilation 2 pad 2", {2, 6, 11, 11}, {12, 1, 3, 3}, make(1, 2, 2, 6)},
      {"7x7 depthwise pad 3", {2, 4, 20, 20}, {4, 1, 7, 7}, make(1, 3, 1, 4)},
      {"3x5 depthwise pad (1, 2)", {2, 4, 9, 9}, {4, 1, 3, 5}, three_by_five},
  };
  int ran = 0;
  for (const Case& c : own_cases) {
    INFO("case " << c.name);
    Context ctx(Device::cuda(0));
    Problem pr(ctx, c, seed);
    for (Dir d : {Dir::Fwd, Dir::BwdData, Dir::BwdFilter}) {
      auto supported = conv_supported_algos(ctx, knob(d), c.x, c.w, c.p);
      for (const char* algo : {"ditto-gemm", "ditto-direct", "ditto-winograd"}) {
        if (std::find(supported.begin(), supported.end(), algo) == supported.end()) continue;
        if (d == Dir::Fwd && std::string(algo) == "ditto-direct") continue;  // the batch-invariance tests' own
        INFO(knob(d) << "=" << algo);
        ++ran;
        ctx.policy() = pin_policy("own", d, algo);
        Tensor out = run(ctx, "own", d, pr);
        CHECK(compare(out.to_host_f32(), pr, d, algo, Precision::Fp32) == "");
        const ManifestEntry* e = ctx.manifest().find("own", knob(d));
        REQUIRE(e != nullptr);
        CHECK(e->variant == algo);
        CHECK(e->deterministic == Determinism::Yes);
        CHECK(e->guarantee == (std::string(algo) == "ditto-direct" ? Guarantee::GpuToGpu : Guarantee::RunToRun));
        const Fingerprint first = out.fingerprint();
        CHECK(test::distinct_results(5, [&] { return run(ctx, "own", d, pr); }) == 1);
        Context again(Device::cuda(0), pin_policy("own", d, algo));
        Problem pr2(again, c, seed, /*with_reference=*/false);
        CHECK(run(again, "own", d, pr2).fingerprint() == first);
        // TF32: the same plan with tensor-core GEMMs (ditto-direct has no GEMM: fma either way).
        ctx.policy() = pin_policy("own", d, algo, Precision::Tf32);
        CHECK(compare(run(ctx, "own", d, pr).to_host_f32(), pr, d, algo, Precision::Tf32) == "");
      }
    }
  }
  // ditto-gemm both ways on all 12 (at most 64 groups); ditto-direct's bwd_filter on all 12 (the
  // implicit GEMM or the depthwise kernel), its bwd_data on the 4 depthwise; ditto-winograd in all three
  // directions on the two dense 3x3 stride-1 ones.
  CHECK(ran == 2 * 12 + 12 + 4 + 3 * 2);
  // ditto-winograd on small integers is exact (every step of its transforms and GEMMs is), so it equals
  // the reference's weight gradient exactly, with the images cut into three parts (the last padded).
  Context ctx(Device::cuda(0), pin_policy("wino", Dir::BwdFilter, "ditto-winograd"));
  const Shape xs = {300, 2, 7, 9}, ws = {3, 2, 3, 3};
  const Conv2dParams p = make(1, 1, 1, 1);
  std::vector<float> x(std::size_t(shape_numel(xs))), dy(std::size_t(300 * 3 * 7 * 9));
  std::mt19937_64 g(seed);
  for (auto& v : x) v = float(int(g() % 7) - 3);
  for (auto& v : dy) v = float(int(g() % 7) - 3);
  const Tensor got = conv2d_backward_filter(ctx, "wino", ctx.from_host(x, xs), ctx.from_host(dy, {300, 3, 7, 9}), ws, p);
  std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end()), want(std::size_t(shape_numel(ws)));
  ref::conv2d_bwd_filter(ref::conv2d_geom(xs, ws, p), xd.data(), dyd.data(), want.data());
  const auto h = got.to_host_f32();
  CHECK(std::vector<double>(h.begin(), h.end()) == want);

  // Its forward and input gradient (F(2x2, 3x3)) likewise, over two chunks of images (128 and 2).
  const Shape xs2 = {130, 4, 128, 128}, ws2 = {4, 4, 3, 3};
  const Conv2dParams p2 = make(1, 1, 1, 1);
  const own::ConvGeom g2{130, 4, 128, 128, 4, 3, 3, 128, 128, 1, 1, 1, 1, 1, 1, 1};
  REQUIRE(own::plan_winograd_conv(own::winograd_conv_of(g2, false)).chunks == 2);
  REQUIRE(own::plan_winograd_conv(own::winograd_conv_of(g2, true)).chunks == 2);
  std::vector<float> x2(std::size_t(shape_numel(xs2))), w2(std::size_t(shape_numel(ws2))), dy2(x2.size());
  for (auto& v : x2) v = float(int(g() % 7) - 3);
  for (auto& v : w2) v = float(int(g() % 7) - 3);
  for (auto& v : dy2) v = float(int(g() % 7) - 3);
  const ref::Conv2dGeom rg2 = ref::conv2d_geom(xs2, ws2, p2);
  std::vector<double> x2d(x2.begin(), x2.end()), w2d(w2.begin(), w2.end()), dy2d(dy2.begin(), dy2.end());
  std::vector<double> y_want(x2.size()), dx_want(x2.size());
  ref::conv2d_fwd(rg2, x2d.data(), w2d.data(), y_want.data());
  ref::conv2d_bwd_data(rg2, dy2d.data(), w2d.data(), dx_want.data());
  Context ctx2(Device::cuda(0), Policy::parse({"wino.fwd=ditto-winograd", "wino.bwd_data=ditto-winograd"}));
  const Tensor w2t = ctx2.from_host(w2, ws2);
  const auto y2 = conv2d_forward(ctx2, "wino", ctx2.from_host(x2, xs2), w2t, p2).to_host_f32();
  CHECK(std::vector<double>(y2.begin(), y2.end()) == y_want);
  const auto dx2 = conv2d_backward_data(ctx2, "wino", ctx2.from_host(dy2, xs2), w2t, xs2, p2).to_host_f32();
  CHECK(std::vector<double>(dx2.begin(), dx2.end()) == dx_want);
  CHECK(ctx2.manifest().find("wino", "fwd")->variant == "ditto-winograd");
  CHECK(ctx2.manifest().find("wino", "bwd_data")->variant == "ditto-winograd");
}

TEST_CASE("conv2d GPU: ditto-direct's bwd_data on a convolution that is not depthwise is a PolicyError saying why") {
  Context ctx(Device::cuda(0));
  const Case c{"3x3", {2, 8, 8, 8}, {8, 8, 3, 3}, make(1, 1, 1, 1)};
  Problem pr(ctx, c, 7, /*with_reference=*/false);
  for (Dir d : {Dir::BwdData}) {
    ctx.policy() = pin_policy("conv9", d, "ditto-direct");
    std::string msg;
    try {
      run(ctx, "conv9", d, pr);
    } catch (const PolicyError& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK_THAT(msg, Contains("conv9") && Contains("'ditto-direct'") && Contains("depthwise") &&
                        Contains("supported:") && Contains("ditto-gemm") && Contains("algo1"));
  }
}

TEST_CASE("conv2d GPU: a pinned algorithm cuDNN does not support is a PolicyError listing the supported ones") {
  Context ctx(Device::cuda(0));
  struct Unsupported {
    const char* why;
    Case c;
    Dir d;
    const char* algo;
  };
  const Unsupported probes[] = {
      {"FFT needs stride 1", {"3x3 stride 2", {4, 8, 16, 16}, {16, 8, 3, 3}, make(2, 1, 1, 1)}, Dir::Fwd, "fft"},
      {"Winograd needs 3x3, stride 1", {"5x5 stride 2", {4, 8, 16, 16}, {16, 8, 5, 5}, make(2, 2, 1, 1)}, Dir::Fwd, "winograd"},
      {"Winograd needs 3x3, stride 1", {"5x5 stride 2", {4, 8, 16, 16}, {16, 8, 5, 5}, make(2, 2, 1, 1)}, Dir::BwdData, "winograd"},
  };
  uint64_t seed = test::fresh_seed();
  for (const auto& u : probes) {
    INFO(u.why << ": " << knob(u.d) << "=" << u.algo);
    auto supported = conv_supported_algos(ctx, knob(u.d), u.c.x, u.c.w, u.c.p);
    REQUIRE(std::find(supported.begin(), supported.end(), u.algo) == supported.end());
    REQUIRE(!supported.empty());
    Problem pr(ctx, u.c, seed);
    ctx.policy() = pin_policy("conv3", u.d, u.algo);
    std::string msg;
    try {
      run(ctx, "conv3", u.d, pr);
    } catch (const PolicyError& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK_THAT(msg, Contains("conv3") && Contains(knob(u.d)) && Contains(std::string("'") + u.algo + "'") &&
                        Contains(shape_str(u.c.x)) && Contains(shape_str(u.c.w)) && Contains("supported:"));
    for (const auto& name : supported) CHECK_THAT(msg, Contains(name));
  }
  // The same through the differentiable op.
  Var x(ctx.zeros({4, 8, 16, 16})), w(ctx.zeros({16, 8, 3, 3}));
  ctx.policy() = Policy::parse({"conv3.fwd=fft"});
  CHECK_THROWS_AS(conv2d(ctx, "conv3", x, w, make(2, 1, 1, 1)), PolicyError);
}

TEST_CASE("conv2d GPU: DETERMINISM table on N=32,C=64,H=W=32,K=64, 3x3 pad 1") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0));
  const Case v{"varies", {32, 64, 32, 32}, {64, 64, 3, 3}, make(1, 1, 1, 1)};
  Problem pr(ctx, v, seed, /*with_reference=*/false);  // the small shapes above check values

  for (Dir d : kDirs) {
    auto algos = conv_algos(ctx, knob(d), v.x, v.w, v.p, Precision::Fp32);
    REQUIRE(!algos.empty());
    bool atomics_seen = false;
    for (const auto& info : algos) {
      INFO(knob(d) << "=" << info.name);
      ctx.policy() = pin_policy("v", d, info.name);
      auto fn = [&] { return run(ctx, "v", d, pr); };
      const std::size_t distinct = test::distinct_results(10, fn);
      const double us = micros_per_call(ctx, fn);
      std::printf("DETERMINISM | conv2d | %s=%s | %zu/10 | %.1f us\n", knob(d).c_str(), info.name.c_str(), distinct, us);
      std::printf("  (cuDNN label: deterministic=%s, workspace %zu bytes)\n", determinism_name(info.deterministic),
                  info.workspace_bytes);
      if (info.deterministic == Determinism::Yes) CHECK(distinct == 1);
      // The atomics algorithms: partial sums land in hardware order, so on this shape the
      // low bits differ between runs.
      if (d != Dir::Fwd && info.name == "algo0") {
        atomics_seen = true;
        CHECK(distinct > 1);
      }
      if (d == Dir::BwdFilter && info.name == "algo3" && distinct == 1)
        WARN("bwd_filter algo3 (labelled " << determinism_name(info.deterministic) << ") gave 1 distinct result of 10");
    }
    if (d != Dir::Fwd) CHECK(atomics_seen);
    for (const char* mode : {"deterministic", "nondeterministic", "heuristic", "fastest"}) {
      INFO("mode " << mode);
      ctx.policy() = pin_policy("v", d, mode);
      auto fn = [&] { return run(ctx, "v", d, pr); };
      const std::size_t distinct = test::distinct_results(10, fn);
      const double us = micros_per_call(ctx, fn);
      const ManifestEntry* e = ctx.manifest().find("v", knob(d));
      REQUIRE(e != nullptr);
      std::printf("DETERMINISM | conv2d | %s=%s:%s | %zu/10 | %.1f us\n", knob(d).c_str(), mode, e->variant.c_str(),
                  distinct, us);
      if (std::string(mode) == "deterministic") {
        CHECK(e->deterministic == Determinism::Yes);
        CHECK(distinct == 1);
      }
    }
  }
}

TEST_CASE("conv2d GPU: the pytorch mode runs engine-first in every direction, labelled by its configuration's notes") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0), Policy::parse({"*=pytorch"}));
  int nondeterministic = 0, runs = 0;
  for (const auto& c : cases()) {
    INFO("case " << c.name);
    Problem pr(ctx, c, seed);
    for (Dir d : kDirs) {
      INFO(knob(d));
      Tensor out = run(ctx, "c", d, pr);
      const ManifestEntry* e = ctx.manifest().find("c", knob(d));
      REQUIRE(e != nullptr);
      // The backend API builds a plan for every problem here: no legacy fallback.
      CHECK(e->variant == "engine-first");
      CHECK(e->requested == "pytorch");
      CHECK_FALSE(e->algorithm.empty());
      CHECK(compare(out.to_host_f32(), pr, d, "engine-first", Precision::Fp32) == "");
      const bool noted = e->algorithm.find("NONDETERMINISTIC") != std::string::npos;
      CHECK(e->deterministic == (noted ? Determinism::No : Determinism::Yes));
      CHECK(e->guarantee == (noted ? Guarantee::NotGuaranteed : Guarantee::RunToRun));
      // fp32: PyTorch's filter with TF32 off takes no tensor-core configuration.
      CHECK(e->algorithm.find("TENSOR_CORE") == std::string::npos);
      nondeterministic += noted;
      ++runs;
      if (!noted) CHECK(test::distinct_results(5, [&] { return run(ctx, "c", d, pr); }) == 1);
    }
  }
  std::printf("PYTORCHMODE engine-first: %d of %d problem directions run a configuration cuDNN notes NONDETERMINISTIC\n",
              nondeterministic, runs);
}
