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
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ditto/experiments.h"
#include "experiments/cli.h"

namespace fs = std::filesystem;

namespace {

const ditto::ReportMetric* find_metric(const ditto::ReportData& r, const std::string& setting, const std::string& m) {
  for (const auto& x : r.metrics)
    if (x.setting == setting && x.metric == m) return &x;
  return nullptr;
}

void print_table(const ditto::ReportData& r) {
  std::printf("\n%-14s %8s %8s %22s %12s %10s %9s %8s\n", "setting", "acc", "acc_std", "churn [95% CI]", "not-all-agree",
              "weight_L2", "distinct", "s/epoch");
  for (const auto& s : r.settings) {
    auto v = [&](const char* m) {
      const auto* x = find_metric(r, s, m);
      return x ? x->value : 0.0;
    };
    const auto* churn = find_metric(r, s, "churn");
    std::printf("%-14s %8.4f %8.4f %7.2f%% [%5.2f, %5.2f] %11.2f%% %10.4g %9.0f %8.2f\n", s.c_str(), v("accuracy_mean"),
                v("accuracy_std"), 100 * v("churn"), churn ? 100 * churn->low : 0.0, churn ? 100 * churn->high : 0.0,
                100 * v("disagreement"), v("weight_l2"), v("distinct_fingerprints"), v("seconds_per_epoch"));
  }
  for (const auto& d : r.decomposition) {
    std::printf("\n%s decomposition (interval: 95%%):\n", d.measure.c_str());
    for (const auto& t : d.terms) std::printf("  %-12s %12.6g [%.6g, %.6g]\n", t.name.c_str(), t.value, t.low, t.high);
    std::printf("  -> %s\n", d.verdict.c_str());
  }
}

// Everything the command line sets: the experiment's options and each protocol's own.
struct Args {
  ditto::EnsembleOptions o;
  ditto::TrainFlags flags;
  std::string protocol = "settings";
  int replicas = 0;  // 0: by device
  std::vector<std::string> names = {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"};
  std::vector<std::string> custom;
  ditto::FigS4Options fig;
  bool no_control = false;
  std::vector<std::string> modes = {"heuristic", "deterministic", "nondeterministic", "fastest"};
  int overhead_warmup = 20, overhead_steps = 100;  // the paper profiled 100 iterations
};

// The defaults ditto-experiment starts from, the training flags it honours, then its own (a flat
// table of flag definitions).
void add_flags(CLI::App& app, Args& a) {
  ditto::EnsembleOptions& o = a.o;
  o.base.dataset = "synthetic";
  o.base.model = "smallcnn";
  o.base.lr = 2e-3f;
  o.base.epochs = 5;
  o.base.device = "auto";
  o.out = "runs/experiment";
  ditto::add_train_flags(app, o.base, a.flags, ditto::kFlagsData | ditto::kFlagsOptim | ditto::kFlagsRun | ditto::kFlagsPins |
                                              ditto::kFlagsDataParallel);
  app.add_option("--protocol", a.protocol, "settings | fig-s4 | overhead")
      ->check(CLI::IsMember({"settings", "fig-s4", "overhead"}))
      ->capture_default_str();
  app.add_option("--replicas", a.replicas, "replicas per setting (default 3 on GPU, 2 on CPU)")
      ->check(ditto::detail::whole(2, 100000));
  app.add_option("--settings", a.names, "named settings: ALGO+IMPL ALGO IMPL IMPL-ATOMIC CONTROL")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--setting", a.custom,
                 "a custom setting, repeatable: \"NAME: seeds=fixed|random|init|order kernels=MODE "
                 "pin=LAYER.KNOB=VARIANT ...\" (added after --settings)");
  app.add_option("--lrs", a.fig.lrs, "fig-s4: learning rates")
      ->delimiter(',')
      ->check(ditto::detail::positive_float())
      ->capture_default_str();
  app.add_option("--fig-s4-kernels", a.fig.kernels,
                 "fig-s4: the kernels of the four {init} x {order} cells (heuristic: the framework default, so the "
                 "fixed/fixed cell shows GPU noise)")
      ->check(CLI::IsMember({"heuristic", "deterministic", "nondeterministic", "fastest"}))
      ->capture_default_str();
  app.add_flag("--no-control", a.no_control, "fig-s4: leave out the CONTROL cell (deterministic kernels, nothing varies)");
  app.add_option("--unstable-examples", o.unstable_shown,
                 "least stable test examples shown per setting in report.html, with their images")
      ->check(ditto::detail::at_least(0))
      ->capture_default_str();
  app.add_option("--modes", a.modes, "overhead: kernel modes")
      ->delimiter(',')
      ->check(CLI::IsMember({"heuristic", "deterministic", "nondeterministic", "fastest"}))
      ->capture_default_str();
  app.add_option("--overhead-warmup", a.overhead_warmup, "overhead: untimed steps first")
      ->check(ditto::detail::at_least(1))
      ->capture_default_str();
  app.add_option("--overhead-steps", a.overhead_steps,
                 "overhead: timed steps (the paper profiled 100; fewer for a quick look)")
      ->check(ditto::detail::at_least(1))
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
      ->check(ditto::detail::whole(100, 100000000))
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "keep the finished replicas in --out and continue the unfinished ones");
  app.add_option("--out", o.out)->check(ditto::detail::output_path())->capture_default_str();
}

