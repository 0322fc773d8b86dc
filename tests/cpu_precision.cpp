// Reduced precision on the CPU: the bf16/f16 dtypes and their conversions (the toolkit's
// round-to-nearest-even, pinned at the edge cases), the precision knob, and the rounding points of
// conv2d and linear (kernels/precision.h): each result must equal the double reference of the
// rounded operands, rounded once more — exactly, bit for bit — and differ from fp32's.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/context.h"
#include "engine/detail/half_bits.h"
#include "engine/error.h"
#include "engine/tensor_ops.h"
#include "experiments/run_dir.h"
#include "kernels/conv2d.h"
#include "kernels/conv2d_ref.h"
#include "kernels/linear.h"
#include "kernels/linear_ref.h"
#include "support.h"
#include "train_support.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

uint16_t bits(DType t, float v) { return detail::float_to_half_bits(t, v); }

std::vector<float> rounded(DType t, std::vector<float> v) {
  for (float& x : v) x = detail::round_through(t, x);
  return v;
}

bool all_representable(DType t, const std::vector<float>& v) {
  for (float x : v)
    if (detail::round_through(t, x) != x) return false;
  return true;
}

std::vector<float> random_floats(std::size_t n, uint64_t seed) { return test::random_vec<float>(n, seed); }

DType dtype_of(const std::string& precision) { return precision == "bf16" ? DType::BF16 : DType::F16; }

}  // namespace

