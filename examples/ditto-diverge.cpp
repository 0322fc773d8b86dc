// ditto-diverge: the first op at which two runs of one configuration part, and how the
// difference grows from there. See experiments/diverge.h.
//   ditto-diverge run --model smallcnn --dataset cifar10 --data DIR --steps 300 --pin conv2.bwd_filter=algo0
//   ditto-diverge record --steps 50 ... --trace h100.trace      (one run's trace, for another machine)
//   ditto-diverge compare h100.trace h200.trace
//   ditto-diverge kernels runs/h100 runs/h200                   (which layer chose another kernel)
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "ditto/experiments.h"
#include "experiments/diverge_cli.h"

namespace {

// ditto-diverge record: one run's trace.
void record_trace_file(ditto::DivergeArgs& a, int argc, char** argv) {
  ditto::apply_train_flags(a.rec_cfg, a.rec_flags, argc, argv);
  ditto::fix_seeds(a.rec_cfg);
  auto r = ditto::record_trace(a.rec_cfg, a.trace, {}, a.overwrite_trace);
  std::printf("wrote %s: %lld steps, final weights fingerprint %s\n", a.trace.c_str(), (long long)r.steps,
              r.weights_fingerprint.hex().c_str());
}

// --measure-overhead: the configuration trained once untraced, its time per step against the
// traced lockstep's, and whether it ends with run A's weights.
void measure_overhead(const ditto::DivergeArgs& a, const ditto::DivergeResult& r) {
  ditto::TrainConfig plain = a.cfg;
  ditto::fix_seeds(plain);
  plain.out = a.out + "/untraced";
  auto u = ditto::train(plain);
  const double ms = 1000.0 * u.train_seconds / std::max<int64_t>(1, u.steps);
  std::printf("untraced: %.2f ms/step alone on the device; traced lockstep: %.2f ms/step (x%.1f)\n", ms,
              r.traced_ms_per_step, r.traced_ms_per_step / ms);
  const bool equal = u.weights_fingerprint == r.run_a.weights_fingerprint;
  std::printf("untraced final weights %s run A's (%s vs %s)%s\n", equal ? "equal" : "differ from",
              u.weights_fingerprint.hex().c_str(), r.run_a.weights_fingerprint.hex().c_str(),
              equal || !r.first.found ? ""
                                      : "; expected, since runs A and B parted too: these kernels are not "
                                        "deterministic");
}

// ditto-diverge run: two runs in lockstep, compared op by op.
void diverge_twice(ditto::DivergeArgs& a, int argc, char** argv) {
  ditto::TrainConfig& cfg = a.cfg;
  ditto::apply_train_flags(cfg, a.flags, argc, argv);
  cfg.out = a.out;
  std::printf("ditto-diverge: %s on %s (%s), kernels %s%s, %lld steps\n", cfg.model.c_str(), cfg.dataset.c_str(),
              cfg.device.c_str(), cfg.kernels.c_str(), cfg.pins.empty() ? "" : " + pins", (long long)cfg.max_steps);
  std::fflush(stdout);
  auto r = ditto::diverge(cfg, a.opts);
  std::printf("%s", ditto::format_divergence(r).c_str());
  ditto::write_divergence(r, a.out);
  if (a.measure_overhead) measure_overhead(a, r);
  std::printf("wrote %s/diverge.json and growth.csv%s\n", a.out.c_str(),
              a.opts.layer_growth ? ", layer_growth.csv and layer_growth_{activations,weights}.svg" : "");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ditto-diverge: find the first op whose output differs between two runs"};
  app.require_subcommand(1);
  ditto::DivergeArgs a;
  ditto::add_diverge_subcommands(app, a);
  CLI11_PARSE(app, argc, argv);

  try {
    if (*a.compare) {
      auto c = ditto::compare_trace_files(a.path_a, a.path_b);
      std::printf("%s", ditto::format_comparison(c).c_str());
      return c.first.found || c.first.structure_mismatch ? 1 : 0;
    }
    if (*a.kernels) {
      const ditto::KernelChoices c = ditto::compare_kernel_choices(a.path_a, a.path_b);
      std::printf("%s", ditto::format_kernel_choices(c).c_str());
      return c.differ() ? 1 : 0;
    }
    if (*a.record)
      record_trace_file(a, argc, argv);
    else
      diverge_twice(a, argc, argv);
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-diverge: %s\n", e.what());
    return 2;
  }
}