// After parsing: the training flags, the defaults that depend on the device, figure S4's fixed
// choices (a flag that asks otherwise is an Error), and the settings.
void apply_flags(const CLI::App& app, Args& a, int argc, char** argv) {
  ditto::EnsembleOptions& o = a.o;
  ditto::apply_train_flags(o.base, a.flags, argc, argv);
  o.base.command_line.clear();
  for (int i = 0; i < argc; ++i) o.base.command_line += (i ? " " : "") + std::string(argv[i]);
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
      throw ditto::Error(fmt::format("{} belongs to --protocol {}; --protocol {} does not read it (leave it out)",
                                     flag, protocol, a.protocol));
  if (a.protocol == "fig-s4") {
    // The figure fixes these: a flag that asks otherwise is an error, not silently overridden.
    for (const char* flag : {"--optimizer", "--lr", "--augment", "--lr-schedule", "--warmup-epochs"})
      if (app.count(flag) && !(std::string(flag) == "--optimizer" && o.base.optimizer == "sgd") &&
          !(std::string(flag) == "--lr-schedule" && o.base.lr_schedule == "constant"))
        throw ditto::Error(fmt::format("{}: figure S4 trains with SGD at the constant learning rates of --lrs, "
                                       "without augmentation; leave {} out",
                                       flag, flag));
    if (!app.count("--momentum")) o.base.momentum = 0;  // the figure's default: plain SGD
  }
  for (const auto& n : a.names) o.settings.push_back(ditto::parse_setting(n));
  for (const auto& c : a.custom) o.settings.push_back(ditto::parse_setting(c));
}

// Runs the chosen protocol and prints its table.
ditto::ReportData run_protocol(Args& a, const std::shared_ptr<const ditto::TrainData>& data) {
  ditto::EnsembleOptions& o = a.o;
  ditto::ReportData report;
  if (a.protocol == "settings") {
    double wall = 0;
    const std::vector<ditto::SettingRuns> runs = ditto::run_settings(o, data, &wall);
    report = ditto::summarize(runs, o, *data);
    print_table(report);
    std::printf("\n%zu replicas x %d epochs in %.1f s wall (%d at a time per GPU%s)\n",
                o.settings.size() * static_cast<std::size_t>(o.replicas), o.base.epochs, wall, o.concurrent,
                o.base.graph ? ", CUDA graphs" : "");
  } else if (a.protocol == "fig-s4") {
    a.fig.momentum = o.base.momentum;
    a.fig.nesterov = o.base.nesterov;
    a.fig.control = !a.no_control;
    report = ditto::run_fig_s4(o, a.fig, data);
    std::printf("\n%-8s %-8s %-8s %-14s %s\n", "lr", "init", "order", "kernels", "not all agree");
    for (const auto& p : report.fig_s4)
      std::printf("%-8g %-8s %-8s %-14s %.2f%%%s\n", p.lr, p.init.c_str(), p.order.c_str(), p.kernels.c_str(),
                  100 * p.disagreement, p.line == "CONTROL" ? "  (CONTROL)" : "");
  } else {
    report = ditto::run_overhead(o, a.modes, a.overhead_warmup, a.overhead_steps, data);
    for (const auto& r : report.overhead) std::printf("%-18s x%.3f of heuristic\n", r.mode.c_str(), r.ratio);
  }
  return report;
}

// CONTROL (and figure S4's per-lr CONTROL cells) must end bit-identical: false, with a message,
// where one did not.
bool controls_identical(const ditto::ReportData& report, const std::string& protocol) {
  const std::string cell = "-CONTROL";
  for (const auto& s : report.settings)
    if (s == "CONTROL" || (protocol == "fig-s4" && s.size() > cell.size() &&
                           s.compare(s.size() - cell.size(), cell.size(), cell) == 0)) {
      const auto* d = find_metric(report, s, "distinct_fingerprints");
      if (d && d->value != 1) {
        std::fprintf(stderr, "%s replicas are not bit-identical: %.0f distinct weight fingerprints\n", s.c_str(),
                     d->value);
        return false;
      }
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ditto-experiment: the paper's protocols — replicas per setting, figure S4, overhead"};
  app.set_help_all_flag("--help-all");
  Args a;
  add_flags(app, a);
  CLI11_PARSE(app, argc, argv);

  try {
    apply_flags(app, a, argc, argv);
    const ditto::EnsembleOptions& o = a.o;
    std::printf("ditto-experiment (%s) on %s: %s on %s, %d replicas x %d epochs\n", a.protocol.c_str(),
                o.base.device.c_str(), o.base.model.c_str(), o.base.dataset.c_str(), o.replicas, o.base.epochs);
    auto data = ditto::load_train_data(o.base);  // once for every replica
    const ditto::ReportData report = run_protocol(a, data);
    ditto::write_report(o.out, report);
    std::printf("wrote %s/report.{html,json,csv}\n", o.out.c_str());
    return controls_identical(report, a.protocol) ? 0 : 1;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-experiment: %s\n", e.what());
    return 2;
  }
}
