// The noise lab's attribution: which layer's which kernel makes two identical runs drift apart,
// by how much, and what removing it costs.
//
// A candidate is one (layer, knob, nondeterministic variant) of a network — read off the net's
// knob layers and the policy's knob table (KnobSpec::nondeterministic), never a hand-written
// list — or a group of them (every layer's same knob). Two forms:
//   add-one        CONTROL seeds, every kernel deterministic except the candidate, which runs its
//                  nondeterministic variant: what noise this kernel alone injects.
//   leave-one-out  everything nondeterministic except the candidate, made deterministic: what is
//                  left when only this kernel is fixed.
// Baselines in the same call: all-deterministic (must be bit-identical) and all-nondeterministic.
//
// After full training one live noise source tends to give about the same churn as all of them
// (tiny differences grow chaotically), so end-of-run churn saturates. Each configuration is
// therefore also measured early: the first step at which the replicas' weights differ bitwise,
// the weight L2 distance after a few fixed steps (1, 10, 100 by default) and the growth rate of
// that distance. A kernel whose atomics cannot change bits at its shapes shows no divergence; a
// knob the network never runs (conv1's bwd_data: the images need no gradient) is "not run"; a
// variant cuDNN refuses for a layer's shape is "unsupported", with cuDNN's list.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/policy.h"
#include "experiments/stats.h"
#include "experiments/train.h"

