// ditto-attribute: which layer's which kernel makes two identical runs drift apart, by how much,
// and what removing it costs. See experiments/attribute.h for the two forms and the measures.
//   ditto-attribute --model smallcnn --dataset cifar10 --data DIR --epochs 10 --form both
//   ditto-attribute --model resnet18 ... --steps 100 --replicas 2      (a cheap screen)
#include <cstdio>
#include <filesystem>

#include "ditto/experiments.h"
#include "experiments/attribute_cli.h"

namespace {

// --report: an earlier attribution.json ranked, printed and charted again beside it.
void report_again(const std::string& path) {
  auto r = ditto::read_attribution(path);
  ditto::rank_rows(r.rows);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  ditto::write_attribution(r, dir.empty() ? "." : dir);
  std::printf("%s", ditto::format_attribution(r).c_str());
}

// One form's attribution: trained, written to out/<form>, printed. False, with a message, when
// the all-deterministic baseline did not end bit-identical.
bool attribute_form(ditto::AttributeArgs& a, const std::vector<ditto::Candidate>& cands, ditto::AttributionForm f) {
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
  const std::string mismatch = ditto::baseline_mismatch(r);
  if (!mismatch.empty()) std::fprintf(stderr, "ditto-attribute: %s\n", mismatch.c_str());
  return mismatch.empty();
}

}  // namespace

int main(int argc, char** argv) {
  ditto::AttributeArgs a;
  CLI::App app{"ditto-attribute: attribute run-to-run churn to single kernels (add-one / leave-one-out)"};
  app.set_help_all_flag("--help-all");
  ditto::add_attribute_flags(app, a);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!a.report.empty()) {
      report_again(a.report);
      return 0;
    }
    ditto::apply_train_flags(a.base, a.flags, argc, argv);
    a.base.checkpoint = !a.no_checkpoint;
    const std::vector<ditto::Candidate> cands = ditto::chosen_candidates(a);
    if (a.list) {
      for (const auto& c : cands) std::printf("%s\n", c.name.c_str());
      return 0;
    }
    a.opts.out = a.out;
    for (auto f : ditto::chosen_forms(a))
      if (!attribute_form(a, cands, f)) return 1;
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-attribute: %s\n", e.what());
    return 2;
  }
}
