// ditto-attribute: which layer's which kernel makes two identical runs drift apart, by how much,
// and what removing it costs. See experiments/attribute.h for the two forms and the measures.
//   ditto-attribute --model smallcnn --dataset cifar10 --data DIR --epochs 10 --form both
//   ditto-attribute --model resnet18 ... --steps 100 --replicas 2      (a cheap screen)
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "ditto/experiments.h"
#include "experiments/cli.h"

namespace {

// Everything the command line sets.
struct Args {
  ditto::TrainConfig base;
  ditto::TrainFlags flags;
  ditto::AttributeOptions opts;
  std::string form = "add-one", out = "runs/attribution", report;
  std::vector<std::string> only, exact;
  bool no_groups = false, list = false, no_checkpoint = false;
};

// The training flags ditto-attribute honours, then its own (a flat table of flag definitions).
void add_flags(CLI::App& app, Args& a) {
  a.base.device = "auto";
  ditto::add_train_flags(app, a.base, a.flags, ditto::kFlagsData | ditto::kFlagsOptim | ditto::kFlagsRun | ditto::kFlagsPins |
                                                ditto::kFlagsDataParallel);
  app.add_option("--form", a.form, "add-one | leave-one-out | both")
      ->check(CLI::IsMember({"add-one", "leave-one-out", "both"}))->capture_default_str();
  app.add_option("--replicas", a.opts.replicas, "replicas per configuration")->check(ditto::detail::whole(2, 100))->capture_default_str();
  app.add_option("--only", a.only, "keep candidates whose name contains one of these (repeatable, or comma-separated)")
      ->delimiter(',');
  app.add_option("--candidate", a.exact, "keep exactly these candidates (repeatable, or comma-separated)")->delimiter(',');
  app.add_flag("--no-groups", a.no_groups, "no grouped candidates (all layers' same knob)");
  app.add_option("--l2-steps", a.opts.l2_steps, "steps after which the replicas' weight L2 distance is measured")
      ->delimiter(',')->capture_default_str();
  app.add_option("--fingerprint-steps", a.opts.fingerprint_steps, "compare weights bitwise after each step up to here")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--bootstrap", a.opts.bootstrap, "bootstrap resamples for the churn interval (at least 100)")
      ->check(ditto::detail::whole(100, 100000000))->capture_default_str();
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
      ->check(ditto::detail::output_path())->capture_default_str();
  app.add_flag("--overwrite", a.base.overwrite, "replace the run folders an earlier attribution left in --out");
}

// --report: an earlier attribution.json ranked, printed and charted again beside it.
void report_again(const std::string& path) {
  auto r = ditto::read_attribution(path);
  ditto::rank_rows(r.rows);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  ditto::write_attribution(r, dir.empty() ? "." : dir);
  std::printf("%s", ditto::format_attribution(r).c_str());
}

// The model's candidates (and, with data parallelism, the gradient all-reduces), kept by --only
// and --candidate; a --candidate that names none is an Error.
std::vector<ditto::Candidate> chosen_candidates(const Args& a) {
  const ditto::TrainConfig& base = a.base;
  // The probe that finds which knobs a step calls runs on a batch shaped like the data.
  const bool synthetic = base.dataset == "synthetic", mnist = base.dataset == "mnist";
  const int classes = synthetic ? base.synthetic_classes
                      : base.dataset == "celeba" ? 2 : base.dataset == "cifar100" ? 100 : 10;
  const int size = synthetic ? base.synthetic_size : mnist ? 28 : base.dataset == "celeba" ? 64 : 32;
  // The other tasks' datasets (and the categorical ones) are probed with two examples shaped alike.
  const auto probe = ditto::probe_examples(base);
  std::vector<ditto::Candidate> all = probe ? ditto::model_candidates(base.model, *probe, !a.no_groups)
                                            : ditto::model_candidates(base.model, classes, mnist ? 1 : 3, size, !a.no_groups);
  // With data parallelism the gradient all-reduces are candidates too.
  for (auto& c : ditto::data_parallel_candidates(base, classes, mnist ? 1 : 3, !a.no_groups)) all.push_back(c);
  std::vector<ditto::Candidate> cands;
  for (const auto& c : all) {
    bool keep = a.only.empty() && a.exact.empty();
    for (const auto& o : a.only) keep = keep || c.name.find(o) != std::string::npos;
    for (const auto& e : a.exact) keep = keep || c.name == e;
    if (keep) cands.push_back(c);
  }
  for (const auto& e : a.exact)
    if (std::none_of(all.begin(), all.end(), [&](const ditto::Candidate& c) { return c.name == e; }))
      throw ditto::Error("--candidate: '" + e + "' is not a candidate of " + base.model + "; --list shows them");
  return cands;
}

// One form's attribution: trained, written to out/<form>, printed. False, with a message, when
// the all-deterministic baseline did not end bit-identical.
bool attribute_form(Args& a, const std::vector<ditto::Candidate>& cands, ditto::AttributionForm f) {
  a.opts.form = f;
  auto cs = ditto::candidates_for(cands, f);
  std::printf("%s: %zu candidates + 2 baselines x %d replicas of %s on %s (%s)\n", ditto::form_name(f), cs.size(),
              a.opts.replicas, a.base.model.c_str(), a.base.dataset.c_str(), a.base.device.c_str());
  std::fflush(stdout);
  auto r = ditto::attribute(a.base, cs, a.opts);
  const std::string dir = a.out + "/" + ditto::form_name(f);
  ditto::write_attribution(r, dir);
  std::printf("\n%s\nwrote %s/attribution.{csv,json,svg} and attribution_l2.svg\n\n",
              ditto::format_attribution(r).c_str(), dir.c_str());
  for (const auto& row : r.rows)
    if (row.name == "all-deterministic" && row.status == "ok" && row.distinct_fingerprints != 1) {
      std::fprintf(stderr, "ditto-attribute: the all-deterministic baseline is not bit-identical (%d fingerprints)\n",
                   row.distinct_fingerprints);
      return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ditto-attribute: attribute run-to-run churn to single kernels (add-one / leave-one-out)"};
  app.set_help_all_flag("--help-all");
  add_flags(app, a);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!a.report.empty()) {
      report_again(a.report);
      return 0;
    }
    ditto::apply_train_flags(a.base, a.flags, argc, argv);
    a.base.checkpoint = !a.no_checkpoint;
    const std::vector<ditto::Candidate> cands = chosen_candidates(a);
    if (a.list) {
      for (const auto& c : cands) std::printf("%s\n", c.name.c_str());
      return 0;
    }
    std::vector<ditto::AttributionForm> forms;
    if (a.form != "leave-one-out") forms.push_back(ditto::AttributionForm::AddOne);
    if (a.form != "add-one") forms.push_back(ditto::AttributionForm::LeaveOneOut);
    a.opts.out = a.out;
    for (auto f : forms)
      if (!attribute_form(a, cands, f)) return 1;
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-attribute: %s\n", e.what());
    return 2;
  }
}
