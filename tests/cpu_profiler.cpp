// The per-op profiler (engine/profiler.h) on the CPU, where it times with the host's clock: a
// SmallCNN-BN step is attributed to the op kinds it ran, with the call counts the network
// implies; the kinds add up to the step; attaching a profiler changes no bits; misuse is an
// error, and graph capture with a profiler attached is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "engine/error.h"
#include "engine/graph.h"
#include "kernels/activation.h"
#include "profiler_support.h"

using namespace ditto;

TEST_CASE("cpu profiler: a SmallCNN-BN step is split into the op kinds it ran") {
  const int steps = 3;
  const test::ProfiledRun run = test::profiled_run("cpu", "smallcnn-bn", "*=deterministic", steps, 1);
  const ProfileReport& r = run.report;
  REQUIRE(r.steps == steps);

  std::map<std::string, int64_t> calls;
  for (const auto& e : r.entries) {
    calls[e.kind] += e.calls;
    CHECK(e.ms >= 0);  // the steady clock never runs backwards
  }
  // SmallCNN-BN per step: 3 convs (conv1's input needs no gradient: 2 data gradients), 3 batch
  // norms, 3 max pools + the global average pool, 4 ReLUs, 2 linears, 3 + 2 bias adds, one loss,
  // one optimizer step.
  const std::map<std::string, int64_t> want = {
      {"conv.fwd", 3},      {"conv.bwd_data", 2},  {"conv.bwd_filter", 3}, {"batchnorm.fwd", 3},
      {"batchnorm.bwd", 3}, {"pool.fwd", 4},       {"pool.bwd", 4},        {"activation.fwd", 4},
      {"activation.bwd", 4}, {"linear.fwd", 2},    {"linear.bwd", 2},      {"bias.fwd", 5},
      {"bias.bwd", 5},      {"loss.fwd", 1},       {"loss.bwd", 1},        {"optimizer", 1}};
  for (const auto& [kind, n] : want) {
    INFO(kind);
    CHECK(calls[kind] == n * steps);
    const ProfileEntry* e = test::find_entry(r, kind);
    REQUIRE(e != nullptr);
  }
  // The CPU runs one reference path per op, and says so in the variant.
  for (const auto& e : r.entries)
    if (e.kind.rfind("conv.", 0) == 0) CHECK(e.variant == "cpu-reference");
  CHECK(test::find_entry(r, "other") != nullptr);
  // SmallCNN-BN has conv biases, so bias.fwd runs; its own kernels' time is measurable work.
  CHECK(r.kind_ms(ProfileKind::ConvFwd) > 0);
  CHECK(r.kind_ms(ProfileKind::ConvBwdFilter) > 0);

  // Intervals are differences of times from each step's first mark: they add up to the total
  // up to double rounding, whatever the number of ops.
  CHECK(std::fabs(test::entries_sum(r) - r.total_ms) <= 1e-9 * r.total_ms + 1e-12);
  // The profiled span lies inside the timer's interval on the same clock.
  double timed = 0;
  for (double ms : run.step_ms) timed += ms;
  CHECK(r.total_ms <= timed);
  CHECK(r.total_ms > 0.5 * timed);  // begin/end sit right inside start/stop: almost all of it
}

TEST_CASE("cpu profiler: attaching a profiler changes no bits") {
  const auto plain = test::profiled_run("cpu", "smallcnn-bn", "*=deterministic", 3, 0);
  const auto profiled = test::profiled_run("cpu", "smallcnn-bn", "*=deterministic", 3, 2);
  CHECK(plain.report.steps == 0);
  CHECK(profiled.report.steps == 2);
  CHECK(plain.fingerprint == profiled.fingerprint);
}

TEST_CASE("cpu profiler: scopes outside a step record nothing; misuse is an error") {
  Context ctx;
  Profiler prof(ctx);
  ctx.set_profiler(&prof);
  REQUIRE(ctx.profiler() == &prof);
  relu(ctx, Var(ctx.full({4}, 1.0f)));  // attached, but no step is open
  ProfileReport r = prof.report();
  CHECK(r.steps == 0);
  CHECK(r.total_ms == 0);
  for (const auto& e : r.entries) CHECK(e.calls == 0);

  CHECK_THROWS_AS(prof.end_step(), Error);
  prof.begin_step();
  CHECK_THROWS_AS(prof.begin_step(), Error);
  CHECK_THROWS_AS(prof.report(), Error);
  relu(ctx, Var(ctx.full({4}, 1.0f)));
  prof.end_step();
  r = prof.report();
  CHECK(r.steps == 1);
  const ProfileEntry* act = test::find_entry(r, "activation.fwd");
  REQUIRE(act != nullptr);
  CHECK(act->variant == "relu");
  CHECK(act->calls == 1);
  prof.clear();
  CHECK(prof.report().steps == 0);

  Context other;
  Profiler foreign(other);
  CHECK_THROWS_WITH(ctx.set_profiler(&foreign), Catch::Contains("another context"));

  // Graph capture is refused while a profiler is attached (checked before anything else).
  StepGraph graph;
  CHECK_THROWS_WITH(graph.capture(ctx, [] {}), Catch::Contains("profiler"));

  {
    Profiler scoped(other);
    other.set_profiler(&scoped);
  }
  CHECK(other.profiler() == nullptr);  // a profiler detaches itself when it dies
}

TEST_CASE("cpu profiler: memory peak is a CUDA pool's; 0 on the CPU") {
  Context ctx;
  Tensor t = ctx.zeros({1024});
  CHECK(ctx.memory_peak() == 0);
  ctx.reset_memory_peak();
  CHECK(ctx.memory_peak() == 0);
}
