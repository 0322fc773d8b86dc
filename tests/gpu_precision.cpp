// Reduced precision on the GPU: the conversion kernels against the host's (bit for bit), conv2d
// in bf16/fp16 under every algorithm cuDNN supports against the CPU's rounded reference, linear
// likewise, the deterministic selection's bit-equal repeats, own algorithms refused, and whole
// bf16/fp16 trainings: two runs and graphed vs eager bit-identical.
//
// Tolerances. The operands are bf16/f16 values, whose products are exact in fp32 (8x8 and 11x11
// significand bits fit in 24). The GPU sums them in fp32 in some order, so before its output is
// rounded it is within gamma_{L+1} * A_i of the exact sum (L products, A_i the sum of their
// magnitudes, gamma_n = n u / (1 - n u), u = 2^-24: Higham 3.1). Rounding to nearest is monotone,
// so the rounded GPU value and the rounded exact value differ by at most that plus one unit in
// the last place of the output format at the larger of the two (bf16: <= 2^-7 |v|, f16: <= 2^-10
// |v| or 2^-24 among subnormals). The reference is exactly that rounded exact value (double sums
// of the same operands, rounded once). Transform algorithms (FFT, Winograd), where cuDNN offers
// them, transform in their own precision and get gpu_conv2d's tf32 allowance of 2^-7 of the
// output's scale on top.
//
// The atomics algorithms are another matter, and what this test found: in bf16/fp16, cuDNN's
// bwd_data ALGO_0 adds its partial sums atomically into the bf16/f16 output, so every partial
// add rounds to the output format — a reduced-precision reduction, as well as an unordered one
// (10 of 10 calls differ, errors of several output ulps). No order-free bound is useful there
// (L products added one by one in bf16 bound nothing once L u_bf16 >= 1), so those algorithms get
// a sanity allowance of 2^-3 A_i, which catches NaN, a wrong layout or a lost batch, and their
// worst error in output ulps is printed for the record.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/context.h"
#include "engine/detail/half_bits.h"
#include "engine/error.h"
#include "engine/tensor_ops.h"
#include "engine/tuning.h"
#include "experiments/train.h"
#include "kernels/conv2d.h"
#include "kernels/conv2d_ref.h"
#include "kernels/linear.h"
#include "support.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

DType dtype_of(Precision p) { return precision_dtype(p); }

std::vector<float> rounded(DType t, std::vector<float> v) {
  for (float& x : v) x = detail::round_through(t, x);
  return v;
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> magnitudes(const std::vector<float>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(double(v[i]));
  return out;
}

double ulp_bound(DType t, double v) {
  return t == DType::BF16 ? std::ldexp(std::fabs(v), -7) : std::max(std::ldexp(std::fabs(v), -10), std::ldexp(1.0, -24));
}

// "" when every element is within the header's bound; *worst_ulps (when given) gets the largest
// error in units of the output format's last place.
std::string compare(const std::vector<float>& got, const std::vector<double>& exact, const std::vector<double>& abs_sum,
                    int64_t products, DType t, bool transform, bool atomics = false, double* worst_ulps = nullptr) {
  if (got.size() != exact.size()) return "size mismatch";
  const double u = std::ldexp(1.0, -24), n = double(products + 1), gamma = n * u / (1 - n * u);
  double scale = 0;
  for (double a : abs_sum) scale = std::max(scale, a);
  if (worst_ulps) *worst_ulps = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = detail::round_through(t, float(exact[i]));
    const double ulp = ulp_bound(t, std::max(std::fabs(want), std::fabs(double(got[i]))));
    if (worst_ulps) *worst_ulps = std::max(*worst_ulps, std::fabs(double(got[i]) - want) / ulp);
    const double tol = atomics ? std::ldexp(abs_sum[i], -3)
                               : gamma * abs_sum[i] + ulp + (transform ? std::ldexp(scale, -7) : 0.0);
    if (!(std::fabs(double(got[i]) - want) <= tol)) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "element %zu: got %.9g, want %.9g (exact %.9g), tolerance %.3g", i,
                    double(got[i]), want, exact[i], tol);
      return buf;
    }
  }
  return "";
}

bool is_transform(const std::string& algo) {
  return algo.find("fft") != std::string::npos || algo.find("winograd") != std::string::npos;
}

