// Batch norm on the CPU: gradient checks of the reference in double (training: x, gamma, beta;
// inference: x, gamma, beta), running-stat updates against hand-computed numbers, op values,
// shape errors, tape integration, the manifest entry and the no-grad inference path.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/batchnorm.h"
#include "kernels/batchnorm_ref.h"
#include "support.h"

using namespace ditto;

namespace {

struct BnCase {
  int64_t n = 3, c = 2, hw = 5;
  std::size_t nx() const { return std::size_t(n * c * hw); }
};

// y of the reference forward for given x, gamma, beta (training: batch statistics).
std::vector<double> bn_forward(const BnCase& k, const std::vector<double>& x, const std::vector<double>& gamma,
                               const std::vector<double>& beta, bool training, const std::vector<double>& rm,
                               const std::vector<double>& rv, double eps) {
  std::vector<double> mean(k.c), invstd(k.c), y(k.nx());
  if (training)
    ref::bn_batch_stats(x.data(), k.n, k.c, k.hw, 0.1, eps, mean.data(), invstd.data(), static_cast<double*>(nullptr),
                        static_cast<double*>(nullptr));
  else
    ref::bn_running_stats(rm.data(), rv.data(), k.c, eps, mean.data(), invstd.data());
  ref::bn_apply(x.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), y.data(), k.n, k.c, k.hw);
  return y;
}

}  // namespace

TEST_CASE("batch norm reference: gradient check in double for x, gamma, beta (training and inference)") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  const BnCase k;
  const double eps = 1e-5;
  auto x = test::random_vec<double>(k.nx(), seed);
  auto gamma = test::random_vec<double>(k.c, seed + 1, 0.5, 1.5);
  auto beta = test::random_vec<double>(k.c, seed + 2);
  std::vector<double> rm = {0.1, -0.2}, rv = {0.8, 1.3};
  auto w = test::loss_weights(k.nx(), seed);
  for (bool training : {true, false}) {
    INFO("training " << training);
    std::vector<double> mean(k.c), invstd(k.c), dx(k.nx()), dgamma(k.c), dbeta(k.c);
    if (training)
      ref::bn_batch_stats(x.data(), k.n, k.c, k.hw, 0.1, eps, mean.data(), invstd.data(),
                          static_cast<double*>(nullptr), static_cast<double*>(nullptr));
    else
      ref::bn_running_stats(rm.data(), rv.data(), k.c, eps, mean.data(), invstd.data());
    ref::bn_bwd(x.data(), w.data(), mean.data(), invstd.data(), gamma.data(), training, dx.data(), dgamma.data(),
                dbeta.data(), k.n, k.c, k.hw);
    auto loss_x = [&](const std::vector<double>& in) {
      return test::weighted_sum(bn_forward(k, in, gamma, beta, training, rm, rv, eps), w);
    };
    auto loss_g = [&](const std::vector<double>& in) {
      return test::weighted_sum(bn_forward(k, x, in, beta, training, rm, rv, eps), w);
    };
    auto loss_b = [&](const std::vector<double>& in) {
      return test::weighted_sum(bn_forward(k, x, gamma, in, training, rm, rv, eps), w);
    };
    CHECK(test::gradcheck(loss_x, x, dx) < 1e-6);
    CHECK(test::gradcheck(loss_g, gamma, dgamma) < 1e-6);
    CHECK(test::gradcheck(loss_b, beta, dbeta) < 1e-6);
  }
}

