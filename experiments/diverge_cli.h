// ditto-diverge's subcommands and flags, shared by every front end that finds where two runs part
// (examples/ditto-diverge.cpp, the Python package's ditto.diverge): one definition of run, record,
// compare and kernels. Header-only like experiments/cli.h (a program that includes it links CLI11).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "experiments/cli.h"
#include "experiments/diverge.h"

namespace ditto {

// Everything the command line sets, for each of the three subcommands.
struct DivergeArgs {
  TrainConfig cfg, rec_cfg;
  TrainFlags flags, rec_flags;
  DivergeOptions opts;
  std::string out = "runs/diverge", trace, path_a, path_b;
  bool measure_overhead = false;
  bool overwrite_trace = false;
  CLI::App *run = nullptr, *record = nullptr, *compare = nullptr, *kernels = nullptr;
};

// The subcommands and their flags (a flat table of flag definitions).
inline void add_diverge_subcommands(CLI::App& app, DivergeArgs& a) {
  a.cfg.device = "auto";
  a.cfg.kernels = "deterministic";
  a.cfg.max_steps = 300;
  a.cfg.epochs = 1000;  // --steps bounds the run
  const unsigned groups = kFlagsData | kFlagsOptim | kFlagsRun | kFlagsKernels |
                          kFlagsPins | kFlagsSeeds | kFlagsDataParallel |
                          kFlagsGpusFlag;

  auto* run = a.run = app.add_subcommand("run", "train twice in lockstep (two contexts on one device) and compare every op");
  add_train_flags(*run, a.cfg, a.flags, groups);
  run->add_option("--eval-every", a.opts.eval_every, "compare test predictions every K steps (0: never)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  run->add_option("--trace-a", a.opts.trace_a, "write run A's trace here");
  run->add_option("--trace-b", a.opts.trace_b, "write run B's trace here");
  run->add_flag("!--no-layer-growth", a.opts.layer_growth,
                "skip the per-layer weight and activation distances (layer_growth.csv, heat maps), which keep a "
                "device copy of every named layer's output each step");
  run->add_flag("--measure-overhead", a.measure_overhead,
                "also train once untraced: report its ms/step and check it ends with run A's weights");
  run->add_option("--out", a.out, "diverge.json, growth.csv and the two run folders")
      ->check(detail::output_path())->capture_default_str();
  run->add_flag("--overwrite", a.cfg.overwrite, "replace the run folders an earlier ditto-diverge run left in --out");

  auto* record = a.record = app.add_subcommand("record", "train once and write the trace (to compare machines or builds)");
  a.rec_cfg = a.cfg;
  add_train_flags(*record, a.rec_cfg, a.rec_flags, groups);
  record->add_option("--trace", a.trace, "trace file to write (refused when it exists, unless --overwrite)")
      ->check(detail::output_path())->required();
  record->add_flag("--overwrite", a.overwrite_trace, "replace the trace file when it exists");

  auto* compare = a.compare = app.add_subcommand("compare", "compare two trace files");
  compare->add_option("trace_a", a.path_a)->required()->check(CLI::ExistingFile);
  compare->add_option("trace_b", a.path_b)->required()->check(CLI::ExistingFile);

  auto* kernels = a.kernels = app.add_subcommand(
      "kernels", "compare the kernels two runs chose (their manifests): which layer ran another variant or engine");
  kernels->add_option("run_a", a.path_a, "a run folder or its manifest.json")->required()->check(CLI::ExistingPath);
  kernels->add_option("run_b", a.path_b, "a run folder or its manifest.json")->required()->check(CLI::ExistingPath);
}

// The seeds a traced run takes (a given seed, else the deterministic switch's 0), without a
// progress line: what a recorded trace or the untraced comparison must share with the traced runs.
inline void fix_seeds(TrainConfig& c) {
  if (!c.seed_init) c.deterministic_init = true;
  if (!c.seed_order && !c.seed_augment) c.deterministic_input = true;
  c.progress = false;
}

}  // namespace ditto