TEST_CASE("bf16 and f16 conversions round to nearest, ties to even, overflow to infinity") {
  // bf16 keeps 8 bits of significand: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to the
  // even one (1); 1 + 3*2^-8 is a tie between 1 + 2^-7 and 1 + 2^-6 and goes to 1 + 2^-6.
  CHECK(bits(DType::BF16, 1.0f + 0x1p-8f) == 0x3f80);
  CHECK(bits(DType::BF16, 1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(bits(DType::BF16, 1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // above the tie: up
  CHECK(bits(DType::BF16, FLT_MAX) == 0x7f80);                    // rounds past the largest bf16
  CHECK(bits(DType::BF16, -0.0f) == 0x8000);
  CHECK(std::isnan(detail::round_through(DType::BF16, std::numeric_limits<float>::quiet_NaN())));
  // f16: 65504 is the largest; 65520 is the tie with 65536 (not representable) and overflows.
  CHECK(bits(DType::F16, 65504.0f) == 0x7bff);
  CHECK(bits(DType::F16, 65519.0f) == 0x7bff);
  CHECK(bits(DType::F16, 65520.0f) == 0x7c00);
  CHECK(bits(DType::F16, 0x1p-24f) == 0x0001);       // the smallest subnormal
  CHECK(bits(DType::F16, 0x1p-25f) == 0x0000);       // a tie with 0: even
  CHECK(bits(DType::F16, 0x1p-25f * 1.5f) == 0x0001);
  CHECK(bits(DType::F16, 1.0f + 0x1p-11f) == 0x3c00);  // 11-bit significand: a tie, to even
  CHECK(detail::half_bits_to_float(DType::F16, 0x3c01) == 1.0f + 0x1p-10f);
}

TEST_CASE("to_dtype: narrowing rounds, widening is exact, the same dtype is the same tensor") {
  Context ctx;
  const std::vector<float> v = random_floats(1000, test::fresh_seed());
  Tensor t = ctx.from_host(v, {10, 100});
  for (DType d : {DType::BF16, DType::F16}) {
    Tensor h = to_dtype(ctx, t, d);
    CHECK(h.dtype() == d);
    CHECK(h.shape() == t.shape());
    CHECK(h.nbytes() == 2000);
    CHECK(h.to_host_f32() == rounded(d, v));
    CHECK(to_dtype(ctx, h, DType::F32).to_host_f32() == rounded(d, v));
    CHECK(to_dtype(ctx, h, d).raw() == h.raw());
  }
  CHECK(to_dtype(ctx, t, DType::F32).raw() == t.raw());
  // bf16 -> f16 goes through f32: the f16 rounding of the bf16 values.
  CHECK(to_dtype(ctx, to_dtype(ctx, t, DType::BF16), DType::F16).to_host_f32() ==
        rounded(DType::F16, rounded(DType::BF16, v)));
  CHECK_THROWS_WITH(to_dtype(ctx, ctx.zeros({3}, DType::I32), DType::BF16), Contains("i32") && Contains("bf16"));
  CHECK_THROWS_AS(to_dtype(ctx, Tensor(), DType::BF16), ShapeError);
  CHECK_THROWS_WITH(to_dtype(ctx, t, DType::BF16).f32(), Contains("tensor is bf16, f32 access requested"));
}

TEST_CASE("narrow_int64_words: int32-sized values exactly, others an error naming the element on the CPU") {
  Context ctx;
  const std::vector<int64_t> fit = {0, 1, -1, 255, -100, INT32_MAX, INT32_MIN, 123456789};
  Tensor t = narrow_int64_words(ctx, ctx.from_host(test::int64_words(fit), {16}), {2, 4});
  CHECK(t.dtype() == DType::I32);
  CHECK(t.shape() == Shape{2, 4});
  CHECK(t.to_host_i32() == std::vector<int32_t>(fit.begin(), fit.end()));
  // 2^32 + 3 is not 3, and -2^33 is not 0: never a wrapped, valid-looking value.
  CHECK_THROWS_WITH(narrow_int64_words(ctx, ctx.from_host(test::int64_words({0, (int64_t(1) << 32) + 3}), {4}), {2}),
                    Contains("element 1 is 4294967299, outside int32"));
  CHECK_THROWS_WITH(narrow_int64_words(ctx, ctx.from_host(test::int64_words({-(int64_t(1) << 33)}), {2}), {1}),
                    Contains("element 0 is -8589934592, outside int32"));
  CHECK_THROWS_AS(narrow_int64_words(ctx, ctx.from_host(test::int64_words({1, 2}), {4}), {3}), ShapeError);
  CHECK_THROWS_AS(narrow_int64_words(ctx, ctx.zeros({4}), {2}), ShapeError);  // f32, not words
}

TEST_CASE("channels-last copies: each element moves to its NHWC place, rounded once, and back") {
  Context ctx;
  const Shape s{2, 3, 4, 5};
  const std::vector<float> v = random_floats(shape_numel(s), test::fresh_seed());
  const Tensor t = ctx.from_host(v, s);
  for (DType d : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor nhwc = to_channels_last(ctx, t, d);
    REQUIRE(nhwc.shape() == s);  // shapes stay logical; the memory is N, H, W, C
    CHECK(nhwc.layout() == Layout::Nhwc);
    CHECK(nhwc.dtype() == d);
    const std::vector<float> got = nhwc.to_host_f32();
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t w = 0; w < 5; ++w)
            REQUIRE(got[((n * 4 + h) * 5 + w) * 3 + c] ==
                    (d == DType::F32 ? v[((n * 3 + c) * 4 + h) * 5 + w]
                                     : detail::round_through(d, v[((n * 3 + c) * 4 + h) * 5 + w])));
    const Tensor back = from_channels_last(ctx, nhwc, DType::F32);
    CHECK(back.shape() == s);
    CHECK(back.layout() == Layout::Nchw);
    CHECK(back.to_host_f32() == (d == DType::F32 ? v : rounded(d, v)));
  }
  CHECK_THROWS_WITH(to_channels_last(ctx, ctx.zeros({2, 3}), DType::BF16), Contains("4-D"));
}

TEST_CASE("bf16 and f16 tensors: fingerprints see the dtype, safetensors round-trips them") {
  Context ctx;
  Tensor t = ctx.from_host(random_floats(64, 7), {8, 8});
  Tensor b = to_dtype(ctx, t, DType::BF16), h = to_dtype(ctx, t, DType::F16);
  CHECK(b.fingerprint() != h.fingerprint());
  const std::string path = test::scratch("cpu_precision", "half.safetensors");
  save_safetensors(path, {{"b", b}, {"h", h}});
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.at("b").dtype() == DType::BF16);
  CHECK(f.tensors.at("h").dtype() == DType::F16);
  CHECK(f.tensors.at("b").fingerprint() == b.fingerprint());
  CHECK(f.tensors.at("h").fingerprint() == h.fingerprint());
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text.find("\"dtype\":\"BF16\"") != std::string::npos);
  CHECK(text.find("\"dtype\":\"F16\"") != std::string::npos);
}

TEST_CASE("precision knob: names, dtypes, every mode picks fp32") {
  for (Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16})
    CHECK(parse_precision(name_of(p)) == p);
  CHECK(precision_dtype(Precision::Tf32) == DType::F32);
  CHECK(precision_dtype(Precision::Bf16) == DType::BF16);
  CHECK(precision_dtype(Precision::Fp16) == DType::F16);
  CHECK_THROWS_WITH(parse_precision("fma"), Contains("fp32, tf32, bf16, fp16"));
  for (const char* mode : {"heuristic", "deterministic", "nondeterministic", "fastest"})
    CHECK(Policy::parse({std::string("*=") + mode}).variant<Precision>("c", op::conv2d) == Precision::Fp32);
  // The CPU emulates bf16 and fp16 (so a replayed pin is not "not applied"), not tf32.
  CHECK(runs_on_cpu("precision", "bf16"));
  CHECK(runs_on_cpu("precision", "fp16"));
  CHECK_FALSE(runs_on_cpu("precision", "tf32"));
  CHECK_THROWS_WITH(Policy::parse({"c1.math=tf32"}), Contains("precision"));
  // The CPU reference reads NCHW whatever the layout: a layout pin changes nothing there.
  CHECK_FALSE(runs_on_cpu("layout", "nhwc"));
}