TEST_CASE("batch_norm on the CPU: training output and running statistics, hand-computed") {
  Context ctx;
  // N=2, C=2, H=1, W=2. Channel 0 holds {1,2,3,4}: mean 2.5, biased var 1.25, unbiased 5/3.
  // Channel 1 holds {10,20,30,40}: mean 25, biased var 125, unbiased 500/3.
  Var x(ctx.from_host(std::vector<float>{1, 2, 10, 20, 3, 4, 30, 40}, {2, 2, 1, 2}), true);
  Var gamma(ctx.from_host(std::vector<float>{2, 1}, {2}), true);
  Var beta(ctx.from_host(std::vector<float>{0.5f, -1}, {2}), true);
  BatchNormState st = batch_norm_state(ctx, 2);
  CHECK(st.running_mean.to_host_f32() == std::vector<float>{0, 0});
  CHECK(st.running_var.to_host_f32() == std::vector<float>{1, 1});
  const float eps = 1e-5f;
  Var y = batch_norm(ctx, "bn1", x, gamma, beta, st, true, 0.1f, eps);
  // running_mean = 0.9*0 + 0.1*mean; running_var = 0.9*1 + 0.1*unbiased var
  auto rm = st.running_mean.to_host_f32(), rv = st.running_var.to_host_f32();
  CHECK(rm[0] == Approx(0.25).epsilon(1e-6));
  CHECK(rm[1] == Approx(2.5).epsilon(1e-6));
  CHECK(rv[0] == Approx(0.9 + 0.1 * 5.0 / 3.0).epsilon(1e-6));
  CHECK(rv[1] == Approx(0.9 + 0.1 * 500.0 / 3.0).epsilon(1e-6));
  // Normalized with the BIASED variance.
  auto yv = y.value().to_host_f32();
  const double s0 = 1 / std::sqrt(1.25 + 1e-5), s1 = 1 / std::sqrt(125 + 1e-5);
  const std::vector<double> want = {(1 - 2.5) * s0 * 2 + 0.5, (2 - 2.5) * s0 * 2 + 0.5, (10 - 25) * s1 - 1,
                                    (20 - 25) * s1 - 1,       (3 - 2.5) * s0 * 2 + 0.5, (4 - 2.5) * s0 * 2 + 0.5,
                                    (30 - 25) * s1 - 1,       (40 - 25) * s1 - 1};
  // The CPU path keeps mean and invstd as float (2^-24 relative each), computes y in double and
  // rounds once more: a few units of 2^-24 relative to |y| (<= 2.7 here), hence 4e-7.
  CHECK(test::all_close(yv, want, 4e-7, 4e-7).ok);
  // A second training step moves the statistics again from the updated values.
  batch_norm(ctx, "bn1", x, gamma, beta, st, true, 0.5f, eps);
  CHECK(st.running_mean.to_host_f32()[0] == Approx(0.5 * 0.25 + 0.5 * 2.5).epsilon(1e-6));
  CHECK(st.running_var.to_host_f32()[1] == Approx(0.5 * (0.9 + 0.1 * 500.0 / 3.0) + 0.5 * 500.0 / 3.0).epsilon(1e-6));
}

TEST_CASE("batch_norm on the CPU: inference uses the running statistics and leaves them alone") {
  Context ctx;
  Var x(ctx.from_host(std::vector<float>{1, 2, 10, 20}, {1, 2, 1, 2}), false);
  Var gamma(ctx.from_host(std::vector<float>{2, 1}, {2}), false);
  Var beta(ctx.from_host(std::vector<float>{0.5f, -1}, {2}), false);
  BatchNormState st{ctx.from_host(std::vector<float>{1, 12}, {2}), ctx.from_host(std::vector<float>{4, 9}, {2})};
  NoGradGuard guard(ctx);
  Var y = batch_norm(ctx, "bn1", x, gamma, beta, st, false);
  CHECK_FALSE(y.requires_grad());
  CHECK(ctx.tape().size() == 0);
  const double s0 = 1 / std::sqrt(4 + 1e-5), s1 = 1 / std::sqrt(9 + 1e-5);
  const std::vector<double> want = {0 * s0 * 2 + 0.5, 1 * s0 * 2 + 0.5, -2 * s1 - 1, 8 * s1 - 1};
  CHECK(test::all_close(y.value().to_host_f32(), want, 4e-7, 4e-7).ok);  // as above
  CHECK(st.running_mean.to_host_f32() == std::vector<float>{1, 12});
  CHECK(st.running_var.to_host_f32() == std::vector<float>{4, 9});
  // Inference with a single value per channel is fine (no batch variance is taken).
  Var one(ctx.from_host(std::vector<float>{3, 4}, {1, 2, 1, 1}), false);
  CHECK_NOTHROW(batch_norm(ctx, "bn1", one, gamma, beta, st, false));
}

