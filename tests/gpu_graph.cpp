// CUDA-graph training steps (experiments/step.h): a graphed run ends with exactly the eager
// run's bits — weights, per-epoch loss and accuracy, predictions — for SmallCNN (with a final
// partial batch, which gets its own graph), SmallCNN-BN with SGD + momentum and a cosine
// schedule (per-step learning rates from the plan), and across a resume.
#include <catch2/catch.hpp>

#include <cstdio>

#include "engine/error.h"
#include "engine/tracer.h"
#include "experiments/train.h"
#include "train_support.h"

using namespace ditto;

namespace {
TrainConfig config(const std::string& model) {
  // 1000 = 7 full batches of 128 + one of 104: two graphs per run.
  TrainConfig c = test::synthetic_config(model, 1000, 256, 32, 128, "cuda");
  c.deterministic_init = c.deterministic_input = true;
  c.epochs = 3;
  return c;
}

void check_same(const TrainResult& eager, const TrainResult& graphed) {
  CHECK(graphed.weights_fingerprint == eager.weights_fingerprint);
  CHECK(graphed.predictions == eager.predictions);
  REQUIRE(graphed.log.size() == eager.log.size());
  for (std::size_t e = 0; e < eager.log.size(); ++e) {
    CHECK(graphed.log[e].loss == eager.log[e].loss);  // bitwise: the sums run in the same order
    CHECK(graphed.log[e].train_acc == eager.log[e].train_acc);
  }
}
}  // namespace

TEST_CASE("gpu graph: SmallCNN graphed == eager, bit for bit, with a partial last batch") {
  TrainConfig c = config("smallcnn");
  auto eager = train(c);
  c.graph = true;
  auto graphed = train(c);
  std::printf("GRAPH smallcnn eager %.3f s, graphed %.3f s for %lld steps; fingerprint %s\n", eager.train_seconds,
              graphed.train_seconds, (long long)graphed.steps, graphed.weights_fingerprint.hex().c_str());
  check_same(eager, graphed);
}

TEST_CASE("gpu graph: SmallCNN-BN, SGD momentum, cosine schedule, batch norm") {
  TrainConfig c = config("smallcnn-bn");
  c.optimizer = "sgd";
  c.lr = 0.05f;
  c.lr_schedule = "cosine";
  c.kernels = "deterministic";
  auto eager = train(c);
  c.graph = true;
  check_same(eager, train(c));
}

TEST_CASE("gpu graph: a graphed run resumed from its checkpoint matches an uninterrupted eager run") {
  TrainConfig c = config("smallcnn");
  auto eager = train(c);
  c.graph = true;
  c.epochs = 2;
  c.out = test::scratch("gpu_graph", "resume");
  train(c);
  c.epochs = 3;
  c.resume = c.out;
  c.out = test::scratch("gpu_graph", "resumed");
  auto resumed = train(c);
  CHECK(resumed.weights_fingerprint == eager.weights_fingerprint);
  CHECK(resumed.predictions == eager.predictions);
}

TEST_CASE("gpu graph: a tracer cannot be combined with graphs") {
  struct Null : Tracer {
    void begin_step(int64_t) override {}
    void event(const std::string&, const std::string&, const std::string&, const std::vector<TracedTensor>&,
               const std::vector<TracedTensor>&) override {}
  } tracer;
  TrainConfig c = config("smallcnn");
  c.graph = true;
  c.max_steps = 2;
  CHECK_THROWS_WITH(train(c, TrainHooks{&tracer, nullptr}), Catch::Matchers::Contains("trace without --graph"));
}
