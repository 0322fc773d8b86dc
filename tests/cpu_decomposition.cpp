// Additive or interacting (experiments/decomposition.h): the decomposition's arithmetic against
// values computed by hand, the paired bootstrap (identical settings give a zero-width interval
// for every contrast), the verdicts, and errors.
#include <catch2/catch.hpp>

#include "engine/error.h"
#include "experiments/decomposition.h"

using namespace ditto;
using Catch::Matchers::Contains;

namespace {

using Predictions = std::vector<std::vector<int32_t>>;

// Four examples. Per example, the fraction of replica pairs that disagree:
//   ALGO+IMPL (2 replicas)  1, 1, 0, 1        churn 3/4
//   ALGO      (3 replicas)  2/3, 0, 0, 2/3    churn 1/3 (pairs (0,0,1): 2 of 3 differ)
//   IMPL      (2 replicas)  0, 0, 1, 0        churn 1/4
//   CONTROL   (2 replicas)  0, 0, 0, 0        churn 0
const Predictions kAlgoImpl = {{0, 1, 2, 3}, {1, 2, 2, 0}};
const Predictions kAlgo = {{0, 0, 0, 0}, {0, 0, 0, 1}, {1, 0, 0, 1}};
const Predictions kImpl = {{0, 1, 2, 3}, {0, 1, 0, 3}};
const Predictions kControl = {{5, 5, 5, 5}, {5, 5, 5, 5}};

}  // namespace

TEST_CASE("decompose_churn: the terms and contrasts by hand", "[decomposition]") {
  const NoiseDecomposition d = decompose_churn(kAlgoImpl, kAlgo, kImpl, kControl, 0, 1);
  CHECK(d.measure == "churn");
  CHECK(d.algo_impl.value == Approx(0.75));
  CHECK(d.algo.value == Approx(1.0 / 3.0));
  CHECK(d.impl.value == Approx(0.25));
  CHECK(d.control.value == 0.0);
  CHECK(d.excess.value == Approx(0.75 - 1.0 / 3.0));
  CHECK(d.additive.value == Approx(1.0 / 3.0 + 0.25 - 0.0));
  CHECK(d.interaction.value == Approx(0.75 - 1.0 / 3.0 - 0.25 + 0.0));  // 1/6: more than the sum
  // No resamples: every interval is its value.
  CHECK(d.interaction.low == d.interaction.value);
  CHECK(d.interaction.high == d.interaction.value);
  CHECK(d.verdict == "super-additive");  // a zero-width interval above 0

  // CONTROL enters with its sign: a CONTROL that churns raises the interaction by as much.
  const Predictions noisy_control = {{0, 1, 2, 3}, {0, 1, 2, 4}};  // churn 1/4
  const NoiseDecomposition n = decompose_churn(kAlgoImpl, kAlgo, kImpl, noisy_control, 0, 1);
  CHECK(n.control.value == Approx(0.25));
  CHECK(n.additive.value == Approx(1.0 / 3.0 + 0.25 - 0.25));
  CHECK(n.interaction.value == Approx(0.75 - 1.0 / 3.0 - 0.25 + 0.25));
}

TEST_CASE("decompose_churn: the bootstrap is paired over examples", "[decomposition]") {
  // Identical settings: every resample's contrasts cancel exactly, so a paired bootstrap gives
  // zero-width intervals where an unpaired one would not.
  const Predictions same = {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 2, 2, 3, 5, 5, 6, 0}, {1, 1, 2, 4, 4, 5, 6, 7}};
  const NoiseDecomposition d = decompose_churn(same, same, same, same, 500, 7);
  CHECK(d.interaction.value == 0.0);
  CHECK(d.interaction.low == 0.0);
  CHECK(d.interaction.high == 0.0);
  CHECK(d.excess.low == 0.0);
  CHECK(d.excess.high == 0.0);
  CHECK(d.verdict == "additive");
  CHECK(d.algo.low < d.algo.value);  // the terms themselves do vary across resamples
  CHECK(d.algo.high > d.algo.value);

  // Reproducible for a seed; every interval holds its value.
  const NoiseDecomposition a = decompose_churn(kAlgoImpl, kAlgo, kImpl, kControl, 300, 11);
  const NoiseDecomposition b = decompose_churn(kAlgoImpl, kAlgo, kImpl, kControl, 300, 11);
  CHECK(a.interaction.low == b.interaction.low);
  CHECK(a.interaction.high == b.interaction.high);
  for (const Interval& i : {a.algo_impl, a.algo, a.impl, a.control, a.excess, a.additive, a.interaction}) {
    CHECK(i.low <= i.value);
    CHECK(i.value <= i.high);
  }
  // Per example the interaction is 1-2/3-0+0, 1-0-0+0, 0-0-1+0, 1-2/3-0+0: it ranges over
  // [-1, 1], and so must any resample's mean.
  CHECK(a.interaction.low >= -1.0);
  CHECK(a.interaction.high <= 1.0);
}

