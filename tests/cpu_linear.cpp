// Linear (y = x w^T) on the CPU: gradient checks of the reference in double, op values, errors,
// the manifest, tape integration, and a linear -> bias -> dropout -> softmax-xent chain.
#include <catch2/catch.hpp>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/bias.h"
#include "kernels/bias_ref.h"
#include "kernels/dropout.h"
#include "kernels/dropout_ref.h"
#include "kernels/linear.h"
#include "kernels/linear_ref.h"
#include "kernels/loss.h"
#include "kernels/loss_ref.h"
#include "support.h"

using namespace ditto;

namespace {
std::vector<double> fwd(const std::vector<double>& x, const std::vector<double>& w, int64_t n, int64_t in, int64_t out) {
  std::vector<double> y(n * out);
  ref::linear_fwd(x.data(), w.data(), y.data(), n, in, out);
  return y;
}
}  // namespace

TEST_CASE("linear reference: gradient check in double for x and w") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 5, in = 7, out = 4;
  auto x = test::random_vec<double>(n * in, seed);
  auto w = test::random_vec<double>(out * in, seed + 1);
  auto dy = test::loss_weights(n * out, seed);
  std::vector<double> dx(n * in), dw(out * in);
  ref::linear_bwd_x(dy.data(), w.data(), dx.data(), n, in, out);
  ref::linear_bwd_w(dy.data(), x.data(), dw.data(), n, in, out);
  CHECK(test::gradcheck([&](const std::vector<double>& v) { return test::weighted_sum(fwd(v, w, n, in, out), dy); },
                        x, dx) < 1e-6);
  CHECK(test::gradcheck([&](const std::vector<double>& v) { return test::weighted_sum(fwd(x, v, n, in, out), dy); },
                        w, dw) < 1e-6);
}

TEST_CASE("linear: CPU op values") {
  Context ctx;
  // Hand-computed: rows of x times rows of w.
  Var x(ctx.from_host(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
  Var w(ctx.from_host(std::vector<float>{1, 0, -1, 0.5f, 0.5f, 0.5f}, {2, 3}));
  Var y = linear(ctx, "fc", x, w);
  CHECK(y.shape() == Shape{2, 2});
  CHECK(y.value().to_host_f32() == std::vector<float>{-2, 3, -2, 7.5f});

  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const int64_t n = 9, in = 33, out = 17;
  auto xv = test::random_vec(n * in, seed), wv = test::random_vec(out * in, seed + 1);
  Var y2 = linear(ctx, "fc", Var(ctx.from_host(xv, {n, in})), Var(ctx.from_host(wv, {out, in})));
  auto want = fwd(test::to_double(xv), test::to_double(wv), n, in, out);
  // The CPU path accumulates in double and rounds once: within half an ulp of the double result.
  auto r = test::all_close(y2.value().to_host_f32(), want, 0.0, 0x1p-24);
  INFO(r.str());
  CHECK(r.ok);
}

TEST_CASE("linear: operand errors name the layer and the shapes") {
  Context ctx;
  Var x(ctx.zeros({4, 3})), w(ctx.zeros({2, 5}));
  CHECK_THROWS_AS(linear(ctx, "fc7", x, w), ShapeError);
  CHECK_THROWS_WITH(linear(ctx, "fc7", x, w),
                    Catch::Matchers::Contains("fc7") && Catch::Matchers::Contains("[4, 3]") &&
                        Catch::Matchers::Contains("[2, 5]"));
  CHECK_THROWS_AS(linear(ctx, "fc7", Var(ctx.zeros({4, 3, 1})), Var(ctx.zeros({2, 3}))), ShapeError);
  CHECK_THROWS_AS(linear(ctx, "fc7", Var(ctx.zeros({4, 3}, DType::I32)), Var(ctx.zeros({2, 3}))), ShapeError);
  CHECK_THROWS_AS(linear(ctx, "fc7", Var(), Var(ctx.zeros({2, 3}))), Error);
}

TEST_CASE("linear: manifest records both knobs; policy errors surface at the forward call") {
  Context ctx(Device::cpu(), Policy::parse({"fc1.precision=tf32"}));
  Var x(ctx.zeros({2, 3})), w(ctx.zeros({4, 3}));
  linear(ctx, "fc1", x, w);
  const ManifestEntry* m = ctx.manifest().find("fc1", "precision");
  REQUIRE(m);
  CHECK(m->op == "linear");
  CHECK(m->variant == "reference");  // the CPU does not emulate tf32; GPU knobs do not apply
  CHECK(m->requested == "pinned");
  CHECK(m->device == "cpu");
  const ManifestEntry* a = ctx.manifest().find("fc1", "cublas_atomics");
  REQUIRE(a);
  CHECK(a->requested == "heuristic");
  const ManifestEntry* g = ctx.manifest().find("fc1", "gemm");
  REQUIRE(g);
  CHECK(g->variant == "reference");
  CHECK(g->requested == "heuristic");
  // cuBLASLt without split-K has no atomics to allow: the two pins contradict each other.
  Context both(Device::cpu(), Policy::parse({"fc1.gemm=cublaslt", "fc1.cublas_atomics=on"}));
  CHECK_THROWS_WITH(linear(both, "fc1", Var(both.zeros({2, 3})), Var(both.zeros({4, 3}))),
                    Catch::Matchers::Contains("cublas_atomics=on applies to gemm=cublas"));
  // A mode's pick of atomics yields to the pinned interface.
  Context mode(Device::cpu(), Policy::parse({"*=nondeterministic", "fc1.gemm=cublaslt"}));
  CHECK_NOTHROW(linear(mode, "fc1", Var(mode.zeros({2, 3})), Var(mode.zeros({4, 3}))));
  Context bad(Device::cpu(), Policy::parse({"fc1.bwd=gather"}));
  CHECK_THROWS_AS(linear(bad, "fc1", Var(bad.zeros({2, 3})), Var(bad.zeros({4, 3}))), PolicyError);
}

TEST_CASE("linear: tape gives dx and dw, only where required, and accumulates") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 6, in = 5, out = 3;
  auto xv = test::random_vec(n * in, seed), wv = test::random_vec(out * in, seed + 1);
  auto dyv = test::random_vec(n * out, seed + 2);
  std::vector<float> want_dx(n * in), want_dw(out * in);
  ref::linear_bwd_x(dyv.data(), wv.data(), want_dx.data(), n, in, out);
  ref::linear_bwd_w(dyv.data(), xv.data(), want_dw.data(), n, in, out);

  Var x(ctx.from_host(xv, {n, in}), true), w(ctx.from_host(wv, {out, in}), true);
  Var y = linear(ctx, "fc", x, w);
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"fc:linear"});
  ctx.tape().backward(ctx, y, ctx.from_host(dyv, {n, out}));
  CHECK(x.grad().to_host_f32() == want_dx);
  CHECK(w.grad().to_host_f32() == want_dw);
  // A second pass accumulates (exactly 2x: doubling is exact in binary floating point).
  ctx.tape().backward(ctx, linear(ctx, "fc", x, w), ctx.from_host(dyv, {n, out}));
  auto dw2 = w.grad().to_host_f32();
  for (std::size_t i = 0; i < dw2.size(); ++i) CHECK(dw2[i] == 2 * want_dw[i]);

  // Only w requires grad: x gets nothing.
  Var xc(ctx.from_host(xv, {n, in})), w2(ctx.from_host(wv, {out, in}), true);
  ctx.tape().backward(ctx, linear(ctx, "fc", xc, w2), ctx.from_host(dyv, {n, out}));
  CHECK_FALSE(xc.grad().defined());
  CHECK(w2.grad().to_host_f32() == want_dw);
  // Nothing requires grad: nothing is recorded.
  linear(ctx, "fc", xc, Var(ctx.from_host(wv, {out, in})));
  CHECK(ctx.tape().size() == 0);
}

