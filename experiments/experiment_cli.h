// ditto-experiment's flags and protocol dispatch, shared by every front end that runs the paper's
// protocols (examples/ditto-experiment.cpp, the Python package's ditto.experiment): one definition
// of the flags, their defaults by device and the refusals, so a flag means the same everywhere.
// Header-only like experiments/cli.h (a program that includes it links CLI11).
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "experiments/cli.h"
#include "experiments/ensemble.h"
#include "experiments/report.h"

namespace ditto {

// The metric `m` of `setting` in a report, or null.
inline const ReportMetric* find_metric(const ReportData& r, const std::string& setting, const std::string& m) {
  for (const auto& x : r.metrics)
    if (x.setting == setting && x.metric == m) return &x;
  return nullptr;
}

// Everything the command line sets: the experiment's options and each protocol's own.
struct ExperimentArgs {
  EnsembleOptions o;
  TrainFlags flags;
  std::string protocol = "settings";
  int replicas = 0;  // 0: by device
  std::vector<std::string> names = {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"};
  std::vector<std::string> custom;
  FigS4Options fig;
  bool no_control = false;
  std::vector<std::string> modes = {"heuristic", "deterministic", "nondeterministic", "fastest"};
  int overhead_warmup = 20, overhead_steps = 100;  // the paper profiled 100 iterations
  bool plan = false, collect = false;  // a study on a Slurm cluster (experiments/ensemble.h)
  StudyPlanOptions slurm;
};

// The defaults ditto-experiment starts from, the training flags it honours, then its own (a flat
// table of flag definitions).
inline void add_experiment_flags(CLI::App& app, ExperimentArgs& a) {
  EnsembleOptions& o = a.o;
  o.base.dataset = "synthetic";
  o.base.model = "smallcnn";
  o.base.lr = 2e-3f;
  o.base.epochs = 5;
  o.base.device = "auto";
  o.out = "runs/experiment";
  add_train_flags(app, o.base, a.flags, kFlagsData | kFlagsOptim | kFlagsRun | kFlagsPins | kFlagsDataParallel);
  app.add_option("--protocol", a.protocol, "settings | fig-s4 | overhead")
      ->check(CLI::IsMember({"settings", "fig-s4", "overhead"}))
      ->capture_default_str();
  app.add_option("--replicas", a.replicas, "replicas per setting (default 3 on GPU, 2 on CPU)")
      ->check(detail::whole(2, 100000));
  app.add_option("--settings", a.names, "named settings: ALGO+IMPL ALGO IMPL IMPL-ATOMIC CONTROL")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--setting", a.custom,
                 "a custom setting, repeatable: \"NAME: seeds=fixed|random|init|order kernels=MODE "
                 "pin=LAYER.KNOB=VARIANT ...\" (added after --settings)");
  app.add_option("--lrs", a.fig.lrs, "fig-s4: learning rates")
      ->delimiter(',')
      ->check(detail::positive_float())
      ->capture_default_str();
  app.add_option("--fig-s4-kernels", a.fig.kernels,
                 "fig-s4: the kernels of the four {init} x {order} cells (heuristic: the framework default, so the "
                 "fixed/fixed cell shows GPU noise)")
      ->check(CLI::IsMember(mode_words()))
      ->capture_default_str();
  app.add_flag("--no-control", a.no_control, "fig-s4: leave out the CONTROL cell (deterministic kernels, nothing varies)");
  app.add_option("--unstable-examples", o.unstable_shown,
                 "least stable test examples shown per setting in report.html, with their images")
      ->check(detail::at_least(0))
      ->capture_default_str();
  app.add_option("--modes", a.modes, "overhead: kernel modes")
      ->delimiter(',')
      ->check(CLI::IsMember(mode_words()))
      ->capture_default_str();
  app.add_option("--overhead-warmup", a.overhead_warmup, "overhead: untimed steps first")
      ->check(detail::at_least(1))
      ->capture_default_str();
  app.add_option("--overhead-steps", a.overhead_steps,
                 "overhead: timed steps (the paper profiled 100; fewer for a quick look)")
      ->check(detail::at_least(1))
      ->capture_default_str();
  app.add_option("--concurrent", o.concurrent, "replicas trained at once per GPU (s/epoch is then the time under that load)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--gpus", o.gpus, "spread replicas over up to this many visible GPUs")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--tuning", o.tuning,
                 "deterministic settings without pins take each conv's algorithm from this tuning file; when it "
                 "does not exist, one epoch on the first GPU tunes and writes it before the replicas start");
  app.add_option("--bootstrap", o.bootstrap, "resamples for the 95% intervals (at least 100: each tail needs some)")
      ->check(detail::whole(100, 100000000))
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "keep the finished replicas in --out and continue the unfinished ones");
  auto* plan = app.add_flag("--plan", a.plan,
                            "settings: write the study to --out as a Slurm array job (plan.json, tasks.txt, "
                            "study.sbatch: one replica per task, its exact ditto-train command) instead of training");
  auto* collect = app.add_flag("--collect", a.collect,
                               "settings: the report from a planned study's finished run folders in --out, each "
                               "checked against the plan (give the flags it was planned with)");
  plan->excludes(collect);
  app.add_option("--slurm-gpus-per-task", a.slurm.gpus_per_task,
                 "--plan: GPUs per task (0: CPU replicas, --device cpu)")
      ->check(detail::at_least(0))
      ->capture_default_str();
  app.add_option("--slurm-partition", a.slurm.partition, "--plan: the partition to submit to (default: the cluster's)");
  app.add_flag("--slurm-dp-launch", a.slurm.dp_processes,
               "--plan: each replica's data-parallel ranks (--dp-gpus K) as K Slurm tasks of one GPU each, started by "
               "srun (ditto-train --dp-launch slurm), so a replica may span nodes");
  app.add_option("--train-binary", a.slurm.train_binary,
                 "--plan / --collect: the ditto-train the tasks run (default: the one beside ditto-experiment)");
  app.add_option("--out", o.out)->check(detail::output_path())->capture_default_str();
}

