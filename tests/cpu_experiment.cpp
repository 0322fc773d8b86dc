// The ensemble protocols on the CPU (experiments/ensemble.h): metric functions against
// hand-computed values, setting specs, a tiny experiment with every paper setting (CONTROL
// bit-identical, ALGO drifting), resuming an interrupted experiment, figure S4 and overhead.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/error.h"
#include "experiments/ensemble.h"
#include "train_support.h"

using namespace ditto;
using test::metric;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

EnsembleOptions tiny(const std::string& name) {
  EnsembleOptions o;
  o.base = test::synthetic_config("smallcnn", 240, 120, 16, 32);
  o.base.epochs = 1;
  o.replicas = 2;
  o.bootstrap = 200;
  o.verbose = false;
  o.out = test::scratch("cpu_experiment", name);
  fs::remove_all(o.out);
  return o;
}

}  // namespace

TEST_CASE("experiment metrics: agreement, stability, not-all-agree, FPR/FNR by hand") {
  // Three replicas, four examples: all agree; 2 of 3; 2 of 3 (tie broken to the smaller label
  // does not matter for the count); all differ.
  const std::vector<std::vector<int32_t>> p = {{1, 0, 2, 0}, {1, 0, 3, 1}, {1, 4, 3, 2}};
  CHECK(majority_agreement(p) == std::vector<int>{3, 2, 2, 1});
  CHECK(stability_counts(p) == std::vector<int64_t>{1, 2, 1});
  CHECK(not_all_agree(p) == std::vector<double>{0, 1, 1, 1});
  CHECK(plurality_vote(p) == std::vector<int32_t>{1, 0, 3, 0});  // all differ: the smallest label
  // Labels 0 0 1 1 1, predictions 0 1 1 0 1: among negatives 1 FP of 2, among positives 1 FN of 3.
  const std::vector<int32_t> labels = {0, 0, 1, 1, 1}, pred = {0, 1, 1, 0, 1};
  BinaryRates all = binary_rates(pred, labels, std::vector<bool>(5, true));
  CHECK(all.fpr == 0.5);
  CHECK(all.fnr == Approx(1.0 / 3.0));
  BinaryRates some = binary_rates(pred, labels, {true, false, false, true, true});  // no FP possible: 1 negative
  CHECK(some.fpr == 0.0);
  CHECK(some.fnr == 0.5);
  CHECK_THROWS_WITH(binary_rates(pred, labels, {true}), Contains("differ in length"));
}

TEST_CASE("experiment settings: the paper's, custom specs, errors that name the part") {
  REQUIRE(paper_settings().size() == 5);
  Setting impl = parse_setting("impl");
  CHECK(impl.kernels == "heuristic");  // the paper's IMPL: framework defaults
  CHECK(!impl.vary_init);
  CHECK(parse_setting("IMPL-ATOMIC").kernels == "nondeterministic");
  CHECK(parse_setting("ALGO+IMPL").kernels == "heuristic");
  Setting c = parse_setting("conv2-only: seeds=fixed kernels=deterministic pin=conv2.bwd_filter=algo0");
  CHECK(c.name == "conv2-only");
  CHECK(c.kernels == "deterministic");
  CHECK(c.pins == std::vector<std::string>{"conv2.bwd_filter=algo0"});
  Setting o = parse_setting("orders: seeds=order kernels=heuristic");
  CHECK((o.vary_order && !o.vary_init));
  CHECK_THROWS_WITH(parse_setting("algo-x"), Contains("not a named setting"));
  CHECK_THROWS_WITH(parse_setting("x: seeds=sometimes"), Contains("seeds=sometimes"));
  CHECK_THROWS_WITH(parse_setting("x: seeds=fixed kernels=fast"), Contains("kernels=fast"));
  CHECK_THROWS_WITH(parse_setting("x: seeds=fixed colour=red"), Contains("unknown key 'colour'"));
  CHECK_THROWS_WITH(parse_setting("x: kernels=deterministic"), Contains("seeds="));
  CHECK_THROWS(parse_setting("x: seeds=fixed pin=conv2.bwd_filter=algo99"));
}