namespace ditto {

struct Candidate {
  std::string name;                 // "conv2.bwd_filter=algo0", or "all conv2d.bwd_filter=algo0"
  OpKind op;
  std::string knob;                 // "bwd_filter"
  std::string variant;              // the nondeterministic variant (the add-one form runs it)
  std::vector<std::string> layers;  // one layer, or every layer of a group
  bool group = false;
};

// Every (layer, knob, nondeterministic variant) of the layers, in layer order, then (with
// groups) one group per (op kind, knob, variant) that two or more layers share. With `runs`
// non-empty, only the (layer, knob) pairs in it: the knobs a training step actually calls.
std::vector<Candidate> list_candidates(const std::vector<std::pair<std::string, OpKind>>& knob_layers,
                                       bool groups = true,
                                       const std::vector<std::pair<std::string, std::string>>& runs = {});

// What a model's training step calls, found by running one forward and backward pass of a
// 2-image batch on the CPU and reading the manifest: (layer, knob) pairs in first-run order.
// A knob that never runs (conv1's bwd_data: the images need no gradient; bias_bwd of a conv
// without bias) cannot be a source of noise.
std::vector<std::pair<std::string, std::string>> knobs_that_run(const std::string& model, int num_classes,
                                                                int in_channels, int image_size);
// The candidates of a model: its knob layers, filtered by knobs_that_run.
std::vector<Candidate> model_candidates(const std::string& model, int num_classes = 10, int in_channels = 3,
                                        int image_size = 32, bool groups = true);

// The same for a model of any task kind (engine/task_kind.h), probed with the examples of `probe` (a
// Dataset shaped like the training data, e.g. train.h probe_examples): one forward pass, the task's
// loss (experiments/task_scoring.h) and backward, on the CPU. Error when the model cannot train on it.
std::vector<std::pair<std::string, std::string>> knobs_that_run(const std::string& model, const Dataset& probe);
std::vector<Candidate> model_candidates(const std::string& model, const Dataset& probe, bool groups = true);
// A data-parallel run's gradient buckets as candidates (experiments/data_parallel.h): each
// bucket's all-reduce (bucketN.algo=nccl-default) and, with groups, all of them together; empty
// when base trains without data parallelism.
std::vector<Candidate> data_parallel_candidates(const TrainConfig& base, int num_classes = 10, int in_channels = 3,
                                                bool groups = true);

enum class AttributionForm { AddOne, LeaveOneOut };
const char* form_name(AttributionForm f);  // "add-one", "leave-one-out"
AttributionForm parse_form(const std::string& s);  // throws Error listing the forms

// The form's view of the candidates: add-one keeps them all; leave-one-out makes a knob
// deterministic whatever its nondeterministic variant, so it keeps one per (layers, knob),
// named "conv2.bwd_filter" or "all conv2d.bwd_filter".
std::vector<Candidate> candidates_for(const std::vector<Candidate>& all, AttributionForm form);
// The kernels mode and pins of a candidate's configuration in a form.
std::string form_kernels(AttributionForm form);  // "deterministic" | "nondeterministic"
std::vector<std::string> candidate_pins(const Candidate& c, AttributionForm form);

struct AttributeOptions {
  AttributionForm form = AttributionForm::AddOne;
  int replicas = 3;
  std::string out;                          // attribution.{csv,json,svg}; run folders below
  std::vector<int64_t> l2_steps = {1, 10, 100};
  int64_t fingerprint_steps = 1000;         // weights compared bitwise after each step up to here
  int bootstrap = 1000;                     // resamples for the churn interval
  uint64_t bootstrap_seed = 20221;
  bool baselines = true;
  int concurrent = 1;                       // replicas of a configuration at once per GPU
  int gpus = 1;                             // spread replicas over up to this many GPUs ("cuda")
  // One line per finished replica, with an ETA; default: stderr.
  std::function<void(const std::string&)> log;
};

struct ConfigResult {
  std::string name;                 // candidate name, or "all-deterministic" / "all-nondeterministic"
  std::string kind;                 // "baseline" | "candidate" | "group"
  std::string status;               // "ok" | "unsupported" | "not run" | "error"
  std::string message;              // why, for anything but "ok"
  std::string kernels;              // the configuration: mode ...
  std::vector<std::string> pins;    // ... and pins
  std::vector<std::string> run_dirs;
  std::vector<double> accuracy;     // per replica
  Interval churn;                   // mean pairwise churn, bootstrap interval over test examples
  double weight_l2 = 0;             // mean pairwise L2 distance of the final weights
  double accuracy_std = 0;
  int distinct_fingerprints = 0;
  // First step after which not all replicas had bitwise-equal weights: 0 when they stayed equal
  // through the last step compared, fingerprint_steps + 1 when they differed only later.
  int64_t first_divergence_step = 0;
  std::vector<std::pair<int64_t, double>> l2_at;  // (step, mean pairwise weight L2) at l2_steps
  double growth_per_step = 0;       // d ln(L2) / d step between the first and last non-zero l2_at
  double ms_per_step = 0;           // training only (no evaluation, no measuring hooks); with
                                    // concurrent replicas, the time under that load
  double seconds_per_epoch = 0;     // mean logged epoch time (with evaluation); 0 for --steps runs
  bool diverged() const { return status == "ok" && distinct_fingerprints > 1; }
};

struct AttributionResult {
  AttributionForm form = AttributionForm::AddOne;
  std::string model, dataset, device;
  int replicas = 0, epochs = 0;
  int64_t max_steps = 0;
  std::vector<int64_t> l2_steps;
  std::vector<ConfigResult> rows;  // baselines first, then candidates ranked (see rank_rows)
};

// Runs every configuration (baselines, then each candidate) for opts.replicas replicas of base
// under CONTROL seeds. Errors of one configuration (a variant cuDNN refuses) are reported in its
// row; other errors propagate.
AttributionResult attribute(const TrainConfig& base, const std::vector<Candidate>& candidates,
                            const AttributeOptions& opts);

// Ranks candidates, most noise first: measured before not, diverged before not; then the
// earlier first divergence; then the larger weight L2 distance after the first early step (the
// noise a kernel injects before training amplifies it: on the H100 it spans four orders of
// magnitude across kernels, adds in quadrature over a group's members, and does not saturate
// as later distances and end-of-run churn do); then churn. Baselines stay first.
void rank_rows(std::vector<ConfigResult>& rows);

// Reads what write_attribution wrote (attribution.json), e.g. to rank or chart it again.
// Throws DataError naming the file for anything else.
AttributionResult read_attribution(const std::string& path);

// The ranked table as text (what ditto-attribute prints).
std::string format_attribution(const AttributionResult& r);
// attribution.csv, attribution.json, attribution.svg (churn with intervals per configuration)
// and attribution_l2.svg (weight L2 after the first early step, log scale), each written atomically.
void write_attribution(const AttributionResult& r, const std::string& dir);

}  // namespace ditto
