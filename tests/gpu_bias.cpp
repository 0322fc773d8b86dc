// Bias add on the GPU: every bias_bwd variant against the CPU reference, 10-run bit-equality of
// the deterministic and cuDNN variants, the atomic variant shown to vary, the DETERMINISM lines.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>

#include "engine/context.h"
#include "kernels/bias.h"
#include "kernels/bias_ref.h"
#include "support.h"

using namespace ditto;

using test::us_per_call;

namespace {


const char* const kPolicy[] = {"b_atomic.bias_bwd=atomic", "b_det.bias_bwd=deterministic", "b_cudnn.bias_bwd=cudnn"};

}  // namespace

TEST_CASE("gpu bias: forward, dx and every db variant against the CPU reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0), Policy::parse({kPolicy[0], kPolicy[1], kPolicy[2]}));
  for (Shape shape : {Shape{8, 16, 16, 16}, Shape{512, 64}, Shape{3, 5, 7, 9}}) {
    INFO("shape " << shape_str(shape));
    const int64_t n = shape[0], c = shape[1], s = shape.size() == 4 ? shape[2] * shape[3] : 1, total = n * c * s;
    auto xv = test::random_vec(total, seed), bv = test::random_vec(c, seed + 1);
    // Positive dy, so that sum |dy| = |sum dy| and the db bound below is relative to the result.
    auto dyv = test::random_vec(total, seed + 2, 0.5, 1.5);
    std::vector<float> want_y(total), want_db(c);
    ref::bias_fwd(xv.data(), bv.data(), want_y.data(), n, c, s);
    std::vector<double> dyd = test::to_double(dyv), db_d(c);
    ref::bias_bwd_db(dyd.data(), db_d.data(), n, c, s);
    for (std::string layer : {"b_atomic", "b_det", "b_cudnn"}) {
      if (layer == "b_cudnn" && shape.size() != 4) continue;  // cudnn is 4-D only (a PolicyError otherwise)
      INFO("variant " << layer);
      Var x(ctx.from_host(xv, shape), true), b(ctx.from_host(bv, {c}), true);
      OpKind kind = shape.size() == 4 ? op::conv2d : op::linear;
      Var y = bias_add(ctx, layer, kind, x, b);
      ctx.tape().backward(ctx, y, ctx.from_host(dyv, shape));
      // y = x + b is one correctly rounded float addition on both sides: bit-equal.
      CHECK(y.value().to_host_f32() == want_y);
      CHECK(x.grad().to_host_f32() == dyv);  // dx is a copy of dy
      // db[c] sums M = N*S positive terms. Any summation order (per-thread runs, trees, atomics
      // in any order, cuDNN's own) has |err| <= gamma_{M} * sum|dy| (Higham, Thm 4.1 / (4.4)),
      // plus one final rounding. With positive terms that is a relative bound: rtol =
      // (M + 1) u / (1 - (M + 1) u), u = 2^-24 (1.2e-4 for M = 2048). A channel mix-up changes a
      // channel sum by ~sqrt(M/12)/M ~ 0.6% (M = 2048) and fails.
      const double m1 = double(n * s + 1);
      auto r = test::all_close(b.grad().to_host_f32(), db_d, 0.0, m1 * 0x1p-24 / (1 - m1 * 0x1p-24));
      INFO(r.str());
      CHECK(r.ok);
    }
  }
}

TEST_CASE("gpu bias: deterministic and cudnn bit-equal over 10 runs; atomic varies") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0), Policy::parse({kPolicy[0], kPolicy[1], kPolicy[2]}));
  // dy {256, 16, 32, 32}: each channel's db sums 262144 terms (1024 warps' partials per channel
  // for the atomic variant).
  const Shape shape{256, 16, 32, 32};
  const int64_t total = shape_numel(shape);
  Tensor x = ctx.from_host(test::random_vec(total, seed), shape);
  Tensor dy = ctx.from_host(test::random_vec(total, seed + 1), shape);
  Tensor bt = ctx.from_host(test::random_vec(16, seed + 2), {16});
  for (std::string layer : {"b_atomic", "b_det", "b_cudnn"}) {
    Var b(bt, true);
    auto step = [&] {
      b.zero_grad();
      Var y = bias_add(ctx, layer, op::conv2d, Var(x), b);
      ctx.tape().backward(ctx, y, dy);
      return b.grad();
    };
    std::size_t distinct = test::distinct_results(10, step);
    double us = us_per_call(ctx, [&] { step(); });
    const ManifestEntry* m = ctx.manifest().find(layer, "bias_bwd");
    REQUIRE(m);
    std::printf("DETERMINISM | bias_add | bias_bwd=%s | %zu/10 | %.1f us\n", m->variant.c_str(), distinct, us);
    INFO(layer << ": " << distinct << " distinct of 10");
    // The manifest names the guarantee each variant gives (engine/manifest.h): ditto's CUB
    // block reductions on a shape-only grid are gpu_to_gpu, cuDNN's run_to_run.
    CHECK(m->guarantee == (layer == "b_atomic" ? Guarantee::NotGuaranteed
                           : layer == "b_det"  ? Guarantee::GpuToGpu
                                               : Guarantee::RunToRun));
    if (layer == "b_atomic") {
      CHECK(m->deterministic == Determinism::No);
      CHECK(distinct > 1);
    } else {
      // deterministic: fixed partials and trees. cudnn: cuDNN documents its routines as
      // bit-reproducible on one architecture except a listed few (this one is not listed).
      CHECK(m->deterministic == Determinism::Yes);
      CHECK(distinct == 1);
    }
    if (layer == "b_det") CHECK(m->workspace_bytes > 0);
  }
  // The deterministic variant on a 2-D shape with many rows as well.
  Tensor dy2 = ctx.from_host(test::random_vec(8192 * 64, seed + 3), {8192, 64});
  Var b2(ctx.zeros({64}), true);
  auto step2 = [&] {
    b2.zero_grad();
    ctx.tape().backward(ctx, bias_add(ctx, "b_det", op::linear, Var(ctx.zeros({8192, 64})), b2), dy2);
    return b2.grad();
  };
  CHECK(test::distinct_results(10, step2) == 1);
}

TEST_CASE("gpu bias: the deterministic db in one launch (arrival counters) and in two give the same bits") {
  // With one image, channel ch's elements and their map onto threads depend on the spatial size
  // alone: the first 65536 channels of a 65537-channel dy (past the arrival counters: two launches)
  // are a 65536-channel dy (one launch). Repeated calls also show every counter was reset.
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0), Policy::parse({"*.bias_bwd=deterministic"}));
  const int64_t s = 300, wide = 65537, narrow = 65536;
  auto dyv = test::random_vec(std::size_t(wide * s), seed);
  auto db_of = [&](int64_t c) {
    std::vector<float> part(dyv.begin(), dyv.begin() + c * s);
    Var b(ctx.zeros({c}), true);
    ctx.tape().backward(ctx, bias_add(ctx, "b", op::conv2d, Var(ctx.zeros({1, c, 10, 30})), b),
                        ctx.from_host(part, {1, c, 10, 30}));
    return b.grad().to_host_f32();
  };
  const std::vector<float> two = db_of(wide), one = db_of(narrow);
  CHECK(std::vector<float>(two.begin(), two.begin() + narrow) == one);
  CHECK(db_of(narrow) == one);
  CHECK(db_of(narrow) == one);
}
