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

// An example the replicas disagree on most, with the test input itself so that a reader can look
// at it: the report carries the pixels (as JPEG), so it needs no access to the data set later.
struct ReportExample {
  std::string setting;
  int64_t index = 0;          // test-set index
  std::string label;          // its true class name
  int agree = 0, replicas = 0;  // replicas that predict its majority label, of how many
  std::vector<std::string> predicted;  // each replica's top-1 class name, in replica order
  std::vector<uint8_t> jpeg;  // the test image as a JPEG (datasets/dataset.h encode_jpeg); empty:
                              // no image (report.html shows the row without one)
};

// One point of the design document's figure S4: the fraction of test examples on which the
// replicas do not all agree, at one learning rate, for one cell: an {init} x {batch order}
// combination under the kernels named, or the CONTROL cell (deterministic kernels, nothing varies).
struct ReportFigS4Point {
  double lr = 0;
  std::string init, order;    // "fixed" | "random"
  double disagreement = 0;
  std::string kernels;        // the kernels mode the cell ran ("heuristic", "deterministic", ...)
  std::string line;           // the chart line and CSV setting this point belongs to, e.g.
                              // "fixed-init/random-order" or "CONTROL"; empty: "<init>-init/<order>-order"
};

// The decomposition of one noise measure over the paper's four settings
// (experiments/decomposition.h): the four settings' values and the contrasts, each with its interval.
struct ReportDecomposition {
  struct Term {
    std::string name;         // "ALGO+IMPL", ..., "excess", "additive", "interaction"
    double value = 0, low = 0, high = 0;
  };
  std::string measure;        // "churn" | "accuracy_variance"
  std::vector<Term> terms;
  std::string verdict;        // "additive" | "sub-additive" | "super-additive"
  std::string intervals;      // what the intervals resample, in words
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
  std::vector<ReportDecomposition> decomposition;
  // Shown as the manifest summary: GPU, driver, CUDA/cuDNN versions, git commit, command line,
  // and per setting the kernels each layer ran ({"kernels": {setting: ["conv1.fwd=...", ...]}}).
  nlohmann::json manifest = nlohmann::json::object();
};

// Writes report.json, report.csv and report.html into dir (each atomically). Sections without
// data are left out of the HTML. Throws IoError naming the file it cannot write.
void write_report(const std::string& dir, const ReportData& data);

// The HTML alone (what write_report writes to report.html). Least stable examples with an image
// are shown as <img> elements with the JPEG inline (a data: URI); a script checks after loading
// that each decoded to a picture of non-zero size, like the charts ("images=N broken=M" in
// #image-check and the title).
std::string report_html(const ReportData& data);

// Standard base64 (RFC 4648, with '=' padding): how report.json and report.html carry images.
std::string base64_encode(const std::vector<uint8_t>& bytes);
// The tidy CSV alone: header "setting,metric,value,ci_low,ci_high", then one row per metric,
// per group spread (metric "<kind>:<group>:<metric>_std"), per curve point
// ("<metric>@epoch<E>"), per figure-S4 point (setting: the point's line, metric
// "disagreement@lr<LR>", LR as "{:g}" prints it) and per decomposition term (setting
// "decomposition:<measure>", metric the term's name); ci cells empty where there is no
// interval. A curve point's ci cells hold its lowest and highest replica (a range, not a
// confidence interval); a group row's value is the standard deviation (the mean is in
// report.json). Numbers are written in the shortest form that reads back to the same double;
// fields with commas, quotes or line breaks are quoted.
std::string report_csv(const ReportData& data);

}  // namespace ditto