TEST_CASE("conv2d in bf16/fp16 on the CPU rounds its operands and results exactly where the GPU does") {
  const auto precision = GENERATE(as<std::string>{}, "bf16", "fp16");
  const DType d = dtype_of(precision);
  Context ctx(Device::cpu(), Policy::parse({"c1.precision=" + precision}));
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  p.stride_h = 2;
  const Shape xs{2, 3, 7, 6}, ws{4, 3, 3, 3};
  const uint64_t seed = test::fresh_seed();
  const std::vector<float> xv = random_floats(shape_numel(xs), seed), wv = random_floats(shape_numel(ws), seed + 1);
  Var x(ctx.from_host(xv, xs), true), w(ctx.from_host(wv, ws), true);
  Var y = conv2d(ctx, "c1", x, w, p);
  REQUIRE(y.value().dtype() == DType::F32);  // handed on widened
  const ref::Conv2dGeom g = ref::conv2d_geom(xs, ws, p);
  // Forward: the reference of the rounded operands, rounded.
  const std::vector<float> xr = rounded(d, xv), wr = rounded(d, wv);
  std::vector<float> want(shape_numel(y.shape()));
  ref::conv2d_fwd(g, xr.data(), wr.data(), want.data());
  CHECK(y.value().to_host_f32() == rounded(d, want));
  // fp32 computes something else: the rounding happened.
  Context fp32(Device::cpu());
  CHECK(conv2d(fp32, "c1", Var(fp32.from_host(xv, xs)), Var(fp32.from_host(wv, ws)), p).value().to_host_f32() !=
        y.value().to_host_f32());

  // Backward from a seed gradient that is not representable: it is rounded first.
  const std::vector<float> dyv = random_floats(shape_numel(y.shape()), seed + 2);
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, y.shape()));
  const std::vector<float> dyr = rounded(d, dyv);
  std::vector<float> dx(xv.size()), dw(wv.size());
  ref::conv2d_bwd_data(g, dyr.data(), wr.data(), dx.data());
  ref::conv2d_bwd_filter(g, xr.data(), dyr.data(), dw.data());
  CHECK(x.grad().to_host_f32() == rounded(d, dx));
  CHECK(w.grad().to_host_f32() == rounded(d, dw));
  CHECK(all_representable(d, w.grad().to_host_f32()));

  for (const char* knob : {"fwd", "bwd_data", "bwd_filter"}) {
    const ManifestEntry* m = ctx.manifest().find("c1", knob);
    REQUIRE(m);
    CHECK(m->variant == "cpu-reference");
    CHECK(m->precision == precision);
  }
  CHECK(pins_from_ops(ctx.manifest().entries()) ==
        std::vector<std::string>(3, "c1.precision=" + precision));
}

