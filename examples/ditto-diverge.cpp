// ditto-diverge: the first op at which two runs of one configuration part, and how the
// difference grows from there. See experiments/diverge.h.
//   ditto-diverge run --model smallcnn --dataset cifar10 --data DIR --steps 300 --pin conv2.bwd_filter=algo0
//   ditto-diverge record --steps 50 ... --trace h100.trace      (one run's trace, for another machine)
//   ditto-diverge compare h100.trace h200.trace
#include <chrono>
#include <cstdio>

#include "ditto/experiments.h"
#include "experiments/cli.h"

int main(int argc, char** argv) {
  CLI::App app{"ditto-diverge: find the first op whose output differs between two runs"};
  app.require_subcommand(1);
  ditto::TrainConfig cfg;
  cfg.device = "auto";
  cfg.kernels = "deterministic";
  cfg.max_steps = 300;
  cfg.epochs = 1000;  // --steps bounds the run
  ditto::TrainFlags flags;
  ditto::DivergeOptions opts;
  std::string out = "runs/diverge", trace;
  bool measure_overhead = false;
  const unsigned groups = ditto::kFlagsData | ditto::kFlagsOptim | ditto::kFlagsRun | ditto::kFlagsKernels |
                          ditto::kFlagsPins | ditto::kFlagsSeeds | ditto::kFlagsDataParallel |
                          ditto::kFlagsGpusFlag;

  auto* run = app.add_subcommand("run", "train twice in lockstep (two contexts on one device) and compare every op");
  ditto::add_train_flags(*run, cfg, flags, groups);
  run->add_option("--eval-every", opts.eval_every, "compare test predictions every K steps (0: never)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  run->add_option("--trace-a", opts.trace_a, "write run A's trace here");
  run->add_option("--trace-b", opts.trace_b, "write run B's trace here");
  run->add_flag("--measure-overhead", measure_overhead,
                "also train once untraced: report its ms/step and check it ends with run A's weights");
  run->add_option("--out", out, "diverge.json, growth.csv and the two run folders")->capture_default_str();
  run->add_flag("--overwrite", cfg.overwrite, "replace the run folders an earlier ditto-diverge run left in --out");

  auto* record = app.add_subcommand("record", "train once and write the trace (to compare machines or builds)");
  ditto::TrainConfig rec_cfg = cfg;
  ditto::TrainFlags rec_flags;
  ditto::add_train_flags(*record, rec_cfg, rec_flags, groups);
  record->add_option("--trace", trace, "trace file to write")->required();

  std::string path_a, path_b;
  auto* compare = app.add_subcommand("compare", "compare two trace files");
  compare->add_option("trace_a", path_a)->required()->check(CLI::ExistingFile);
  compare->add_option("trace_b", path_b)->required()->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);

  try {
    if (*compare) {
      auto c = ditto::compare_trace_files(path_a, path_b);
      std::printf("%s", ditto::format_comparison(c).c_str());
      return c.first.found || c.first.structure_mismatch ? 1 : 0;
    }
    if (*record) {
      ditto::apply_train_flags(rec_cfg, rec_flags, argc, argv);
      if (!rec_cfg.seed_init) rec_cfg.deterministic_init = true;
      if (!rec_cfg.seed_order && !rec_cfg.seed_augment) rec_cfg.deterministic_input = true;
      rec_cfg.progress = false;
      auto r = ditto::record_trace(rec_cfg, trace);
      std::printf("wrote %s: %lld steps, final weights fingerprint %s\n", trace.c_str(), (long long)r.steps,
                  ditto::hex64(r.weights_fingerprint).c_str());
      return 0;
    }
    ditto::apply_train_flags(cfg, flags, argc, argv);
    cfg.out = out;
    std::printf("ditto-diverge: %s on %s (%s), kernels %s%s, %lld steps\n", cfg.model.c_str(), cfg.dataset.c_str(),
                cfg.device.c_str(), cfg.kernels.c_str(), cfg.pins.empty() ? "" : " + pins", (long long)cfg.max_steps);
    std::fflush(stdout);
    auto r = ditto::diverge(cfg, opts);
    std::printf("%s", ditto::format_divergence(r).c_str());
    ditto::write_divergence(r, out);
    if (measure_overhead) {
      ditto::TrainConfig plain = cfg;
      if (!plain.seed_init) plain.deterministic_init = true;
      if (!plain.seed_order && !plain.seed_augment) plain.deterministic_input = true;
      plain.progress = false;
      plain.out = out + "/untraced";
      auto u = ditto::train(plain);
      const double ms = 1000.0 * u.train_seconds / std::max<int64_t>(1, u.steps);
      std::printf("untraced: %.2f ms/step alone on the device; traced lockstep: %.2f ms/step (x%.1f)\n", ms,
                  r.traced_ms_per_step, r.traced_ms_per_step / ms);
      std::printf("untraced final weights %s run A's (%s vs %s)\n",
                  u.weights_fingerprint == r.run_a.weights_fingerprint ? "equal" : "DIFFER from",
                  ditto::hex64(u.weights_fingerprint).c_str(), ditto::hex64(r.run_a.weights_fingerprint).c_str());
    }
    std::printf("wrote %s/diverge.json and growth.csv\n", out.c_str());
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-diverge: %s\n", e.what());
    return 2;
  }
}
