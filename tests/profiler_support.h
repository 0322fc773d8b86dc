// A few training steps of a zoo network on one fixed synthetic batch, with or without a
// profiler (engine/profiler.h) on the chosen steps: shared by cpu_profiler and gpu_profiler.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/optim.h"
#include "engine/profiler.h"
#include "engine/timer.h"
#include "experiments/step.h"
#include "experiments/train.h"
#include "nets/nets.h"

namespace ditto::test {

struct ProfiledRun {
  Fingerprint fingerprint;       // the weights after the last step
  ProfileReport report;          // the profiled steps (empty without profiling)
  std::vector<double> step_ms;   // every step's time by an IntervalTimer around it
  std::vector<bool> profiled;    // which steps were profiled
};

// `steps` SGD steps (momentum 0.9) of `model` under `policy` on a batch of `batch` 3x`size`x`size`
// images; steps from `profile_from` on (1-based; 0: none) run with a profiler attached and are
// bracketed by begin_step / end_step inside the timer's interval.
inline ProfiledRun profiled_run(const std::string& device, const std::string& model, const std::string& policy,
                                int steps, int profile_from, int64_t batch = 8, int64_t size = 16) {
  Context ctx(Device::parse(device), Policy::parse({policy}));
  std::unique_ptr<Net> net = make_net(ctx, {model, 10, 3});
  net->init(ctx, 7);
  std::vector<Param> params = net->params();
  SgdOptions so;
  so.momentum = 0.9f;
  Sgd opt(ctx, params, so);
  TrainStep step(ctx, *net, opt, false);
  std::mt19937_64 g(11);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(batch * 3 * size * size));
  for (auto& v : x) v = d(g);
  std::vector<int32_t> y(static_cast<std::size_t>(batch));
  for (auto& v : y) v = static_cast<int32_t>(g() % 10);
  Tensor images = ctx.from_host(x, {batch, 3, size, size}), labels = ctx.from_host(y, {batch});
  Tensor loss_sum = ctx.zeros({1}), correct = ctx.zeros({2}, DType::I32);

  ProfiledRun out;
  Profiler prof(ctx);
  IntervalTimer timer(ctx);
  for (int i = 1; i <= steps; ++i) {
    const bool on = profile_from > 0 && i >= profile_from;
    if (on) ctx.set_profiler(&prof);
    timer.start();
    if (on) prof.begin_step();
    step.run(images, labels, 0.01f, loss_sum, correct);
    if (on) prof.end_step();
    timer.stop();
    ctx.set_profiler(nullptr);
    out.profiled.push_back(on);
  }
  out.report = prof.report();
  out.step_ms = timer.milliseconds();
  out.fingerprint = params_fingerprint(params);
  return out;
}

inline const ProfileEntry* find_entry(const ProfileReport& r, const std::string& kind) {
  for (const auto& e : r.entries)
    if (e.kind == kind) return &e;
  return nullptr;
}

inline double entries_sum(const ProfileReport& r) {
  double s = 0;
  for (const auto& e : r.entries) s += e.ms;
  return s;
}

}  // namespace ditto::test