// Exact sums (double) and magnitude sums of each direction (fwd, bwd_data, bwd_filter) of one
// problem, from the rounded operands.
struct ReferenceSums {
  std::vector<double> exact[3], abs_sum[3];
  ReferenceSums(const ref::Conv2dGeom& g, const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>& dy) {
    exact[0].resize(dy.size()), abs_sum[0].resize(dy.size());
    ref::conv2d_fwd(g, as_double(x).data(), as_double(w).data(), exact[0].data());
    ref::conv2d_fwd(g, magnitudes(x).data(), magnitudes(w).data(), abs_sum[0].data());
    exact[1].resize(x.size()), abs_sum[1].resize(x.size());
    ref::conv2d_bwd_data(g, as_double(dy).data(), as_double(w).data(), exact[1].data());
    ref::conv2d_bwd_data(g, magnitudes(dy).data(), magnitudes(w).data(), abs_sum[1].data());
    exact[2].resize(w.size()), abs_sum[2].resize(w.size());
    ref::conv2d_bwd_filter(g, as_double(x).data(), as_double(dy).data(), exact[2].data());
    ref::conv2d_bwd_filter(g, magnitudes(x).data(), magnitudes(dy).data(), abs_sum[2].data());
  }
};

const char* kDirections[] = {"fwd", "bwd_data", "bwd_filter"};

}  // namespace

TEST_CASE("gpu precision: the conversion kernels round exactly as the host does") {
  Context gpu(Device::cuda(0)), cpu;
  // 4M float bit patterns spread over the whole 32-bit space (an odd stride visits every
  // exponent, sign and both ends of the significand), plus the edges.
  std::vector<uint32_t> patterns(1 << 22);
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = uint32_t(i * 1031u + (i >> 11) * 7919u);
  for (uint32_t edge : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f7fffffu, 0x00000001u,
                        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x33000000u, 0x3f808000u, 0x3f818000u})
    patterns.push_back(edge);
  std::vector<float> v(patterns.size());
  std::memcpy(v.data(), patterns.data(), v.size() * 4);
  const Tensor host = cpu.from_host(v, {int64_t(v.size())});
  const Tensor device = gpu.to_device(host);
  for (DType t : {DType::BF16, DType::F16}) {
    INFO(dtype_name(t));
    const Tensor a = to_dtype(cpu, host, t), b = to_dtype(gpu, device, t);
    CHECK(a.fingerprint() == b.fingerprint());  // every narrowed bit pattern, NaN payloads included
    // Widening every one of the 65536 patterns.
    std::vector<float> all(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = detail::half_bits_to_float(t, uint16_t(i));
    const Tensor narrow_all = to_dtype(cpu, cpu.from_host(all, {65536}), t);
    CHECK(to_dtype(cpu, narrow_all, DType::F32).fingerprint() ==
          to_dtype(gpu, gpu.to_device(narrow_all), DType::F32).fingerprint());
  }
}

TEST_CASE("gpu precision: channels-last copies on the GPU equal the host's, bit for bit") {
  Context gpu(Device::cuda(0)), cpu;
  // Odd sizes: partial 32x32 tiles on both axes.
  const Shape s{3, 37, 9, 11};
  const Tensor host = cpu.from_host(test::random_vec<float>(shape_numel(s), test::fresh_seed()), s);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    INFO(dtype_name(t));
    const Tensor a = to_channels_last(cpu, host, t), b = to_channels_last(gpu, gpu.to_device(host), t);
    CHECK(a.fingerprint() == b.fingerprint());
    CHECK(from_channels_last(cpu, a, DType::F32).fingerprint() == from_channels_last(gpu, b, DType::F32).fingerprint());
  }
}

