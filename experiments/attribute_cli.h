// ditto-attribute's flags and candidate choice, shared by every front end that attributes churn to
// kernels (examples/ditto-attribute.cpp, the Python package's ditto.attribute): one definition of
// the flags and of --only / --candidate. Header-only like experiments/cli.h (a program that
// includes it links CLI11).
#pragma once
#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "experiments/attribute.h"
#include "experiments/cli.h"

namespace ditto {

// Everything the command line sets.
struct AttributeArgs {
  TrainConfig base;
  TrainFlags flags;
  AttributeOptions opts;
  std::string form = "add-one", out = "runs/attribution", report;
  std::vector<std::string> only, exact;
  bool no_groups = false, list = false, no_checkpoint = false;
};

// The training flags ditto-attribute honours, then its own (a flat table of flag definitions).
inline void add_attribute_flags(CLI::App& app, AttributeArgs& a) {
  a.base.device = "auto";
  add_train_flags(app, a.base, a.flags, kFlagsData | kFlagsOptim | kFlagsRun | kFlagsPins |
                                                kFlagsDataParallel);
  app.add_option("--form", a.form, "add-one | leave-one-out | both")
      ->check(CLI::IsMember({"add-one", "leave-one-out", "both"}))->capture_default_str();
  app.add_option("--replicas", a.opts.replicas, "replicas per configuration")->check(detail::whole(2, 100))->capture_default_str();
  app.add_option("--only", a.only, "keep candidates whose name contains one of these (repeatable, or comma-separated)")
      ->delimiter(',');
  app.add_option("--candidate", a.exact, "keep exactly these candidates (repeatable, or comma-separated)")->delimiter(',');
  app.add_flag("--no-groups", a.no_groups, "no grouped candidates (all layers' same knob)");
  app.add_option("--l2-steps", a.opts.l2_steps, "steps after which the replicas' weight L2 distance is measured")
      ->delimiter(',')->capture_default_str();
  app.add_option("--fingerprint-steps", a.opts.fingerprint_steps, "compare weights bitwise after each step up to here")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--bootstrap", a.opts.bootstrap, "bootstrap resamples for the churn interval (at least 100)")
      ->check(detail::whole(100, 100000000))->capture_default_str();
  app.add_option("--concurrent", a.opts.concurrent,
                 "replicas of a configuration trained at once per GPU (their ms/step is then the time under that load)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--gpus", a.opts.gpus, "spread replicas over up to this many visible GPUs (with --device cuda)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_flag("--no-checkpoint", a.no_checkpoint, "run folders without checkpoint.safetensors (large sweeps)");
  app.add_flag("--list", a.list, "list the candidates and exit");
  app.add_option("--report", a.report, "rank, print and chart an earlier run's attribution.json again (writes beside it)")
      ->check(CLI::ExistingFile);
  app.add_option("--out", a.out, "results and one run folder per replica")
      ->check(detail::output_path())->capture_default_str();
  app.add_flag("--overwrite", a.base.overwrite, "replace the run folders an earlier attribution left in --out");
}

// The model's candidates (and, with data parallelism, the gradient all-reduces), kept by --only
// and --candidate; a --candidate that names none is an Error.
inline std::vector<Candidate> chosen_candidates(const AttributeArgs& a) {
  const TrainConfig& base = a.base;
  // The probe that finds which knobs a step calls runs on a batch shaped like the data.
  const bool synthetic = base.dataset == "synthetic", mnist = base.dataset == "mnist";
  const int classes = synthetic ? base.synthetic_classes
                      : base.dataset == "celeba" ? 2 : base.dataset == "cifar100" ? 100 : 10;
  const int size = synthetic ? base.synthetic_size : mnist ? 28 : base.dataset == "celeba" ? 64 : 32;
  // The other tasks' datasets (and the categorical ones) are probed with two examples shaped alike.
  const auto probe = probe_examples(base);
  std::vector<Candidate> all = probe ? model_candidates(base.model, *probe, !a.no_groups)
                                            : model_candidates(base.model, classes, mnist ? 1 : 3, size, !a.no_groups);
  // With data parallelism the gradient all-reduces are candidates too.
  for (auto& c : data_parallel_candidates(base, classes, mnist ? 1 : 3, !a.no_groups)) all.push_back(c);
  std::vector<Candidate> cands;
  for (const auto& c : all) {
    bool keep = a.only.empty() && a.exact.empty();
    for (const auto& o : a.only) keep = keep || c.name.find(o) != std::string::npos;
    for (const auto& e : a.exact) keep = keep || c.name == e;
    if (keep) cands.push_back(c);
  }
  for (const auto& e : a.exact)
    if (std::none_of(all.begin(), all.end(), [&](const Candidate& c) { return c.name == e; }))
      throw Error("--candidate: '" + e + "' is not a candidate of " + base.model + "; --list shows them");
  return cands;
}

// The forms --form names, in the order they run.
inline std::vector<AttributionForm> chosen_forms(const AttributeArgs& a) {
  std::vector<AttributionForm> forms;
  if (a.form != "leave-one-out") forms.push_back(AttributionForm::AddOne);
  if (a.form != "add-one") forms.push_back(AttributionForm::LeaveOneOut);
  return forms;
}

// The all-deterministic baseline must end bit-identical: what went wrong where it did not ("" when
// it did).
inline std::string baseline_mismatch(const AttributionResult& r) {
  for (const auto& row : r.rows)
    if (row.name == "all-deterministic" && row.status == "ok" && row.distinct_fingerprints != 1)
      return "the all-deterministic baseline is not bit-identical (" + std::to_string(row.distinct_fingerprints) +
             " fingerprints)";
  return "";
}

}  // namespace ditto
