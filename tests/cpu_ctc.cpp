// CTC loss on the CPU: the reference's gradient with respect to the logits against central
// differences in double (repeated labels, an empty label, sequences shorter than the batch's T),
// hand-computed costs (uniform logits, where p is a count of paths), infeasible samples (+inf, zero
// gradient), the CPU op against the reference and the upstream gradient's scaling, DataErrors for
// bad labels and lengths, shape errors, knobs and the manifest.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/ctc.h"
#include "kernels/ctc_ref.h"
#include "support.h"

using namespace ditto;

namespace {

ref::CtcDims dims(int64_t t, int64_t n, int64_t a, int64_t s) {
  ref::CtcDims d;
  d.t = t, d.n = n, d.a = a, d.s = s;
  return d;
}

}  // namespace

TEST_CASE("ctc reference: gradient with respect to the logits against central differences in double") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const auto d = dims(9, 4, 5, 4);
  // Sample 0: repeats (needs a blank between); 1: a full-length label; 2: empty; 3: short input.
  const std::vector<int32_t> labels = {2, 2, 3, 0,  //
                                       1, 4, 2, 3,  //
                                       0, 0, 0, 0,  //
                                       3, 1, 0, 0};
  const std::vector<int32_t> llen = {3, 4, 0, 2}, ilen = {9, 9, 7, 5};
  auto x = test::random_vec<double>(std::size_t(d.t * d.n * d.a), seed, -2.0, 2.0);
  auto w = test::loss_weights(std::size_t(d.n), seed);
  std::vector<double> cost(d.n), grad(x.size());
  ref::ctc_loss(x.data(), labels.data(), llen.data(), ilen.data(), d, cost.data(), grad.data());
  for (double c : cost) CHECK(std::isfinite(c));
  std::vector<double> analytic(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) analytic[i] = w[(i / d.a) % d.n] * grad[i];
  auto loss = [&](const std::vector<double>& in) {
    std::vector<double> c(d.n);
    ref::ctc_loss(in.data(), labels.data(), llen.data(), ilen.data(), d, c.data(), static_cast<double*>(nullptr));
    return test::weighted_sum(c, w);
  };
  CHECK(test::gradcheck(loss, x, analytic) < 1e-6);
  // Rows past a sample's input length carry no gradient.
  for (int64_t t = 5; t < d.t; ++t)
    for (int64_t a = 0; a < d.a; ++a) CHECK(grad[(t * d.n + 3) * d.a + a] == 0.0);
}

TEST_CASE("ctc reference: costs of uniform logits count the alignments; infeasible samples") {
  // Uniform logits: every frame gives each of A classes probability 1/A, so p = paths / A^T.
  const auto d = dims(3, 4, 3, 2);
  std::vector<double> x(std::size_t(d.t * d.n * d.a), 0.0);
  const std::vector<int32_t> labels = {1, 0,  // "1" in 3 frames
                                       1, 1,  // "11" in 3 frames: only 1 _ 1
                                       1, 2,  // "12" in 3 frames
                                       1, 1};  // "11" in 2 frames: infeasible
  const std::vector<int32_t> llen = {1, 2, 2, 2}, ilen = {3, 3, 3, 2};
  std::vector<double> cost(d.n), grad(x.size());
  ref::ctc_loss(x.data(), labels.data(), llen.data(), ilen.data(), d, cost.data(), grad.data());
  // "1" in 3 frames: 1__, _1_, __1, 11_, _11, 111 = 6 paths.
  CHECK(cost[0] == Approx(std::log(27.0 / 6.0)).epsilon(1e-12));
  CHECK(cost[1] == Approx(std::log(27.0)).epsilon(1e-12));
  // "12" in 3 frames: 12_, 1_2, _12, 112, 122 = 5 paths.
  CHECK(cost[2] == Approx(std::log(27.0 / 5.0)).epsilon(1e-12));
  CHECK(std::isinf(cost[3]));
  CHECK(cost[3] > 0);
  for (int64_t t = 0; t < d.t; ++t)
    for (int64_t a = 0; a < d.a; ++a) CHECK(grad[(t * d.n + 3) * d.a + a] == 0.0);
  // Sample 1's only path is 1 _ 1: gradient = softmax - one-hot of the path: (1/3 - [a == path]).
  const int32_t path[3] = {1, 0, 1};
  for (int64_t t = 0; t < d.t; ++t)
    for (int64_t a = 0; a < d.a; ++a)
      CHECK(grad[(t * d.n + 1) * d.a + a] == Approx(1.0 / 3 - (a == path[t] ? 1.0 : 0.0)).margin(1e-12));
}