TEST_CASE("gpu precision: conv2d in bf16/fp16, every supported algorithm of every direction, against the rounded reference") {
  const Precision precision = GENERATE(Precision::Bf16, Precision::Fp16);
  const ConvLayout layout = GENERATE(ConvLayout::Nchw, ConvLayout::Nhwc);
  const DType t = dtype_of(precision);
  INFO(name_of(precision) << " " << name_of(layout));
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0));
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Shape xs{8, 16, 12, 12}, ws{32, 16, 3, 3};
  const ref::Conv2dGeom g = ref::conv2d_geom(xs, ws, p);
  const Shape ys = conv2d_output_shape("c", xs, ws, p);
  const std::vector<float> x = rounded(t, test::random_vec<float>(shape_numel(xs), seed)),
                           w = rounded(t, test::random_vec<float>(shape_numel(ws), seed + 1)),
                           dy = rounded(t, test::random_vec<float>(shape_numel(ys), seed + 2));
  const ReferenceSums sums(g, x, w, dy);
  const auto& exact = sums.exact;
  const auto& abs_sum = sums.abs_sum;
  const int64_t products[3] = {16 * 9, 32 * 9, 8 * 12 * 12};
  const Tensor xd = ctx.from_host(x, xs), wd = ctx.from_host(w, ws), dyd = ctx.from_host(dy, ys);
  for (int d = 0; d < 3; ++d) {
    const auto algos = conv_algos(ctx, kDirections[d], xs, ws, p, precision, layout);
    CHECK_FALSE(algos.empty());
    for (const auto& info : algos) {
      INFO(kDirections[d] << " " << info.name);
      ctx.policy() = Policy::parse({std::string("c.") + kDirections[d] + "=" + info.name,
                                    std::string("c.precision=") + name_of(precision),
                                    std::string("c.layout=") + name_of(layout)});
      auto run = [&] {
        return d == 0   ? conv2d_forward(ctx, "c", xd, wd, p)
               : d == 1 ? conv2d_backward_data(ctx, "c", dyd, wd, xs, p)
                        : conv2d_backward_filter(ctx, "c", xd, dyd, ws, p);
      };
      const Tensor out = run();
      CHECK(out.dtype() == DType::F32);
      const bool atomics = info.deterministic == Determinism::No;
      double worst_ulps = 0;
      CHECK(compare(out.to_host_f32(), exact[d], abs_sum[d], products[d], t, is_transform(info.name), atomics,
                    &worst_ulps) == "");
      const ManifestEntry* m = ctx.manifest().find("c", kDirections[d], shape_key(xs));
      REQUIRE(m);
      CHECK(m->precision == name_of(precision));
      const std::size_t distinct = test::distinct_results(10, run);
      std::printf("DETERMINISM | conv2d %s %s | %s %s | %zu/10 | labelled %s | worst error %.1f output ulps\n",
                  name_of(precision), name_of(layout), kDirections[d], info.name.c_str(), distinct,
                  determinism_name(info.deterministic), worst_ulps);
      if (info.deterministic == Determinism::Yes) CHECK(distinct == 1);
    }
  }
}

TEST_CASE("gpu precision: deterministic selection in bf16 repeats bit for bit; ditto's own algorithms are refused") {
  Context ctx(Device::cuda(0), Policy::parse({"*=deterministic", "*.precision=bf16"}));
  const uint64_t seed = test::fresh_seed();
  const Shape xs{16, 32, 16, 16}, ws{64, 32, 3, 3};
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  auto step = [&] {
    Var x(ctx.from_host(test::random_vec<float>(shape_numel(xs), seed), xs), true);
    Var w(ctx.from_host(test::random_vec<float>(shape_numel(ws), seed + 1), ws), true);
    Var y = conv2d(ctx, "c", x, w, p);
    ctx.tape().backward(ctx, y, ctx.full(y.shape(), 0.25f));
    return std::vector<Fingerprint>{y.value().fingerprint(), x.grad().fingerprint(), w.grad().fingerprint()};
  };
  const auto first = step();
  for (int i = 0; i < 5; ++i) CHECK(step() == first);
  for (const char* knob : kDirections) {
    const ManifestEntry* m = ctx.manifest().find("c", knob, shape_key(xs));
    REQUIRE(m);
    CHECK(m->precision == "bf16");
    CHECK(m->deterministic == Determinism::Yes);
  }
  ctx.policy() = Policy::parse({"c.bwd_filter=ditto-gemm", "c.precision=bf16"});
  CHECK_THROWS_WITH(conv2d_backward_filter(ctx, "c", ctx.zeros(xs), ctx.zeros({16, 64, 16, 16}), ws, p),
                    Contains("'c'") && Contains("ditto's own algorithms compute in fp32 or tf32"));
  ctx.policy() = Policy::parse({"c.bwd_filter=ditto-direct", "c.layout=nhwc"});
  CHECK_THROWS_WITH(conv2d_backward_filter(ctx, "c", ctx.zeros(xs), ctx.zeros({16, 64, 16, 16}), ws, p),
                    Contains("'c'") && Contains("ditto's own algorithms read NCHW"));
}