// After parsing: the training flags, the defaults that depend on the device, figure S4's fixed
// choices (a flag that asks otherwise is an Error), and the settings.
inline void apply_experiment_flags(const CLI::App& app, ExperimentArgs& a, int argc, char** argv) {
  EnsembleOptions& o = a.o;
  apply_train_flags(o.base, a.flags, argc, argv);
  o.base.command_line.clear();
  for (int i = 0; i < argc; ++i) o.base.command_line += (i ? " " : "") + std::string(argv[i]);
  // A planned task's device is its Slurm task's (cpu, or cuda:0 of the GPUs it was given), and the
  // device-dependent defaults below follow it, not the planning machine.
  if ((a.plan || a.collect) && !app.count("--device")) o.base.device = a.slurm.gpus_per_task > 0 ? "cuda" : "cpu";
  const bool gpu = o.base.device != "cpu";
  // The CPU run is small (1000 images of 16x16): smaller batches give it enough steps to learn.
  if (!app.count("--batch-size")) o.base.batch_size = gpu ? 128 : 32;
  o.replicas = a.replicas ? a.replicas : (gpu ? 3 : 2);
  if (o.base.dataset == "synthetic") {
    if (!app.count("--synthetic-train")) o.base.synthetic_train = gpu ? 10000 : 1000;
    if (!app.count("--synthetic-test")) o.base.synthetic_test = gpu ? 2000 : 500;
    if (!app.count("--synthetic-size")) o.base.synthetic_size = gpu ? 32 : 16;
  }
  // A protocol's own flags given to another would be silently ignored: refused instead.
  static const std::vector<std::pair<const char*, const char*>> kOwnFlags = {
      {"--settings", "settings"},        {"--setting", "settings"},     {"--lrs", "fig-s4"},
      {"--fig-s4-kernels", "fig-s4"},    {"--no-control", "fig-s4"},    {"--modes", "overhead"},
      {"--overhead-warmup", "overhead"}, {"--overhead-steps", "overhead"}};
  for (const auto& [flag, protocol] : kOwnFlags)
    if (app.count(flag) && a.protocol != protocol)
      throw Error(fmt::format("{} belongs to --protocol {}; --protocol {} does not read it (leave it out)",
                                     flag, protocol, a.protocol));
  if (a.protocol == "fig-s4") {
    // The figure fixes these: a flag that asks otherwise is an error, not silently overridden.
    for (const char* flag : {"--optimizer", "--lr", "--augment", "--lr-schedule", "--warmup-epochs"})
      if (app.count(flag) && !(std::string(flag) == "--optimizer" && o.base.optimizer == "sgd") &&
          !(std::string(flag) == "--lr-schedule" && o.base.lr_schedule == "constant"))
        throw Error(fmt::format("{}: figure S4 trains with SGD at the constant learning rates of --lrs, "
                                       "without augmentation; leave {} out",
                                       flag, flag));
    if (!app.count("--momentum")) o.base.momentum = 0;  // the figure's default: plain SGD
  }
  // The overhead protocol times steps one run at a time: a cluster's tasks would time other GPUs.
  if ((a.plan || a.collect) && a.protocol == "overhead")
    throw Error(fmt::format("--{}: a planned study runs the settings or fig-s4 protocol; --protocol overhead times "
                            "its runs one after the other on one machine",
                            a.plan ? "plan" : "collect"));
  if ((a.plan || a.collect) && o.resume)
    throw Error("--resume: a planned study resumes by resubmitting its unfinished tasks (sbatch --array=...)");
  for (const char* flag : {"--slurm-gpus-per-task", "--slurm-partition", "--slurm-dp-launch", "--train-binary"})
    if (app.count(flag) && !a.plan && !a.collect)
      throw Error(fmt::format("{} belongs to --plan and --collect; leave it out", flag));
  for (const auto& n : a.names) o.settings.push_back(parse_setting(n));
  for (const auto& c : a.custom) o.settings.push_back(parse_setting(c));
}

