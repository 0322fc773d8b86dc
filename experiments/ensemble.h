// Ensemble experiments: the paper's protocols as a library. Replicas of one training run that
// differ only in what a setting lets vary are trained (concurrently where asked), and how far
// their predictions and weights drift is measured and reported (experiments/report.h).
//
// Settings (what varies between replicas):
//   ALGO+IMPL    seeds (init, order, augmentation) per replica, heuristic kernels (the framework
//                default: cuDNN's pick, atomics in reductions) — the paper's ALGO+IMPL
//   ALGO         seeds per replica, deterministic kernels
//   IMPL         seeds fixed, heuristic kernels — the paper's IMPL
//   IMPL-ATOMIC  seeds fixed, nondeterministic kernels (every atomics variant: the most noise)
//   CONTROL      seeds fixed, deterministic kernels: must be bit-identical
// and custom ones, "NAME: seeds=fixed|random|init|order kernels=MODE pin=LAYER.KNOB=VARIANT ...".
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "experiments/report.h"
#include "experiments/train.h"

namespace ditto {

struct Setting {
  std::string name;
  bool vary_init = false;   // initial weights drawn per replica
  bool vary_order = false;  // batch order and augmentation drawn per replica
  std::string kernels = "deterministic";  // heuristic | deterministic | nondeterministic | fastest | pytorch
  std::vector<std::string> pins;          // after the kernels mode
  float lr = 0;                           // > 0: this setting's learning rate (figure S4)
};

// The five named settings above, in that order.
const std::vector<Setting>& paper_settings();
// A named setting (case-insensitive: "algo+impl", "IMPL-ATOMIC", ...) or a custom spec
// "NAME: seeds=fixed kernels=deterministic pin=conv2.bwd_filter=algo0" (seeds: fixed | random |
// init | order; pin repeatable; the policy checks pins when the replicas train). Throws Error
// naming the spec and the part it cannot read.
Setting parse_setting(const std::string& spec);

struct EnsembleOptions {
  TrainConfig base;          // everything but seeds and kernels (and lr for figure S4)
  std::vector<Setting> settings;
  int replicas = 3;
  int concurrent = 1;        // replicas at once per GPU
  int gpus = 1;
  std::string out;           // the experiment folder; one run folder per replica inside
  bool resume = false;       // keep finished replicas in out, continue unfinished ones
  std::string tuning;        // deterministic settings without pins read this tuning file (tuned
                             // first if absent); a setting with pins keeps cuDNN's heuristic
                             // ranking, so a pin and a tuning entry never both claim a layer
  int bootstrap = 1000;      // resamples for the confidence intervals
  int unstable_shown = 10;   // least stable test examples shown per setting (with their images)
  bool verbose = true;       // a line per replica started
  // Called after each replica ends (trained, or read back as finished earlier), one call at a
  // time though replicas train concurrently: the setting, the replica (0-based), and how many of
  // the experiment's settings x replicas have ended. Progress for front ends (the Python
  // package's bars); it must not throw.
  std::function<void(const std::string& setting, int replica, int done, int total)> on_replica;
};

struct SettingRuns {
  Setting setting;
  std::vector<TrainResult> runs;  // in replica order
};

// Trains every (setting, replica) from one pool of jobs. A replica folder that finished every
// epoch is read back (with resume), one that stopped part-way continues from its checkpoint.
// Without resume, an out folder that already holds replicas is an Error naming it.
std::vector<SettingRuns> run_settings(const EnsembleOptions& o, const std::shared_ptr<const TrainData>& data,
                                      double* wall_seconds = nullptr);

// ---- A study on a Slurm cluster ----------------------------------------------------------------
// The settings protocol as a job array: one task per (setting, replica), each the exact ditto-train
// command of that replica (its defining flags and seeds, experiments/run_dir.h), so the replicas a
// cluster trains are the ones run_settings would have trained, bit for bit; then the report from
// the finished run folders.
struct StudyPlanOptions {
  std::string train_binary;  // the ditto-train every task runs (an absolute path)
  int gpus_per_task = 0;     // 0: CPU replicas (--device cpu); else cuda:0 of the task's own GPUs
  std::string partition;     // "": the cluster's default
  // Each replica's data-parallel ranks (--dp-gpus K) as K Slurm tasks of one GPU (or CPU) each,
  // started by srun inside its array task (ditto-train --dp-launch slurm): a replica may span
  // nodes. Off: the K ranks are threads of one task holding K GPUs.
  bool dp_processes = false;
};
// Writes o.out/plan.json (the study: settings, replicas, options, and per task its setting,
// replica, run folder and command), o.out/tasks.txt (task i's command on line i + 1) and
// o.out/study.sbatch (an array job of one task per line; logs in o.out/slurm/). Throws Error for an
// out folder that already holds a plan or replica folders, a tuning file that does not exist yet,
// or a --device the tasks cannot have. Returns the number of tasks.
int write_study_plan(const EnsembleOptions& o, const StudyPlanOptions& p);
// The runs of a planned study, for summarize(): o.out's plan must be the one o and p make (the same
// commands, so the same flags), and every task's folder finished and recorded as its planned run
// (check_reused_run). Throws Error naming the task, its folder and what is missing or differs.
std::vector<SettingRuns> collect_study(const EnsembleOptions& o, const StudyPlanOptions& p, const TrainData& data);

// The settings protocol's report: churn and not-all-agree fraction with bootstrap intervals,
// accuracy mean / std (the std with a bootstrap interval over replicas), top-1 / top-5 curves,
// weight L2, distinct fingerprints, per-class and per-subgroup spread (accuracy; FPR and FNR for
// two-class data), per-example stability; the o.unstable_shown least stable examples per setting
// (highest fraction of disagreeing replica pairs first, then test index) with each replica's
// prediction and the test image as a JPEG taken from data.test (the run's test set); the
// ensemble's (plurality vote's) accuracy on the examples the replicas do not all agree on against
// the rest (metrics unstable_examples, ensemble_accuracy, ensemble_acc_unstable and
// ensemble_acc_stable with bootstrap intervals over those examples, replica_acc_unstable); when
// ALGO+IMPL, ALGO, IMPL and CONTROL all ran with 2 replicas or more, the decomposition of churn
// and accuracy variance (experiments/decomposition.h); and the manifest summary read from out.
ReportData summarize(const std::vector<SettingRuns>& settings, const EnsembleOptions& o, const TrainData& data);

// Figure S4 of the design document. For each learning rate, the four {fixed, random} init x
// {fixed, random} order cells run `kernels` (the framework default, heuristic: on a GPU the
// fixed/fixed cell then shows GPU noise alone), and with `control` a CONTROL cell (deterministic
// kernels, init and order fixed: the zero line). SGD with `momentum` (the design document sets 0
// and 0.9 side by side), constant learning rate, no augmentation; o.replicas replicas per cell.
struct FigS4Options {
  std::vector<float> lrs = {0.01f, 0.05f, 0.1f};
  float momentum = 0;
  bool nesterov = false;
  std::string kernels = "heuristic";
  bool control = true;
};
// The fraction of test examples on which a cell's replicas do not all agree, per cell and
// learning rate (ReportData::fig_s4), with the runs' summary. Cells are settings named
// "lr<LR>-<init>init-<order>order" and "lr<LR>-CONTROL". Throws Error for no learning rates, a
// learning rate that is not positive, a momentum outside [0, 1) or nesterov without momentum.
ReportData run_fig_s4(EnsembleOptions o, const FigS4Options& f, const std::shared_ptr<const TrainData>& data);
// The same in two halves, so a cluster can train the cells (write_study_plan / collect_study):
// the study (o with SGD, the constant rates and the cells as settings; the cells in that order),
// and the report of its runs.
struct FigS4Study {
  EnsembleOptions o;
  std::vector<ReportFigS4Point> cells;  // disagreement filled in by fig_s4_report
};
FigS4Study fig_s4_study(EnsembleOptions o, const FigS4Options& f);
ReportData fig_s4_report(const FigS4Study& study, const FigS4Options& f, const std::vector<SettingRuns>& runs,
                         const TrainData& data);

// Time per step of one model under each kernel mode (fixed seeds, `steps` steps after
// `warmup` untimed ones, one run at a time), and each mode's ratio to heuristic.
ReportData run_overhead(EnsembleOptions o, const std::vector<std::string>& modes, int warmup, int steps,
                        const std::shared_ptr<const TrainData>& data);

// Metrics, exposed for tests.
// counts[k-1]: examples whose majority label k of the R replicas predict (ties: smallest label).
std::vector<int64_t> stability_counts(const std::vector<std::vector<int32_t>>& predictions);
// Per example: how many replicas predict its majority label.
std::vector<int> majority_agreement(const std::vector<std::vector<int32_t>>& predictions);
// 1 where not every replica predicts the same label, else 0.
std::vector<double> not_all_agree(const std::vector<std::vector<int32_t>>& predictions);
// Per example: the label most replicas predict (ties: the smallest label), the ensemble's vote.
std::vector<int32_t> plurality_vote(const std::vector<std::vector<int32_t>>& predictions);
// Two-class rates with class 1 positive, over the examples where mask is true: FPR = FP / (FP
// + TN), FNR = FN / (FN + TP); 0 where the denominator is 0.
struct BinaryRates {
  double fpr = 0, fnr = 0;
};
BinaryRates binary_rates(const std::vector<int32_t>& predicted, const std::vector<int32_t>& labels,
                         const std::vector<bool>& mask);

}  // namespace ditto