TEST_CASE("batch_norm on the CPU: gradients on the tape match the reference and accumulate") {
  uint64_t seed = test::fresh_seed();
  INFO("seed " << seed);
  Context ctx;
  const int64_t n = 4, c = 3, h = 3, w = 2, hw = h * w;
  auto xv = test::random_vec(std::size_t(n * c * hw), seed);
  auto gv = test::random_vec(std::size_t(c), seed + 1, 0.5, 1.5);
  auto bv = test::random_vec(std::size_t(c), seed + 2);
  auto dyv = test::random_vec(xv.size(), seed + 3);
  for (bool training : {true, false}) {
    INFO("training " << training);
    Var x(ctx.from_host(xv, {n, c, h, w}), true);
    Var gamma(ctx.from_host(gv, {c}), true);
    Var beta(ctx.from_host(bv, {c}), true);
    BatchNormState st = batch_norm_state(ctx, c);
    Var y = batch_norm(ctx, "bn", x, gamma, beta, st, training);
    CHECK(ctx.tape().op_names() == std::vector<std::string>{"bn:batchnorm"});
    ctx.tape().backward(ctx, y, ctx.from_host(dyv, y.shape()));
    // The same float reference run directly.
    // The op's float defaults (momentum 0.1f, eps 1e-5f), widened as the op widens them.
    const double mom = double(0.1f), eps = double(1e-5f);
    std::vector<float> mean(c), invstd(c), rm(c, 0.f), rv(c, 1.f), dx(xv.size()), dg(c), db(c);
    if (training)
      ref::bn_batch_stats(xv.data(), n, c, hw, mom, eps, mean.data(), invstd.data(), rm.data(), rv.data());
    else
      ref::bn_running_stats(rm.data(), rv.data(), c, eps, mean.data(), invstd.data());
    ref::bn_bwd(xv.data(), dyv.data(), mean.data(), invstd.data(), gv.data(), training, dx.data(), dg.data(),
                db.data(), n, c, hw);
    CHECK(x.grad().to_host_f32() == dx);
    CHECK(gamma.grad().to_host_f32() == dg);
    CHECK(beta.grad().to_host_f32() == db);
    CHECK(st.running_mean.to_host_f32() == rm);
    CHECK(st.running_var.to_host_f32() == rv);
    // A second backward pass adds.
    Var y2 = batch_norm(ctx, "bn", x, gamma, beta, st, training);
    ctx.tape().backward(ctx, y2, ctx.from_host(dyv, y.shape()));
    auto db2 = beta.grad().to_host_f32();
    for (int64_t i = 0; i < c; ++i) CHECK(db2[i] == 2 * db[i]);
  }
  // Only gamma and beta need gradients: x gets none, and the op still records.
  Var xc(ctx.from_host(xv, {n, c, h, w}), false);
  Var gamma(ctx.from_host(gv, {c}), true);
  Var beta(ctx.from_host(bv, {c}), true);
  BatchNormState st = batch_norm_state(ctx, c);
  Var y = batch_norm(ctx, "bn", xc, gamma, beta, st, true);
  ctx.tape().backward(ctx, y);
  CHECK_FALSE(xc.grad().defined());
  CHECK(beta.grad().to_host_f32() == std::vector<float>(c, float(n * hw)));
}

TEST_CASE("batch_norm: manifest records the bwd knob") {
  Context ctx;
  Var x(ctx.from_host(test::random_vec(16, 5), {2, 2, 2, 2}), true);
  Var g(ctx.full({2}, 1.f), true), b(ctx.zeros({2}), true);
  BatchNormState st = batch_norm_state(ctx, 2);
  ctx.policy().pin("bn3", BnBwd::Atomic);
  batch_norm(ctx, "bn3", x, g, b, st, true);
  const ManifestEntry* e = ctx.manifest().find("bn3", "bwd");
  REQUIRE(e != nullptr);
  CHECK(e->op == "batchnorm");
  CHECK(e->variant == "cpu-reference");
  CHECK(e->requested == "pinned");
  CHECK(e->deterministic == Determinism::Yes);
  ctx.policy().set("bn3.bwd=nondeterministic");
  CHECK(ctx.policy().variant<BnBwd>("bn3", op::batchnorm) == BnBwd::Atomic);
  batch_norm(ctx, "bn3", x, g, b, st, true);
  CHECK(ctx.manifest().find("bn3", "bwd")->requested == "nondeterministic");
}

TEST_CASE("batch_norm: shape errors name the layer and operand") {
  Context ctx;
  Var x(ctx.zeros({2, 3, 2, 2}), false);
  Var g(ctx.full({3}, 1.f), false), b(ctx.zeros({3}), false);
  BatchNormState st = batch_norm_state(ctx, 3);
  CHECK_NOTHROW(batch_norm(ctx, "bnX", x, g, b, st, true));
  CHECK_THROWS_WITH(batch_norm(ctx, "bnX", Var(ctx.zeros({2, 3, 4})), g, b, st, true),
                    Catch::Matchers::Contains("bnX") && Catch::Matchers::Contains("4 dimensions"));
  CHECK_THROWS_WITH(batch_norm(ctx, "bnX", x, Var(ctx.full({2}, 1.f)), b, st, true),
                    Catch::Matchers::Contains("gamma") && Catch::Matchers::Contains("[3]"));
  CHECK_THROWS_WITH(batch_norm(ctx, "bnX", x, g, Var(ctx.zeros({3, 1})), st, true), Catch::Matchers::Contains("beta"));
  BatchNormState bad = batch_norm_state(ctx, 4);
  CHECK_THROWS_WITH(batch_norm(ctx, "bnX", x, g, b, bad, true), Catch::Matchers::Contains("state.running_mean"));
  BatchNormState missing;
  CHECK_THROWS_AS(batch_norm(ctx, "bnX", x, g, b, missing, false), ShapeError);
  CHECK_THROWS_WITH(batch_norm(ctx, "bnX", Var(ctx.zeros({1, 3, 1, 1})), g, b, st, true),
                    Catch::Matchers::Contains("more than one value per channel"));
  CHECK_THROWS_AS(batch_norm(ctx, "bnX", x, g, b, st, true, 0.1f, 0.0f), ShapeError);
  CHECK_THROWS_AS(batch_norm(ctx, "bnX", x, g, b, st, true, 1.5f), ShapeError);
}