TEST_CASE("gpu precision: the engine variant under deterministic, fastest and tuning, on a channel-expanding problem") {
  // A 1x1 convolution from 8 to 128 channels: y is 16 times x, so timing a direction's candidates
  // into a buffer of the wrong operand's size would write far past it (run this case under
  // compute-sanitizer to see it). Each mode's result must equal the rounded reference.
  const uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const Shape xs{4, 8, 16, 16}, ws{128, 8, 1, 1};
  const Conv2dParams p;
  const Shape ys = conv2d_output_shape("c", xs, ws, p);
  const ref::Conv2dGeom g = ref::conv2d_geom(xs, ws, p);
  const std::vector<float> x = rounded(DType::BF16, test::random_vec<float>(shape_numel(xs), seed)),
                           w = rounded(DType::BF16, test::random_vec<float>(shape_numel(ws), seed + 1)),
                           dy = rounded(DType::BF16, test::random_vec<float>(shape_numel(ys), seed + 2));
  const ReferenceSums sums(g, x, w, dy);
  const int64_t products[3] = {8, 128, 4 * 16 * 16};
  for (const char* mode : {"deterministic", "fastest", "tuned"}) {
    INFO(mode);
    const bool tuned = std::string(mode) == "tuned";
    Context ctx(Device::cuda(0), Policy::parse({std::string("*=") + (tuned ? "deterministic" : mode),
                                                "*.precision=bf16", "*.layout=nhwc"}));
    auto table = std::make_shared<TuningTable>();
    if (tuned) ctx.set_tuning(table);
    const Tensor xd = ctx.from_host(x, xs), wd = ctx.from_host(w, ws), dyd = ctx.from_host(dy, ys);
    for (int d = 0; d < 3; ++d) {
      INFO(kDirections[d]);
      const Tensor out = d == 0   ? conv2d_forward(ctx, "c", xd, wd, p)
                         : d == 1 ? conv2d_backward_data(ctx, "c", dyd, wd, xs, p)
                                  : conv2d_backward_filter(ctx, "c", xd, dyd, ws, p);
      const ManifestEntry* m = ctx.manifest().find("c", kDirections[d], shape_key(xs));
      REQUIRE(m);
      CHECK(compare(out.to_host_f32(), sums.exact[d], sums.abs_sum[d], products[d], DType::BF16,
                    is_transform(m->variant)) == "");
      if (std::string(mode) == "deterministic") {
        // bf16: the backend API's reproducible pick, named in the manifest.
        CHECK(m->variant == "engine");
        CHECK(m->algorithm.rfind("eng", 0) == 0);
        CHECK(m->deterministic == Determinism::Yes);
      }
      std::printf("ENGINE %s bf16 nhwc %s: %s %s\n", mode, kDirections[d], m->variant.c_str(), m->algorithm.c_str());
    }
    if (tuned) CHECK(table->entries().size() >= 3);
  }
}

TEST_CASE("gpu precision: linear in bf16/fp16 against the rounded reference, repeats bit for bit") {
  const Precision precision = GENERATE(Precision::Bf16, Precision::Fp16);
  const DType t = dtype_of(precision);
  INFO(name_of(precision));
  const uint64_t seed = test::fresh_seed();
  Context ctx(Device::cuda(0), Policy::parse({std::string("fc.precision=") + name_of(precision)}));
  const int64_t n = 64, in = 300, out = 40;
  const std::vector<float> x = rounded(t, test::random_vec<float>(n * in, seed)),
                           w = rounded(t, test::random_vec<float>(out * in, seed + 1));
  std::vector<double> exact(n * out), abs_sum(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) {
        exact[i * out + o] += double(x[i * in + k]) * w[o * in + k];
        abs_sum[i * out + o] += std::fabs(double(x[i * in + k]) * w[o * in + k]);
      }
  auto forward = [&] { return linear(ctx, "fc", Var(ctx.from_host(x, {n, in})), Var(ctx.from_host(w, {out, in}))).value(); };
  CHECK(compare(forward().to_host_f32(), exact, abs_sum, in, t, false) == "");
  CHECK(test::distinct_results(10, forward) == 1);
  CHECK(ctx.manifest().find("fc", "precision")->variant == name_of(precision));
}

TEST_CASE("gpu precision: bf16 and fp16 SmallCNN-BN trainings repeat bit for bit, graphed as eager") {
  const std::string precision = GENERATE(as<std::string>{}, "bf16", "fp16");
  const bool channels_last = GENERATE(false, true);
  INFO(precision << (channels_last ? " channels-last" : ""));
  TrainConfig c = test::synthetic_config("smallcnn-bn", 512, 128, 32, 64, "cuda");
  c.deterministic_init = c.deterministic_input = true;
  c.kernels = "deterministic";
  c.precision = precision;
  c.channels_last = channels_last;
  c.epochs = 2;
  const TrainResult a = train(c), b = train(c);
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  c.graph = true;
  const TrainResult graphed = train(c);
  CHECK(graphed.weights_fingerprint == a.weights_fingerprint);
  CHECK(graphed.predictions == a.predictions);
  c.graph = false;
  c.precision = "fp32";
  c.channels_last = false;
  CHECK(train(c).weights_fingerprint != a.weights_fingerprint);
  std::printf("PRECISION smallcnn-bn %s%s: fingerprint %s, test accuracy %.4f\n", precision.c_str(),
              channels_last ? " channels-last" : "", a.weights_fingerprint.hex().c_str(), a.log.back().test_top1);
}