TEST_CASE("linear in bf16/fp16 on the CPU rounds its operands and results exactly where cuBLAS does") {
  const auto precision = GENERATE(as<std::string>{}, "bf16", "fp16");
  const DType d = dtype_of(precision);
  Context ctx(Device::cpu(), Policy::parse({"fc.precision=" + precision}));
  const int64_t n = 5, in = 17, out = 6;
  const uint64_t seed = test::fresh_seed();
  const std::vector<float> xv = random_floats(n * in, seed), wv = random_floats(out * in, seed + 1);
  Var x(ctx.from_host(xv, {n, in}), true), w(ctx.from_host(wv, {out, in}), true);
  Var y = linear(ctx, "fc", x, w);
  const std::vector<float> xr = rounded(d, xv), wr = rounded(d, wv);
  std::vector<float> want(n * out);
  ref::linear_fwd(xr.data(), wr.data(), want.data(), n, in, out);
  CHECK(y.value().to_host_f32() == rounded(d, want));

  const std::vector<float> dyv = random_floats(n * out, seed + 2);
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, {n, out}));
  const std::vector<float> dyr = rounded(d, dyv);
  std::vector<float> dx(xv.size()), dw(wv.size());
  ref::linear_bwd_x(dyr.data(), wr.data(), dx.data(), n, in, out);
  ref::linear_bwd_w(dyr.data(), xr.data(), dw.data(), n, in, out);
  CHECK(x.grad().to_host_f32() == rounded(d, dx));
  CHECK(w.grad().to_host_f32() == rounded(d, dw));
  const ManifestEntry* m = ctx.manifest().find("fc", "precision");
  REQUIRE(m);
  CHECK(m->variant == precision);
  CHECK(m->requested == "pinned");
}

TEST_CASE("a bf16 training run on the CPU replays bit for bit and differs from fp32") {
  using test::scratch;
  auto config = [](const std::string& name, const std::string& precision) {
    TrainConfig c = test::synthetic_config("smallcnn", 128, 32, 16, 32);
    c.deterministic_init = c.deterministic_input = true;
    c.precision = precision;
    c.out = scratch("cpu_precision", name);
    return c;
  };
  const TrainResult a = train(config("bf16_a", "bf16"));
  const TrainResult b = train(config("bf16_b", "bf16"));
  const TrainResult f = train(config("fp32", "fp32"));
  CHECK(a.weights_fingerprint == b.weights_fingerprint);
  CHECK(a.weights_fingerprint != f.weights_fingerprint);
  // The manifest's replay names the precision, and its pins alone reproduce the run.
  std::ifstream in(scratch("cpu_precision", "bf16_a") + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  CHECK(m["replay"].get<std::string>().find("--precision bf16") != std::string::npos);
  CHECK(m["config"]["precision"] == "bf16");
  TrainConfig again = config("bf16_pins", "fp32");
  again.pins = pins_from_manifest(scratch("cpu_precision", "bf16_a") + "/manifest.json");
  CHECK(train(again).weights_fingerprint == a.weights_fingerprint);
}
