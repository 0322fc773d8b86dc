// Loss scaling on CUDA (engine/loss_scale.h): the device's schedule, overflow check, unscaling and
// skipped updates give the CPU's answers (tests/loss_scale_support.h runs the same checks on both);
// a graphed run with dynamic scaling through overflowing steps is bit-identical to the eager one
// (weights and the per-step record); a fixed power-of-two scale trains bit-identically to no
// scaling with deterministic kernels.
#include <catch2/catch.hpp>

#include <cstdio>

#include "engine/loss_scale.h"
#include "experiments/train.h"
#include "loss_scale_support.h"
#include "train_support.h"

using namespace ditto;
using namespace ditto::test;

namespace {
// 2^127: once an (unscaled) gradient reaches 2, the scaled one overflows.
const std::string kHuge = "dynamic:170141183460469231731687303715884105728:2:0.5:2000";

// 1000 = 7 full batches of 128 + one of 104: two graphs per run, as tests/gpu_graph.cpp.
TrainConfig config(const std::string& loss_scale) {
  TrainConfig c = synthetic_config("smallcnn", 1000, 256, 32, 128, "cuda");
  c.deterministic_init = c.deterministic_input = true;
  c.kernels = "deterministic";
  c.epochs = 2;
  c.loss_scale = loss_scale;
  return c;
}

std::string flags_of(const TrainResult& r) {
  std::string s;
  for (const LossScaleStep& x : r.loss_scale) s += x.overflow ? '1' : '0';
  return s;
}
}  // namespace

TEST_CASE("gpu loss scale: the device's schedule, overflow check and unscaling are the CPU's") {
  check_schedule(Device::cuda(0));
  check_overflow_detection(Device::cuda(0));
}

TEST_CASE("gpu loss scale: a skipped update changes nothing, and skipping equals never stepping (SGD, Adam)") {
  // Adam's bias corrections on the device (a double division from the host's table) must give
  // the host's step_scalars bits, or the runs with and without the skipped step part.
  check_skip_equals_never_stepping(Device::cuda(0));
}

TEST_CASE("gpu loss scale: graphed == eager with dynamic scaling through overflowing steps") {
  TrainConfig c = config(kHuge);
  c.optimizer = "sgd";
  c.lr = 10.0f;  // drives a gradient past 2 within the run, so steps overflow and are skipped
  const TrainResult eager = train(c);
  c.graph = true;
  const TrainResult graphed = train(c);
  std::printf("LOSS_SCALE overflow flags eager %s graphed %s; fingerprint %s\n", flags_of(eager).c_str(),
              flags_of(graphed).c_str(), graphed.weights_fingerprint.hex().c_str());
  REQUIRE(eager.loss_scale.size() == static_cast<std::size_t>(eager.steps));
  CHECK(flags_of(eager).find('1') != std::string::npos);
  CHECK(graphed.weights_fingerprint == eager.weights_fingerprint);
  REQUIRE(graphed.loss_scale.size() == eager.loss_scale.size());
  for (std::size_t i = 0; i < eager.loss_scale.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(graphed.loss_scale[i].scale == eager.loss_scale[i].scale);
    CHECK(graphed.loss_scale[i].overflow == eager.loss_scale[i].overflow);
    if (i + 1 < eager.loss_scale.size())
      CHECK(eager.loss_scale[i + 1].scale ==
            (eager.loss_scale[i].overflow ? eager.loss_scale[i].scale / 2 : eager.loss_scale[i].scale));
  }
}

TEST_CASE("gpu loss scale: graphed == eager with Adam under dynamic scaling, and the default schedule") {
  TrainConfig c = config("dynamic");
  c.lr = 0.5f;  // Adam diverges: overflowing steps from the second on
  const TrainResult eager = train(c);
  c.graph = true;
  const TrainResult graphed = train(c);
  std::printf("LOSS_SCALE adam flags %s\n", flags_of(eager).c_str());
  CHECK(graphed.weights_fingerprint == eager.weights_fingerprint);
  CHECK(flags_of(graphed) == flags_of(eager));
  CHECK(eager.loss_scale.front().scale == 65536.0f);
}

TEST_CASE("gpu loss scale: a fixed power-of-two scale trains bit-identically to no scaling") {
  // Multiplying by 1024 commutes with every float rounding (barring overflow and subnormals), so
  // the deterministic kernels compute 1024 times the unscaled gradients, and unscaling is exact.
  for (const char* opt : {"sgd", "adam"}) {
    INFO(opt);
    TrainConfig off = config("off");
    off.optimizer = opt;
    off.lr = std::string(opt) == "sgd" ? 0.05f : 2e-3f;
    TrainConfig fixed = off;
    fixed.loss_scale = "1024";
    const TrainResult a = train(off), b = train(fixed);
    CHECK(flags_of(b).find('1') == std::string::npos);
    CHECK(b.weights_fingerprint == a.weights_fingerprint);
  }
}