// Figure S4's options as the command line sets them (SGD's momentum and Nesterov come from the
// training flags).
inline FigS4Options fig_s4_options(const ExperimentArgs& a) {
  FigS4Options f = a.fig;
  f.momentum = a.o.base.momentum;
  f.nesterov = a.o.base.nesterov;
  f.control = !a.no_control;
  return f;
}

// Runs the chosen protocol (settings, fig-s4 or overhead) on `data`; *wall gets the settings
// protocol's wall time.
inline ReportData run_experiment_protocol(ExperimentArgs& a, const std::shared_ptr<const TrainData>& data,
                                          double* wall = nullptr) {
  EnsembleOptions& o = a.o;
  if (a.protocol == "settings") {
    const std::vector<SettingRuns> runs = run_settings(o, data, wall);
    return summarize(runs, o, *data);
  }
  if (a.protocol == "fig-s4") return run_fig_s4(o, fig_s4_options(a), data);
  return run_overhead(o, a.modes, a.overhead_warmup, a.overhead_steps, data);
}

// The study a --plan writes and a --collect reads: the settings protocol's, or figure S4's cells.
inline EnsembleOptions planned_study(const ExperimentArgs& a) {
  return a.protocol == "fig-s4" ? fig_s4_study(a.o, fig_s4_options(a)).o : a.o;
}

// A planned study's report from its finished run folders (each checked against the plan).
inline ReportData collect_protocol(const ExperimentArgs& a, const TrainData& data) {
  if (a.protocol == "fig-s4") {
    const FigS4Options f = fig_s4_options(a);
    const FigS4Study study = fig_s4_study(a.o, f);
    return fig_s4_report(study, f, collect_study(study.o, a.slurm, data), data);
  }
  return summarize(collect_study(a.o, a.slurm, data), a.o, data);
}

// CONTROL (and figure S4's per-lr CONTROL cells) must end bit-identical: what went wrong where
// one did not ("" when every one did).
inline std::string control_mismatch(const ReportData& report, const std::string& protocol) {
  const std::string cell = "-CONTROL";
  for (const auto& s : report.settings)
    if (s == "CONTROL" || (protocol == "fig-s4" && s.size() > cell.size() &&
                           s.compare(s.size() - cell.size(), cell.size(), cell) == 0)) {
      const auto* d = find_metric(report, s, "distinct_fingerprints");
      if (d && d->value != 1)
        return fmt::format("{} replicas are not bit-identical: {:.0f} distinct weight fingerprints", s, d->value);
    }
  return "";
}

}  // namespace ditto