TEST_CASE("linear -> bias -> dropout -> softmax-xent: the tape chain matches the composed references") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 8, in = 6, out = 5;
  const float p = 0.25f;
  auto xv = test::random_vec(n * in, seed), wv = test::random_vec(out * in, seed + 1);
  auto bv = test::random_vec(out, seed + 2);
  std::vector<int32_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 3 + seed) % out);

  Var x(ctx.from_host(xv, {n, in}), true), w(ctx.from_host(wv, {out, in}), true), b(ctx.from_host(bv, {out}), true);
  Var h = bias_add(ctx, "fc", op::linear, linear(ctx, "fc", x, w), b);
  Var d = dropout(ctx, "drop", h, p, 7, 3, true);
  Var loss = softmax_cross_entropy(ctx, "loss", d, ctx.from_host(labels, {n}));
  CHECK(ctx.tape().op_names() == std::vector<std::string>{"fc:linear", "fc:bias_add", "drop:dropout", "loss:softmax_xent"});
  ctx.tape().backward(ctx, loss);

  // The same chain in double from the references.
  auto X = test::to_double(xv), W = test::to_double(wv), B = test::to_double(bv);
  std::vector<double> Y(n * out), H(n * out), D(n * out), dD(n * out), dH(n * out), dX(n * in), dW(out * in), dB(out);
  ref::linear_fwd(X.data(), W.data(), Y.data(), n, in, out);
  ref::bias_fwd(Y.data(), B.data(), H.data(), n, out, 1);
  const uint64_t key = dropout_key(7, 3, "drop");
  ref::dropout_fwd(H.data(), D.data(), n * out, p, key);
  double L = ref::softmax_xent_fwd(D.data(), labels.data(), n, out);
  ref::softmax_xent_bwd(D.data(), labels.data(), n, out, 1.0, dD.data());
  ref::dropout_bwd(dD.data(), dH.data(), n * out, p, key);
  ref::bias_bwd_db(dH.data(), dB.data(), n, out, 1);
  ref::linear_bwd_x(dH.data(), W.data(), dX.data(), n, in, out);
  ref::linear_bwd_w(dH.data(), X.data(), dW.data(), n, in, out);

  // Float ops round each intermediate once (relative 2^-24) and the chain is four ops deep over
  // sums of <= 8 terms of magnitude <= ~3: errors stay below 1e-6 absolute + 1e-5 relative.
  CHECK(std::fabs(loss.value().to_host_f32()[0] - L) < 1e-5 * std::fabs(L) + 1e-6);
  for (auto [got, want] : {std::pair{x.grad(), &dX}, std::pair{w.grad(), &dW}, std::pair{b.grad(), &dB}}) {
    auto r = test::all_close(got.to_host_f32(), *want, 1e-6, 1e-5);
    INFO(r.str());
    CHECK(r.ok);
  }
}