TEST_CASE("ctc loss on the CPU: the op against the reference, and backward scales by the upstream gradient") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const auto d = dims(20, 6, 7, 5);
  std::mt19937_64 g(seed);
  std::vector<int32_t> labels(d.n * d.s), llen(d.n), ilen(d.n);
  for (int64_t n = 0; n < d.n; ++n) {
    llen[n] = int32_t(g() % (d.s + 1));
    ilen[n] = int32_t(12 + g() % 9);
    for (int64_t i = 0; i < d.s; ++i) labels[n * d.s + i] = int32_t(1 + g() % (d.a - 1));
  }
  auto xv = test::random_vec(std::size_t(d.t * d.n * d.a), seed + 1, -3, 3);
  auto up = test::random_vec(std::size_t(d.n), seed + 2);
  Var x(ctx.from_host(xv, {d.t, d.n, d.a}), true);
  Var cost = ctc_loss(ctx, "ctc", x, ctx.from_host(labels, {d.n, d.s}), ctx.from_host(llen, {d.n}),
                      ctx.from_host(ilen, {d.n}));
  CHECK(cost.shape() == Shape{d.n});
  ctx.tape().backward(ctx, cost, ctx.from_host(up, {d.n}));
  std::vector<float> cref(d.n), gref(xv.size());
  ref::ctc_loss(xv.data(), labels.data(), llen.data(), ilen.data(), d, cref.data(), gref.data());
  CHECK(cost.value().to_host_f32() == cref);
  auto got = x.grad().to_host_f32();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == up[(i / d.a) % d.n] * gref[i]);
}

TEST_CASE("ctc loss: bad labels and lengths are DataErrors naming the sample; shapes are checked") {
  Context ctx;
  using Catch::Matchers::Contains;
  Var x(ctx.zeros({6, 2, 4}), true);
  auto lab = [&](std::vector<int32_t> v) { return ctx.from_host(v, {2, 3}); };
  auto len = [&](std::vector<int32_t> v) { return ctx.from_host(v, {2}); };
  CHECK_NOTHROW(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 2, 1}), len({3, 3}), len({6, 6})));
  CHECK_THROWS_WITH(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 4, 1}), len({3, 3}), len({6, 6})),
                    Contains("ctc_loss (layer 'ctc')") && Contains("sample 1") && Contains("[1, 4)"));
  CHECK_THROWS_AS(ctc_loss(ctx, "ctc", x, lab({0, 2, 3, 3, 2, 1}), len({3, 3}), len({6, 6})), DataError);  // blank
  CHECK_THROWS_AS(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 2, 1}), len({4, 3}), len({6, 6})), DataError);
  CHECK_THROWS_AS(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 2, 1}), len({3, 3}), len({7, 6})), DataError);
  CHECK_THROWS_AS(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 2, 1}), len({3, 3}), len({0, 6})), DataError);
  // A label beyond the label length is not read.
  CHECK_NOTHROW(ctc_loss(ctx, "ctc", x, lab({1, 2, 9, 3, 2, 1}), len({2, 3}), len({6, 6})));
  CHECK_THROWS_WITH(ctc_loss(ctx, "ctc", x, ctx.from_host(std::vector<int32_t>{1, 2, 3}, {3}), len({1, 1}), len({6, 6})),
                    Contains("{N, S}"));
  CHECK_THROWS_WITH(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 2, 1}), ctx.from_host(std::vector<int32_t>{3, 3, 3}, {3}),
                             len({6, 6})),
                    Contains("label_lengths"));
  CHECK_THROWS_AS(ctc_loss(ctx, "ctc", x, lab({1, 2, 3, 3, 2, 1}), ctx.zeros({2}), len({6, 6})), ShapeError);
  CHECK_THROWS_WITH(ctc_loss(ctx, "ctc", Var(ctx.zeros({6, 2, 1})), lab({1, 2, 3, 3, 2, 1}), len({3, 3}), len({6, 6})),
                    Contains("blank"));
}

TEST_CASE("ctc loss: knobs, mode words and the manifest") {
  Policy p;
  CHECK(p.variant<CtcAlgo>("ctc", op::ctc_loss) == CtcAlgo::CudnnNondeterministic);  // PyTorch's cuDNN path
  CHECK(Policy::parse({"*=deterministic"}).variant<CtcAlgo>("ctc", op::ctc_loss) == CtcAlgo::Ditto);
  CHECK(Policy::parse({"*=nondeterministic"}).variant<CtcAlgo>("ctc", op::ctc_loss) == CtcAlgo::CudnnNondeterministic);
  p.pin("ctc", CtcAlgo::CudnnDeterministic);
  CHECK(p.variant<CtcAlgo>("ctc", op::ctc_loss) == CtcAlgo::CudnnDeterministic);
  CHECK(p.requested("ctc", "algo", op::ctc_loss) == "pinned");
  CHECK_THROWS_AS(Policy::parse({"ctc.algo=atomic"}), PolicyError);
  CHECK(std::string(op_kind_name(op::ctc_loss)) == "ctc_loss");

  Context ctx(Device::cpu(), p);
  Var x(ctx.from_host(test::random_vec(5 * 2 * 3, 9), {5, 2, 3}), false);
  ctc_loss(ctx, "ctc", x, ctx.from_host(std::vector<int32_t>{1, 2, 2, 1}, {2, 2}),
           ctx.from_host(std::vector<int32_t>{2, 2}, {2}), ctx.from_host(std::vector<int32_t>{5, 4}, {2}));
  const ManifestEntry* e = ctx.manifest().find("ctc", "algo");
  REQUIRE(e != nullptr);
  CHECK(e->op == "ctc_loss");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "pinned");
  CHECK(ctx.tape().size() == 0);  // nothing requires grad
}