TEST_CASE("decompose_accuracy_variance: the terms and contrasts by hand", "[decomposition]") {
  // Sample variances (divisor n-1): 0.90, 0.92, 0.94 -> 4e-4; 0.91, 0.93 -> 2e-4;
  // 0.92, 0.92, 0.93 -> 1/30000; 0.9, 0.9 -> 0.
  const NoiseDecomposition d =
      decompose_accuracy_variance({0.90, 0.92, 0.94}, {0.91, 0.93}, {0.92, 0.92, 0.93}, {0.9, 0.9}, 0, 3);
  CHECK(d.measure == "accuracy_variance");
  CHECK(d.algo_impl.value == Approx(4e-4));
  CHECK(d.algo.value == Approx(2e-4));
  CHECK(d.impl.value == Approx(1.0 / 30000));
  CHECK(d.control.value == 0.0);
  CHECK(d.excess.value == Approx(2e-4));
  CHECK(d.additive.value == Approx(2e-4 + 1.0 / 30000));
  CHECK(d.interaction.value == Approx(4e-4 - 2e-4 - 1.0 / 30000));

  // With resamples: over replicas, and a CONTROL whose replicas agree contributes 0 to each.
  const NoiseDecomposition r =
      decompose_accuracy_variance({0.90, 0.92, 0.94}, {0.91, 0.93}, {0.92, 0.92, 0.93}, {0.9, 0.9}, 400, 3);
  CHECK(r.control.low == 0.0);
  CHECK(r.control.high == 0.0);
  CHECK(r.algo_impl.low >= 0.0);
  // The widest resample of 0.90, 0.92, 0.94 is {0.90, 0.90, 0.94} (or its mirror): variance 1.6e-3 / 3.
  CHECK(r.algo_impl.high <= 1.6e-3 / 3 + 1e-12);
  CHECK(r.interaction.low <= r.interaction.value);
  CHECK(r.interaction.high >= r.interaction.value);
  CHECK(r.verdict == interaction_verdict(r.interaction));
}

TEST_CASE("interaction_verdict and errors", "[decomposition]") {
  CHECK(interaction_verdict({0.1, 0.05, 0.15}) == "super-additive");
  CHECK(interaction_verdict({-0.1, -0.15, -0.05}) == "sub-additive");
  CHECK(interaction_verdict({0.01, -0.02, 0.04}) == "additive");
  CHECK(interaction_verdict({0.0, 0.0, 0.0}) == "additive");

  CHECK_THROWS_WITH(decompose_churn(kAlgoImpl, kAlgo, {{0, 1, 2, 3}}, kControl, 0, 1),
                    Contains("IMPL has 1 replica"));
  CHECK_THROWS_WITH(decompose_churn(kAlgoImpl, kAlgo, kImpl, {{0, 1}, {0, 1}}, 0, 1),
                    Contains("CONTROL predicts 2 examples"));
  CHECK_THROWS_WITH(decompose_churn(kAlgoImpl, kAlgo, kImpl, kControl, -1, 1), Contains("negative"));
  CHECK_THROWS_WITH(decompose_accuracy_variance({0.9}, {0.9, 0.8}, {0.9, 0.8}, {0.9, 0.9}, 0, 1),
                    Contains("ALGO+IMPL has 1 replica"));
  CHECK_THROWS_WITH(decompose_accuracy_variance({0.9, 0.8}, {0.9, 0.8}, {0.9, 0.8}, {0.9, 0.9}, 10, 1, 1.5),
                    Contains("level"));
}
