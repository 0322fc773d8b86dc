// The networks of the other task kinds on the GPU (nets/detail/tasks.h, experiments/task_scoring.h), on their
// built-in data: under deterministic kernels and fixed seeds two runs end bit-identical; a graphed
// run (targets and CTC input lengths through the graph's fixed buffers) ends with the eager run's
// bits; the first step's loss matches the CPU reference; the framework-default kernels (heuristic:
// atomic upsampling / grid-sample / scatter backward, cuDNN's CTC) train to finite losses. Prints
// "TASKS <model> ..." lines with the fingerprints and whether heuristic replicas diverged.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;

namespace {

struct Case {
  std::string model, dataset;
  float lr;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {{"unet-small", "synthetic-seg", 3e-3f},
                                      {"stn", "synthetic-rt", 2e-3f},
                                      {"ctc-cnn", "synthetic-strings", 2e-3f},
                                      {"embedding-bag", "synthetic-attrs", 1e-2f}};
  return c;
}

// 1000 examples in batches of 128: 7 full batches and one of 104, two graphs per run.
TrainConfig config(const Case& k, const std::string& device) {
  TrainConfig c = test::synthetic_config(k.model, 1000, 256, 32, 128, device);
  c.dataset = k.dataset;
  c.lr = k.lr;
  c.epochs = 2;
  c.deterministic_init = c.deterministic_input = true;
  return c;
}

}  // namespace

TEST_CASE("gpu tasks: deterministic kernels replay bit for bit; graphed == eager") {
  for (const auto& k : cases()) {
    INFO(k.model);
    TrainConfig c = config(k, "cuda");
    c.kernels = "deterministic";
    const TrainResult a = train(c), b = train(c);
    c.graph = true;
    const TrainResult g = train(c);
    std::printf("TASKS %s deterministic fingerprint %s, %s %.4f, %.2f ms/step eager, %.2f graphed\n", k.model.c_str(),
                a.weights_fingerprint.hex().c_str(), k.dataset.c_str(), a.test_top1,
                1000.0 * a.train_seconds / a.steps, 1000.0 * g.train_seconds / g.steps);
    CHECK(a.weights_fingerprint == b.weights_fingerprint);
    CHECK(a.predictions == b.predictions);
    CHECK(g.weights_fingerprint == a.weights_fingerprint);
    CHECK(g.predictions == a.predictions);
    REQUIRE(g.log.size() == a.log.size());
    for (std::size_t e = 0; e < a.log.size(); ++e) CHECK(g.log[e].loss == a.log[e].loss);
    CHECK(a.log.back().loss < a.log.front().loss);
  }
}

TEST_CASE("gpu tasks: the first step's loss matches the CPU reference") {
  for (const auto& k : cases()) {
    INFO(k.model);
    TrainConfig c = config(k, "cuda");
    c.kernels = "deterministic";
    c.max_steps = 1;
    const double gpu = train(c).log.at(0).loss;
    c.device = "cpu";
    const double cpu = train(c).log.at(0).loss;
    // One forward pass in float32 (cuDNN convolutions with FMA, float reductions) against the
    // double-accumulating CPU reference: agreement to about 1e-5 relative is expected; 1e-4
    // leaves room for the longest sums (the pixel loss over 128 x 784 pixels).
    CHECK(gpu == Approx(cpu).epsilon(1e-4));
  }
}

TEST_CASE("gpu tasks: the framework-default kernels train; do their replicas part?") {
  for (const auto& k : cases()) {
    if (k.model == "ctc-cnn") continue;  // its own case below: cuDNN's CTC
    INFO(k.model);
    TrainConfig c = config(k, "cuda");
    c.kernels = "heuristic";
    const TrainResult a = train(c), b = train(c);
    std::printf("TASKS %s heuristic fingerprints %s %s (%s)\n", k.model.c_str(),
                a.weights_fingerprint.hex().c_str(), b.weights_fingerprint.hex().c_str(),
                a.weights_fingerprint == b.weights_fingerprint ? "equal" : "differ");
    CHECK(std::isfinite(a.log.back().loss));
    CHECK(std::isfinite(b.log.back().loss));
  }
}

TEST_CASE("gpu tasks: ctc-cnn on the framework default, cuDNN's nondeterministic CTC") {
  TrainConfig c = config(cases()[2], "cuda");
  c.kernels = "heuristic";
  const TrainResult a = train(c), b = train(c);
  std::printf("TASKS ctc-cnn heuristic fingerprints %s %s (%s)\n", a.weights_fingerprint.hex().c_str(),
              b.weights_fingerprint.hex().c_str(),
              a.weights_fingerprint == b.weights_fingerprint ? "equal" : "differ");
  bool cudnn = false;
  for (const auto& op : a.ops) cudnn = cudnn || (op.layer == "loss" && op.variant == "cudnn-nondeterministic");
  CHECK(cudnn);
  CHECK(std::isfinite(a.log.back().loss));
  CHECK(a.log.back().loss < a.log.front().loss);
}
