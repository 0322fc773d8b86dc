// The per-op profiler (engine/profiler.h) on the GPU: a profiled SmallCNN step computes the same
// weight bits as an unprofiled one; the breakdown names the cuDNN algorithm of each convolution
// direction and adds up to the step's event-timed total; graph capture with a profiler attached
// is refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/error.h"
#include "engine/policy.h"
#include "kernels/conv2d.h"
#include "profiler_support.h"

using namespace ditto;

namespace {
bool is_conv_algo(const std::string& knob, const std::string& name) {
  const KnobSpec* k = find_knob(op::conv2d, knob);
  return k && k->index_of(name) != KnobPick::kNone;
}
}  // namespace

TEST_CASE("gpu profiler: a profiled SmallCNN step has the unprofiled bits and a breakdown that adds up") {
  // Deterministic kernels, so equal bits mean the profiler changed nothing (with atomics the two
  // runs could differ on their own). Step 1 selects algorithms (host work, Find): profile 2..6.
  const int steps = 6, from = 2;
  const auto plain = test::profiled_run("cuda", "smallcnn", "*=deterministic", steps, 0, 128, 32);
  const auto prof = test::profiled_run("cuda", "smallcnn", "*=deterministic", steps, from, 128, 32);
  CHECK(plain.fingerprint == prof.fingerprint);

  const ProfileReport& r = prof.report;
  REQUIRE(r.steps == steps - from + 1);
  for (const char* dir : {"fwd", "bwd_data", "bwd_filter"}) {
    const std::string kind = std::string("conv.") + dir;
    INFO(kind);
    bool seen = false;
    for (const auto& e : r.entries) {
      if (e.kind != kind) continue;
      seen = true;
      CHECK(e.ms > 0);
      CHECK(e.calls > 0);
      CHECK(is_conv_algo(dir, e.variant));  // an algorithm name as policies write it
      std::printf("GPU profiler smallcnn %s %.4f ms/step over %lld calls\n", e.label().c_str(), e.ms / r.steps,
                  (long long)e.calls);
    }
    CHECK(seen);
  }

  // The intervals are differences of event times from each step's first event, so they add up
  // to the profiled total up to double rounding of ~2e3 terms (relative 1e-9 is far above it).
  CHECK(std::fabs(test::entries_sum(r) - r.total_ms) <= 1e-9 * r.total_ms + 1e-9);

  // The step's own event-timed total: an IntervalTimer pair recorded just outside begin_step /
  // end_step on the same stream. The profiler's first and last events lie inside that pair, so
  // its total can exceed the timer's only by the events' resolution (~0.5 us per
  // cudaEventElapsedTime; 2 us per step allowed). It falls short by the device time between
  // the outer and inner events of each end: no work is queued there, so only the host's delay
  // between two cudaEventRecord calls while the device is idle (microseconds; 0.2 ms + 2% per
  // step allowed for a preempted host thread on a shared machine).
  double timed = 0;
  for (std::size_t i = 0; i < prof.step_ms.size(); ++i)
    if (prof.profiled[i]) timed += prof.step_ms[i];
  const double n = double(r.steps);
  std::printf("GPU profiler smallcnn step: profiled %.4f ms, timer %.4f ms, other %.4f ms (per step)\n",
              r.total_ms / n, timed / n, r.kind_ms(ProfileKind::Other) / n);
  CHECK(r.total_ms <= timed + 0.002 * n);
  CHECK(r.total_ms >= timed - (0.2 * n + 0.02 * timed));
}

TEST_CASE("gpu profiler: graph capture with a profiler attached is refused") {
  Context ctx(Device::cuda(0), Policy::parse({"*=deterministic"}));
  std::unique_ptr<Net> net = make_net(ctx, {"smallcnn", 10, 3});
  net->init(ctx, 1);
  std::vector<Param> params = net->params();
  Sgd opt(ctx, params, SgdOptions{});
  TrainStep step(ctx, *net, opt, true);
  step.plan({0.01f, 0.01f});
  Tensor images = ctx.zeros({4, 3, 16, 16}), labels = ctx.zeros({4}, DType::I32);
  Tensor loss_sum = ctx.zeros({1}), correct = ctx.zeros({2}, DType::I32);
  Profiler prof(ctx);
  ctx.set_profiler(&prof);
  step.run(images, labels, 0.01f, loss_sum, correct);  // a graphed run's first step is eager
  CHECK_THROWS_WITH(step.run(images, labels, 0.01f, loss_sum, correct), Catch::Contains("profiler"));
}

TEST_CASE("gpu profiler: the context's memory peak follows the pool and resets") {
  Context ctx(Device::cuda(0));
  { Tensor big = ctx.zeros({1 << 22}); }  // 16 MiB, freed again
  ctx.synchronize();
  CHECK(ctx.memory_peak() >= (std::size_t(1) << 24));
  ctx.reset_memory_peak();
  CHECK(ctx.memory_peak() < (std::size_t(1) << 24));
}
