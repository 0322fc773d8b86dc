// Sum and mean reductions on the GPU: every `reduce` variant against the double reference for
// sizes from empty to 16M elements; the deterministic and cub variants bit-identical over 10 calls
// and the deterministic one across contexts, the atomic one shown to differ; the broadcast backward exact; the manifest;
// DETERMINISM lines with the time per call at 16M elements.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/reduction.h"
#include "kernels/reduction_ref.h"
#include "support.h"

using namespace ditto;

using test::us_per_call;

namespace {
const Reduction kVariants[] = {Reduction::Atomic, Reduction::Deterministic, Reduction::Cub};
}  // namespace

TEST_CASE("gpu reduce_sum and reduce_mean: both variants against the double reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context gpu(Device::cuda(0));
  for (int64_t n : {int64_t(1), int64_t(255), int64_t(1000), int64_t(1 << 20) + 37, int64_t(5000001)}) {
    INFO("n " << n);
    auto xv = test::random_vec(std::size_t(n), seed);
    std::vector<double> xa(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) xa[i] = std::fabs(double(xv[i]));
    const double want = ref::sum_all(xv.data(), n), abs_sum = ref::sum_all(xa.data(), n);
    // Each thread adds at most ceil(n / 256) values in order; then a block tree (8 levels) and a
    // final tree (10 levels), or, atomic, a 5-level warp tree and at most 8192 warp sums added one
    // after another. Recursive summation's bound, (depth) * 2^-24 * sum |x|, with depth at most
    // ceil(n / 256) + 8200; one more rounding for the mean's division. CUB's two passes (a
    // thread's strided run, block trees, then one block over the partials) stay inside it: each
    // element meets at most n / (threads in flight) + 2 * 10 additions.
    const double tol = (double((n + 255) / 256) + 8200) * std::ldexp(1.0, -24) * abs_sum;
    Tensor x = gpu.from_host(xv, {n});
    for (Reduction r : kVariants) {
      INFO("reduce=" << name_of(r));
      gpu.policy().pin("sum", r);
      gpu.policy().pin("mean", r);
      CHECK(std::fabs(double(reduce_sum(gpu, "sum", Var(x)).value().to_host_f32()[0]) - want) <= tol);
      const double m = double(reduce_mean(gpu, "mean", Var(x)).value().to_host_f32()[0]);
      CHECK(std::fabs(m - want / double(n)) <= tol / double(n) + std::ldexp(1.0, -24) * std::fabs(want / double(n)));
      const ManifestEntry* e = gpu.manifest().find("mean", "reduce");
      REQUIRE(e != nullptr);
      CHECK(e->op == "reduce");
      CHECK(e->variant == name_of(r));
      CHECK(e->guarantee == (r == Reduction::Deterministic ? Guarantee::GpuToGpu
                             : r == Reduction::Cub         ? Guarantee::RunToRun
                                                           : Guarantee::NotGuaranteed));
    }
  }
  Var empty(gpu.zeros({0}), false);
  for (Reduction r : kVariants) {
    gpu.policy().pin("sum", r);
    gpu.policy().pin("mean", r);
    CHECK(reduce_sum(gpu, "sum", empty).value().to_host_f32()[0] == 0.0f);
    CHECK(std::isnan(reduce_mean(gpu, "mean", empty).value().to_host_f32()[0]));
  }
}

TEST_CASE("gpu reduce: the broadcast backward is exact") {
  Context gpu(Device::cuda(0), Policy::parse({"*=deterministic"}));
  Var x(gpu.from_host(test::random_vec(3000, 9), {30, 100}), true);
  Var m = reduce_mean(gpu, "mean", x);
  gpu.tape().backward(gpu, m, gpu.from_host(std::vector<float>{0.7f}, {1}));
  for (float g : x.grad().to_host_f32()) CHECK(g == 0.7f / 3000.0f);
  x.zero_grad();
  Var s = reduce_sum(gpu, "sum", x);
  gpu.tape().backward(gpu, s, gpu.from_host(std::vector<float>{-1.5f}, {1}));
  for (float g : x.grad().to_host_f32()) CHECK(g == -1.5f);
}

TEST_CASE("gpu reduce: determinism over 10 calls, across contexts, and DETERMINISM lines at 16M elements") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = int64_t(1) << 24;
  auto xv = test::random_vec(std::size_t(n), seed);
  Context gpu(Device::cuda(0));
  Tensor x = gpu.from_host(xv, {n});
  double us[3] = {0, 0, 0};
  for (Reduction r : kVariants) {
    gpu.policy().pin("sum", r);
    auto call = [&] { return reduce_sum(gpu, "sum", Var(x)).value(); };
    std::size_t distinct = test::distinct_results(10, call);
    us[int(r)] = us_per_call(gpu, [&] { call(); });
    std::printf("DETERMINISM | reduce_sum 16777216 | reduce=%s | %zu/10 | %.1f us\n", name_of(r), distinct, us[int(r)]);
    INFO("reduce=" << name_of(r) << ": " << distinct << " distinct sums of 10");
    if (r == Reduction::Atomic)
      CHECK(distinct > 1);  // 8192 warp sums added in arrival order
    else
      CHECK(distinct == 1);
  }
  std::printf("COST | reduce_sum 16777216 | deterministic / atomic = %.2f (goal <= 1.2), cub / atomic = %.2f\n",
              us[1] / us[0], us[2] / us[0]);
  Context other(Device::cuda(0), Policy::parse({"sum.reduce=deterministic"}));
  gpu.policy().pin("sum", Reduction::Deterministic);
  CHECK(reduce_sum(other, "sum", Var(other.from_host(xv, {n}))).value().fingerprint() ==
        reduce_sum(gpu, "sum", Var(x)).value().fingerprint());
}
