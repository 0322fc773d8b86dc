// ditto-experiment: the paper's protocols (experiments/ensemble.h).
//   --protocol settings (default)  replicas per setting — ALGO+IMPL, ALGO, IMPL, IMPL-ATOMIC, CONTROL,
//                                  or custom ones (--setting "NAME: seeds=... kernels=... pin=...")
//   --protocol fig-s4 --lrs 0.01,0.05,0.1   {fixed, random} init x order per learning rate under the
//                                  framework-default kernels, and a CONTROL cell; SGD (--momentum, 0
//                                  unless given), constant learning rate, no augmentation
//   --protocol overhead            ms per step under each kernel mode
// Every training flag of ditto-train applies (model, data, optimizer, schedule, augmentation,
// batch size, pins, sizes, --graph), except seeds and kernels, which the settings decide.
// Writes report.json, report.csv and report.html to --out (experiments/report.h) beside one run
// folder per replica; --resume keeps finished replicas and continues unfinished ones.
// On a Slurm cluster: --plan writes the settings (or figure S4) study as an array job (one replica
// per task, its exact ditto-train command) to --out; after `sbatch OUT/study.sbatch`, the same
// command with --collect instead of --plan checks every run folder against the plan and writes the
// report.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ditto/experiments.h"
#include "experiments/experiment_cli.h"

namespace {

void print_table(const ditto::ReportData& r) {
  std::printf("\n%-14s %8s %8s %22s %14s %17s %12s %10s %9s %8s\n", "setting", "acc", "acc_std", "churn [95% CI]",
              "replica pairs", "over replicas", "not-all-agree", "weight_L2", "distinct", "s/epoch");
  for (const auto& s : r.settings) {
    auto v = [&](const char* m) {
      const auto* x = ditto::find_metric(r, s, m);
      return x ? x->value : 0.0;
    };
    const auto* churn = ditto::find_metric(r, s, "churn");
    const auto* over = ditto::find_metric(r, s, "churn_replicas");
    // The churn interval resamples test examples; the pair range shows what the replicas drawn do,
    // and "over replicas" is the interval for another draw of them (from three replicas on).
    const std::string replicas = over ? fmt::format("[{:5.2f}, {:5.2f}]", 100 * over->low, 100 * over->high) : "-";
    std::printf("%-14s %8.4f %8.4f %7.2f%% [%5.2f, %5.2f] %6.2f-%5.2f%% %17s %11.2f%% %10.4g %9.0f %8.2f\n",
                s.c_str(), v("accuracy_mean"), v("accuracy_std"), 100 * v("churn"), churn ? 100 * churn->low : 0.0,
                churn ? 100 * churn->high : 0.0, 100 * v("churn_pair_min"), 100 * v("churn_pair_max"),
                replicas.c_str(), 100 * v("disagreement"), v("weight_l2"), v("distinct_fingerprints"),
                v("seconds_per_epoch"));
  }
  for (const auto& d : r.decomposition) {
    std::printf("\n%s decomposition (interval: 95%%):\n", d.measure.c_str());
    for (const auto& t : d.terms) std::printf("  %-12s %12.6g [%.6g, %.6g]\n", t.name.c_str(), t.value, t.low, t.high);
    std::printf("  -> %s\n", d.verdict.c_str());
  }
}

// What each protocol prints: the settings table, figure S4's cells, or the overhead ratios.
void print_protocol(const ditto::ExperimentArgs& a, const ditto::ReportData& report, double wall) {
  const ditto::EnsembleOptions& o = a.o;
  if (a.protocol == "settings") {
    print_table(report);
    std::printf("\n%zu replicas x %d epochs in %.1f s wall (%d at a time per GPU%s)\n",
                o.settings.size() * static_cast<std::size_t>(o.replicas), o.base.epochs, wall, o.concurrent,
                o.base.graph ? ", CUDA graphs" : "");
  } else if (a.protocol == "fig-s4") {
    std::printf("\n%-8s %-8s %-8s %-14s %s\n", "lr", "init", "order", "kernels", "not all agree");
    for (const auto& p : report.fig_s4)
      std::printf("%-8g %-8s %-8s %-14s %.2f%%%s\n", p.lr, p.init.c_str(), p.order.c_str(), p.kernels.c_str(),
                  100 * p.disagreement, p.line == "CONTROL" ? "  (CONTROL)" : "");
  } else {
    for (const auto& r : report.overhead) std::printf("%-18s x%.3f of heuristic\n", r.mode.c_str(), r.ratio);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ditto-experiment: the paper's protocols — replicas per setting, figure S4, overhead"};
  app.set_help_all_flag("--help-all");
  ditto::ExperimentArgs a;
  ditto::add_experiment_flags(app, a);
  CLI11_PARSE(app, argc, argv);

  try {
    ditto::apply_experiment_flags(app, a, argc, argv);
    const ditto::EnsembleOptions& o = a.o;
    if ((a.plan || a.collect) && a.slurm.train_binary.empty())
      a.slurm.train_binary = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ditto-train").string();
    if (a.plan) {
      const ditto::EnsembleOptions study = ditto::planned_study(a);
      const int tasks = ditto::write_study_plan(study, a.slurm);
      std::printf("planned %d tasks (%zu %s x %d replicas) in %s\nsubmit: sbatch %s/study.sbatch\nthen: the same "
                  "command with --collect instead of --plan\n",
                  tasks, study.settings.size(), a.protocol == "fig-s4" ? "cells" : "settings", study.replicas,
                  study.out.c_str(), study.out.c_str());
      return 0;
    }
    std::printf("ditto-experiment (%s) on %s: %s on %s, %d replicas x %d epochs\n", a.protocol.c_str(),
                o.base.device.c_str(), o.base.model.c_str(), o.base.dataset.c_str(), o.replicas, o.base.epochs);
    auto data = ditto::load_train_data(o.base);  // once for every replica
    double wall = 0;
    const ditto::ReportData report =
        a.collect ? ditto::collect_protocol(a, *data) : ditto::run_experiment_protocol(a, data, &wall);
    print_protocol(a, report, wall);
    ditto::write_report(o.out, report);
    std::printf("wrote %s/report.{html,json,csv}\n", o.out.c_str());
    const std::string mismatch = ditto::control_mismatch(report, a.protocol);
    if (!mismatch.empty()) std::fprintf(stderr, "%s\n", mismatch.c_str());
    return mismatch.empty() ? 0 : 1;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-experiment: %s\n", e.what());
    return 2;
  }
}
