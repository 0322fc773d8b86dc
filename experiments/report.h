// The experiment report: what an ensemble experiment measured, written three ways into its
// folder — report.json (everything, for programs), report.csv (tidy rows: setting, metric,
// value, ci_low, ci_high) and report.html (self-contained: inline SVG charts and tables, no
// scripts or files from elsewhere except a small check that every chart drew something).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ditto {

// One number of one setting, with a confidence interval where one exists (has_interval).
struct ReportMetric {
  std::string setting;
  std::string metric;  // "churn", "disagreement", "accuracy_mean", "accuracy_std", "weight_l2",
                       // "distinct_fingerprints", "seconds_per_epoch", ...
  double value = 0, low = 0, high = 0;
  bool has_interval = false;
};

// A per-epoch curve of one setting: the mean over replicas and the lowest / highest replica.
struct ReportCurve {
  std::string setting;
  std::string metric;  // "top1", "top5"
  std::vector<int> epochs;
  std::vector<double> mean, low, high;
};

// The spread across replicas of one group's metric (a class, or a subgroup cell such as
// "Blond_Hair=1 & Male=0"): mean and standard deviation over replicas.
struct ReportGroup {
  std::string setting;
  std::string kind;    // "class" | "subgroup"
  std::string group;
  std::string metric;  // "accuracy" | "fpr" | "fnr"
  double mean = 0, std = 0;
};

// Per-example stability of one setting: counts[k-1] = test examples whose majority label k of
// the R replicas predict (k = 1..R; k = R: all agree).
struct ReportStability {
  std::string setting;
  std::vector<int64_t> counts;
};

// An example the replicas disagree on most.
struct ReportExample {
  std::string setting;
  int64_t index = 0;          // test-set index
  std::string label;          // its true class name
  int agree = 0, replicas = 0;  // replicas that predict its majority label, of how many
};

// One point of the design document's figure S4: the fraction of test examples on which the
// replicas do not all agree, at one learning rate, for one {init} x {batch order} combination.
struct ReportFigS4Point {
  double lr = 0;
  std::string init, order;    // "fixed" | "random"
  double disagreement = 0;
};

// One row of the overhead protocol: a kernel mode's time per step and its ratio to heuristic.
struct ReportOverhead {
  std::string mode;           // heuristic | deterministic | nondeterministic | fastest | ...
  double ms_per_step = 0;
  double ratio = 0;           // ms_per_step / heuristic's
};

struct ReportData {
  std::string title;          // e.g. "smallcnn on cifar10: 5 replicas x 10 epochs"
  std::vector<std::string> settings;  // display order
  std::vector<ReportMetric> metrics;
  std::vector<ReportCurve> curves;
  std::vector<ReportGroup> groups;
  std::vector<ReportStability> stability;
  std::vector<ReportExample> unstable;
  std::vector<ReportFigS4Point> fig_s4;
  std::vector<ReportOverhead> overhead;
  // Shown as the manifest summary: GPU, driver, CUDA/cuDNN versions, git commit, command line,
  // and per setting the kernels each layer ran ({"kernels": {setting: ["conv1.fwd=...", ...]}}).
  nlohmann::json manifest = nlohmann::json::object();
};

// Writes report.json, report.csv and report.html into dir (each atomically). Sections without
// data are left out of the HTML. Throws IoError naming the file it cannot write.
void write_report(const std::string& dir, const ReportData& data);

// The HTML alone (what write_report writes to report.html).
std::string report_html(const ReportData& data);
// The tidy CSV alone: header "setting,metric,value,ci_low,ci_high", then one row per metric,
// per group spread (metric "<kind>:<group>:<metric>_std"), per curve point
// ("<metric>@epoch<E>") and per figure-S4 point (setting "<init>-init/<order>-order",
// metric "disagreement@lr<LR>", LR as "{:g}" prints it); ci cells empty where there is no
// interval. A curve point's ci cells hold its lowest and highest replica (a range, not a
// confidence interval); a group row's value is the standard deviation (the mean is in
// report.json). Numbers are written in the shortest form that reads back to the same double;
// fields with commas, quotes or line breaks are quoted.
std::string report_csv(const ReportData& data);

}  // namespace ditto