TEST_CASE("experiment: CONTROL is bit-identical, ALGO drifts; the report says so; resume keeps finished replicas") {
  EnsembleOptions o = tiny("settings");
  for (const char* n : {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"}) o.settings.push_back(parse_setting(n));
  auto data = load_train_data(o.base);
  auto runs = run_settings(o, data);
  REQUIRE(runs.size() == 4);
  ReportData r = summarize(runs, o, *data);
  CHECK(metric(r, "CONTROL", "churn") == 0.0);
  CHECK(metric(r, "CONTROL", "weight_l2") == 0.0);
  CHECK(metric(r, "CONTROL", "distinct_fingerprints") == 1.0);
  CHECK(metric(r, "CONTROL", "disagreement") == 0.0);
  CHECK(metric(r, "ALGO", "churn") > 0.0);
  CHECK(metric(r, "ALGO", "weight_l2") > 0.0);
  CHECK(metric(r, "ALGO", "distinct_fingerprints") == 2.0);
  // The CPU has no atomics: IMPL's replicas agree there (on the GPU they do not).
  CHECK(metric(r, "IMPL", "distinct_fingerprints") == 1.0);
  REQUIRE(r.stability.size() == 4);
  CHECK(r.stability[3].counts == std::vector<int64_t>{0, 120});  // CONTROL: every example 2 of 2
  CHECK(r.curves.size() == 8);                                    // top1 and top5 per setting
  CHECK(!r.manifest["kernels"]["CONTROL"].empty());
  // The four paper settings ran: churn and accuracy variance are decomposed. On the CPU, IMPL
  // and CONTROL are bit-identical, so ALGO+IMPL vs ALGO is all there is.
  REQUIRE(r.decomposition.size() == 2);
  CHECK(r.decomposition[0].measure == "churn");
  CHECK(r.decomposition[1].measure == "accuracy_variance");
  REQUIRE(r.decomposition[0].terms.size() == 7);
  CHECK(r.decomposition[0].terms[0].value == metric(r, "ALGO+IMPL", "churn"));
  CHECK(r.decomposition[0].terms[2].value == 0.0);  // IMPL
  CHECK(r.decomposition[0].terms[6].name == "interaction");
  CHECK(r.decomposition[0].terms[6].value ==
        metric(r, "ALGO+IMPL", "churn") - metric(r, "ALGO", "churn") - 0.0 + 0.0);
  // The examples that move: the least stable first, each with its image and every replica's
  // prediction; none for settings whose replicas all agree.
  std::size_t algo_examples = 0;
  for (const auto& e : r.unstable) {
    CHECK(e.setting != "CONTROL");
    CHECK(e.setting != "IMPL");
    CHECK(e.predicted.size() == 2);
    CHECK(e.predicted[0] != e.predicted[1]);  // two replicas: unstable means they differ
    REQUIRE(e.jpeg.size() > 4);
    CHECK((e.jpeg[0] == 0xFF && e.jpeg[1] == 0xD8));  // a JPEG's start-of-image marker
    algo_examples += e.setting == "ALGO";
  }
  CHECK(algo_examples == std::min<std::size_t>(10, std::size_t(metric(r, "ALGO", "unstable_examples"))));
  CHECK(metric(r, "ALGO", "unstable_examples") == Approx(metric(r, "ALGO", "disagreement") * 120));
  CHECK(metric(r, "CONTROL", "unstable_examples") == 0.0);
  CHECK(metric(r, "CONTROL", "ensemble_accuracy") == metric(r, "CONTROL", "accuracy_mean"));
  // Two replicas: one pair, whose churn is the setting's.
  CHECK(metric(r, "ALGO", "churn_pair_min") == Approx(metric(r, "ALGO", "churn")));
  CHECK(metric(r, "ALGO", "churn_pair_max") == Approx(metric(r, "ALGO", "churn")));
  CHECK(metric(r, "CONTROL", "churn_pair_max") == 0.0);
  CHECK_THROWS(metric(r, "ALGO", "churn_replicas"));  // one pair says nothing about another draw of replicas
  write_report(o.out, r);
  std::ifstream csv(fs::path(o.out) / "report.csv");
  std::stringstream text;
  text << csv.rdbuf();
  CHECK_THAT(text.str(), Contains("CONTROL,churn,0,0,0"));

  // Run again over the same folder: without --resume it refuses; with it, every replica is read
  // back as it finished.
  CHECK_THROWS_WITH(run_settings(o, data), Contains("--resume"));
  o.resume = true;
  auto again = run_settings(o, data);
  for (std::size_t s = 0; s < runs.size(); ++s)
    for (std::size_t k = 0; k < runs[s].runs.size(); ++k) {
      CHECK(again[s].runs[k].weights_fingerprint == runs[s].runs[k].weights_fingerprint);
      CHECK(again[s].runs[k].predictions == runs[s].runs[k].predictions);
      CHECK(again[s].runs[k].weights == runs[s].runs[k].weights);
    }
}

TEST_CASE("experiment: --resume reuses a finished replica only under the settings it was trained with") {
  EnsembleOptions o = tiny("resume-changed");
  o.settings = {parse_setting("CONTROL")};
  auto data = load_train_data(o.base);
  run_settings(o, data);
  o.resume = true;
  auto refused = [&](auto change) {
    EnsembleOptions changed = o;
    change(changed.base);
    return test::error_of([&] { run_settings(changed, data); });
  };
  CHECK_THAT(refused([](TrainConfig& c) { c.lr *= 2; }), Contains("--lr") && Contains("reuse it"));
  CHECK_THAT(refused([](TrainConfig& c) { c.batch_size /= 2; }), Contains("--batch-size"));
  CHECK_THAT(refused([](TrainConfig& c) { c.model = "two-conv"; }), Contains("--model") && Contains("two-conv"));
  CHECK_NOTHROW(run_settings(o, data));  // unchanged: reused as it is
  // Replicas finished with 2 epochs are not the 1-epoch replicas asked for.
  EnsembleOptions longer = o;
  longer.base.epochs = 2;
  run_settings(longer, data);
  CHECK_THAT(refused([](TrainConfig& c) { c.epochs = 1; }), Contains("--epochs"));
}

TEST_CASE("experiment: an interrupted experiment continues its unfinished replicas bit-identically") {
  EnsembleOptions o = tiny("resume");
  o.settings = {parse_setting("CONTROL"), parse_setting("ALGO")};
  o.base.epochs = 2;
  auto data = load_train_data(o.base);
  EnsembleOptions full = o;
  full.out = test::scratch("cpu_experiment", "resume-full");
  fs::remove_all(full.out);
  auto want = run_settings(full, data);
  // "Interrupted" after one epoch: every replica folder holds epoch 1 only.
  EnsembleOptions first = o;
  first.base.epochs = 1;
  run_settings(first, data);
  o.resume = true;
  auto got = run_settings(o, data);
  for (std::size_t s = 0; s < want.size(); ++s)
    for (std::size_t k = 0; k < want[s].runs.size(); ++k) {
      CHECK(got[s].runs[k].weights_fingerprint == want[s].runs[k].weights_fingerprint);
      CHECK(got[s].runs[k].log.size() == 2);
    }
}

TEST_CASE("experiment protocols: figure S4 and overhead") {
  EnsembleOptions o = tiny("fig-s4");
  auto data = load_train_data(o.base);
  FigS4Options fo;
  fo.lrs = {0.05f};
  ReportData f = run_fig_s4(o, fo, data);
  REQUIRE(f.fig_s4.size() == 5);  // four cells and CONTROL
  CHECK(f.fig_s4[0].init == "fixed");
  CHECK(f.fig_s4[0].order == "fixed");
  CHECK(f.fig_s4[0].kernels == "heuristic");
  // On the CPU there is one code path per op: the fixed/fixed cell agrees there (on a GPU its
  // heuristic kernels are what makes it disagree).
  CHECK(f.fig_s4[0].disagreement == 0.0);
  CHECK(f.fig_s4[3].disagreement > 0.0);  // init and order both vary
  CHECK(f.fig_s4[4].line == "CONTROL");
  CHECK(f.fig_s4[4].kernels == "deterministic");
  CHECK(f.fig_s4[4].disagreement == 0.0);
  CHECK_THROWS_WITH(run_fig_s4(o, FigS4Options{{}, 0, false, "heuristic", true}, data), Contains("--lrs"));
  CHECK_THROWS_WITH(run_fig_s4(o, FigS4Options{{0.1f}, 1.0f, false, "heuristic", true}, data), Contains("--momentum"));
  CHECK_THROWS_WITH(run_fig_s4(o, FigS4Options{{0.1f}, 0, true, "heuristic", true}, data), Contains("--nesterov"));

  EnsembleOptions v = tiny("overhead");
  ReportData h = run_overhead(v, {"heuristic", "deterministic"}, 1, 2, data);
  REQUIRE(h.overhead.size() == 2);
  CHECK(h.overhead[0].ratio == 1.0);
  CHECK(h.overhead[1].ms_per_step > 0.0);
  // 240 examples / 32 = 8 steps an epoch: 1 + 10 crosses its end.
  EnsembleOptions w = tiny("overhead-long");
  CHECK_THROWS_WITH(run_overhead(w, {"heuristic"}, 1, 10, data), Contains("--overhead-steps"));
}

namespace {

nlohmann::json manifest_of(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "manifest.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("figure S4: each cell runs the kernels named, with the momentum asked for (the manifests say so)") {
  EnsembleOptions o = tiny("fig-s4-manifests");
  o.base.optimizer = "adam";  // the figure trains with SGD whatever the base says
  o.base.augment = true;
  auto data = load_train_data(o.base);
  FigS4Options fo;
  fo.lrs = {0.02f, 0.04f};
  fo.momentum = 0.9f;
  ReportData f = run_fig_s4(o, fo, data);
  REQUIRE(f.fig_s4.size() == 10);
  int cells = 0;
  for (const float lr : fo.lrs) {
    for (const std::string init : {"fixed", "random"})
      for (const std::string order : {"fixed", "random"})
        for (int k = 0; k < o.replicas; ++k) {
          const std::string dir =
              (fs::path(o.out) / fmt::format("lr{}-{}init-{}order-{}", lr, init, order, k)).string();
          INFO(dir);
          const nlohmann::json m = manifest_of(dir);
          CHECK(m["policy"]["kernels"] == "heuristic");  // the framework default
          CHECK(m["switches"]["deterministic_kernels"] == false);
          CHECK(m["config"]["optimizer"] == "sgd");
          CHECK(m["config"]["momentum"].get<double>() == Approx(0.9));
          CHECK(m["config"]["augment"] == false);
          CHECK(m["config"]["lr_schedule"] == "constant");
          CHECK(m["config"]["lr"].get<double>() == Approx(lr));
          CHECK(m["seeds"]["init"]["source"] == (init == "fixed" ? "deterministic switch" : "flag"));
          CHECK(m["seeds"]["order"]["source"] == (order == "fixed" ? "deterministic switch" : "flag"));
          ++cells;
        }
    for (int k = 0; k < o.replicas; ++k) {
      const std::string dir = (fs::path(o.out) / fmt::format("lr{}-CONTROL-{}", lr, k)).string();
      INFO(dir);
      const nlohmann::json m = manifest_of(dir);
      CHECK(m["policy"]["kernels"] == "deterministic");
      CHECK(m["switches"]["deterministic_kernels"] == true);
      CHECK(m["config"]["momentum"].get<double>() == Approx(0.9));
      CHECK(m["seeds"]["init"]["source"] == "deterministic switch");
      CHECK(m["seeds"]["order"]["source"] == "deterministic switch");
      ++cells;
    }
  }
  CHECK(cells == 2 * 5 * o.replicas);
  // The report's CONTROL line, and the other lines under their cells' kernels.
  const std::string html = report_html(f);
  CHECK(html.find(">CONTROL<") != std::string::npos);
  CHECK(html.find("zero line") != std::string::npos);
  CHECK(report_csv(f).find("\nCONTROL,disagreement@lr0.02,0,,\n") != std::string::npos);
}
