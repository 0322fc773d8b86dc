// Softmax cross-entropy on the GPU: both reductions against the CPU reference, the upstream
// gradient read on the device, NaN for out-of-range labels, 10-run bit-equality of the
// deterministic reduction, the atomic reduction's distinct count, the DETERMINISM lines.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>

#include "engine/context.h"
#include "kernels/loss.h"
#include "kernels/loss_ref.h"
#include "support.h"

using namespace ditto;

using test::us_per_call;

namespace {

constexpr double kU = 0x1p-24;


std::vector<int32_t> random_labels(int64_t n, int64_t c, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> v(n);
  for (auto& l : v) l = static_cast<int32_t>(g() % c);
  return v;
}

}  // namespace

TEST_CASE("gpu softmax-xent: both reductions and the backward pass against the CPU reference") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0), Policy::parse({"l_atomic.reduce=atomic", "l_det.reduce=deterministic"}));
  for (auto [n, c] : {std::pair<int64_t, int64_t>{256, 37}, {1000, 10}, {33, 100}}) {
    INFO("N " << n << " C " << c);
    auto v = test::random_vec(n * c, seed, -3, 3);
    auto labels = random_labels(n, c, seed + 1);
    const double L = ref::softmax_xent_fwd(v.data(), labels.data(), n, c);
    const float dl = 0.75f;  // upstream gradient, on the device
    std::vector<double> g(n * c);
    const std::vector<double> vd = test::to_double(v);
    ref::softmax_xent_bwd(vd.data(), labels.data(), n, c, double(dl), g.data());
    for (std::string layer : {"l_atomic", "l_det"}) {
      INFO("variant " << layer);
      Var logits(ctx.from_host(v, {n, c}), true);
      Var loss = softmax_cross_entropy(ctx, layer, logits, ctx.from_host(labels, {n}));
      ctx.tape().backward(ctx, loss, ctx.from_host(std::vector<float>{dl}, {1}));
      // Tolerances (u = 2^-24, logits in [-3, 3], expf <= 2 ulp, logf <= 1 ulp):
      //   each term exp(x - m): x - m rounds (<= 6u) and expf (<= 4u): relative <= 10u;
      //   s = sum of C positive terms: relative <= (C + 10)u; log s: absolute (C + 10)u + logf's
      //   8u (|log s| <= log C < 4.7); lse = m + log s rounds (<= 8u): lse error <= (C + 26)u;
      //   loss_i = lse - x_label rounds (<= 10u): per-example error <= (C + 36)u.
      //   The mean: N additions in any order (tree or atomics) and a division: (N + 2)u relative
      //   (the terms are >= 0, so relative to the mean).
      // So |loss - L| <= (C + 36)u + (N + 2)u L; we allow (C + 64)u for margin.
      const double got = loss.value().to_host_f32()[0];
      CHECK(std::fabs(got - L) <= (c + 64) * kU + (n + 2) * kU * L);
      //   dlogits: p = exp(x - lse): lse's (C + 26)u, the subtraction's 10u and expf's 4u give a
      //   relative error <= (C + 40)u in p <= 1; p - onehot rounds (<= u); scale dl/N and the
      //   product round twice (2u relative). atol (C + 64)u dl/N, rtol 4u, with margin.
      auto r = test::all_close(logits.grad().to_host_f32(), g, (c + 64) * kU * dl / n, 4 * kU);
      INFO(r.str());
      CHECK(r.ok);
    }
  }
}

TEST_CASE("gpu softmax-xent: an out-of-range label makes that example's loss and gradient NaN") {
  Context ctx(Device::cuda(0), Policy::parse({"l_det.reduce=deterministic"}));
  const int64_t n = 4, c = 3;
  std::vector<int32_t> labels{0, 2, 3, 1};  // example 2 is out of range
  for (std::string layer : {"l_atomic", "l_det"}) {
    Var logits(ctx.from_host(test::random_vec(n * c, 5), {n, c}), true);
    Var loss = softmax_cross_entropy(ctx, layer, logits, ctx.from_host(labels, {n}));
    ctx.tape().backward(ctx, loss);
    CHECK(std::isnan(loss.value().to_host_f32()[0]));
    auto g = logits.grad().to_host_f32();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) CHECK(std::isnan(g[i * c + j]) == (i == 2));
  }
}

TEST_CASE("gpu softmax-xent: deterministic reduction bit-equal over 10 runs; atomic reported") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx(Device::cuda(0), Policy::parse({"l_atomic.reduce=atomic", "l_det.reduce=deterministic"}));
  const int64_t n = 8192, c = 10;
  Tensor logits_t = ctx.from_host(test::random_vec(n * c, seed, -3, 3), {n, c});
  Tensor labels = ctx.from_host(random_labels(n, c, seed + 1), {n});
  for (std::string layer : {"l_atomic", "l_det"}) {
    Var logits(logits_t, true);
    auto fwd = [&] { return softmax_cross_entropy(ctx, layer, Var(logits_t), labels).value(); };
    auto bwd = [&] {
      logits.zero_grad();
      ctx.tape().backward(ctx, softmax_cross_entropy(ctx, layer, logits, labels));
      return logits.grad();
    };
    std::size_t distinct = test::distinct_results(10, fwd);
    double us = us_per_call(ctx, [&] { bwd(); });  // forward + backward per call
    const ManifestEntry* m = ctx.manifest().find(layer, "reduce");
    REQUIRE(m);
    std::printf("DETERMINISM | softmax_xent | reduce=%s | %zu/10 | %.1f us\n", m->variant.c_str(), distinct, us);
    INFO(layer << ": " << distinct << " distinct of 10");
    // dlogits is one thread per element with no reduction: bit-equal whichever reduction ran.
    CHECK(test::distinct_results(10, bwd) == 1);
    if (layer == "l_det") {
      CHECK(m->deterministic == Determinism::Yes);
      CHECK(m->workspace_bytes == sizeof(float) * n);
      CHECK(distinct == 1);
    } else {
      CHECK(m->deterministic == Determinism::No);
      // 8192 float atomicAdds of ~2.3/8192 into one address: the running sum keeps 24 bits, so
      // nearly every addition rounds, and the rounding depends on the order the 1024 blocks'
      // warps arrive in, which the hardware does not fix. Ten runs agreeing would mean the order
      // never changed.
      CHECK(distinct > 1);
    }
  }
}
