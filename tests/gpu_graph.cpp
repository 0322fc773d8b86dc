// CUDA-graph training steps (experiments/step.h): a graphed run ends with exactly the eager
// run's bits — weights, per-epoch loss and accuracy, predictions — for SmallCNN (with a final
// partial batch, which gets its own graph), SmallCNN-BN with SGD + momentum and a cosine
// schedule (per-step learning rates from the plan), and across a resume. Captures also survive
// other threads creating and destroying contexts on the same GPU (replicas that share it).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <exception>
#include <thread>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/graph.h"
#include "engine/tensor_ops.h"
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

TEST_CASE("gpu graph: captures survive contexts made and destroyed on the same GPU by another thread") {
  // Context creation and destruction synchronize the device (handles allocate and free, the pool
  // is destroyed), which CUDA answers by invalidating every capture under way on it, from any
  // thread: what a replica ending beside another's first graphed step does. Here one thread
  // does nothing else while this one captures, 300 times.
  std::atomic<bool> stop{false};
  std::atomic<int> made{0};
  std::exception_ptr churn_error;
  std::thread churn([&] {
    try {
      while (!stop) {
        Context other(Device::cuda(0));
        Tensor t = other.zeros({4096});
        other.synchronize();
        ++made;
      }
    } catch (...) {
      churn_error = std::current_exception();
    }
  });
  Context ctx(Device::cuda(0));
  Tensor acc = ctx.zeros({1 << 16});
  const Tensor one = ctx.full({1 << 16}, 1.0f);
  constexpr int kCaptures = 300, kAddsPerGraph = 64;
  std::exception_ptr capture_error;
  try {
    for (int i = 0; i < kCaptures; ++i) {
      StepGraph g;
      g.capture(ctx, [&] {
        for (int k = 0; k < kAddsPerGraph; ++k) axpy_inplace(ctx, acc, 1.0f, one);
      });
      g.launch(ctx);
    }
  } catch (...) {
    capture_error = std::current_exception();
  }
  stop = true;
  churn.join();
  if (churn_error) std::rethrow_exception(churn_error);
  if (capture_error) std::rethrow_exception(capture_error);
  CHECK(made > 0);
  const auto host = acc.to_host_f32();
  CHECK(host.front() == float(kCaptures * kAddsPerGraph));
  CHECK(host.back() == float(kCaptures * kAddsPerGraph));
}
