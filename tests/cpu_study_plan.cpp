// A study planned for a Slurm cluster: the plan's tasks, run as the cluster would run them (each
// line of tasks.txt in a shell of its own), give the replicas run_settings trains in-process, bit
// for bit; collecting checks every run folder against the plan and refuses what differs. (The
// real Slurm round trip is tests/slurm_study.sh.)
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "experiments/ensemble.h"
#include "train_support.h"

using namespace ditto;
using test::metric;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) { return test::scratch("cpu_study_plan", name); }

EnsembleOptions study(const std::string& out) {
  EnsembleOptions o;
  o.base = test::synthetic_config("two-conv", 96, 48, 16, 32);
  o.base.loader_threads = 0;
  o.settings = {parse_setting("ALGO"), parse_setting("CONTROL")};
  o.replicas = 2;
  o.out = out;
  o.verbose = false;
  o.bootstrap = 100;
  return o;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

#ifdef DITTO_TRAIN_BINARY
TEST_CASE("a planned study's tasks train the replicas run_settings trains; collect checks them against the plan") {
  const EnsembleOptions local = study(scratch("local"));
  fs::remove_all(local.out);
  auto data = load_train_data(local.base);
  const std::vector<SettingRuns> here = run_settings(local, data);

  const EnsembleOptions planned = study(scratch("planned"));
  fs::remove_all(planned.out);
  const StudyPlanOptions p{DITTO_TRAIN_BINARY, 0, ""};
  REQUIRE(write_study_plan(planned, p) == 4);
  const std::vector<std::string> tasks = lines_of(planned.out + "/tasks.txt");
  REQUIRE(tasks.size() == 4);
  CHECK(tasks[0].rfind(std::string(DITTO_TRAIN_BINARY) + " ", 0) == 0);
  CHECK_THAT(tasks[0], Contains("--device cpu") && Contains("--seed-init 1000"));  // ALGO varies seeds
  CHECK_THAT(tasks[3], Contains("--seed-init 0") && Contains("/CONTROL-1"));
  const std::string sbatch = lines_of(planned.out + "/study.sbatch")[2];
  CHECK(sbatch == "#SBATCH --array=0-3");
  const nlohmann::json plan = nlohmann::json::parse(std::ifstream(planned.out + "/plan.json"));
  CHECK(plan["tasks"][2]["setting"] == "CONTROL");
  // A second plan into the same folder is refused.
  CHECK_THROWS_WITH(write_study_plan(planned, p), Contains("already holds a plan"));

  // Collecting before the tasks ran names the first one and how to resubmit it.
  CHECK_THROWS_WITH(collect_study(planned, p, *data), Contains("task 0 (ALGO replica 0") && Contains("has not run") &&
                                                          Contains("sbatch --array=0"));
  for (const auto& t : tasks) REQUIRE(std::system((t + " > /dev/null 2>&1").c_str()) == 0);
  const std::vector<SettingRuns> there = collect_study(planned, p, *data);
  REQUIRE(there.size() == here.size());
  for (std::size_t s = 0; s < here.size(); ++s)
    for (int k = 0; k < 2; ++k) {
      INFO(here[s].setting.name << " replica " << k);
      CHECK(there[s].runs[std::size_t(k)].weights_fingerprint == here[s].runs[std::size_t(k)].weights_fingerprint);
      CHECK(there[s].runs[std::size_t(k)].predictions == here[s].runs[std::size_t(k)].predictions);
    }
  const ReportData a = summarize(here, local, *data), b = summarize(there, planned, *data);
  for (const char* m : {"churn", "accuracy_mean", "weight_l2", "distinct_fingerprints"})
    for (const char* s : {"ALGO", "CONTROL"}) {
      INFO(m << " " << s);
      CHECK(metric(a, s, m) == metric(b, s, m));
    }

  // Collecting with other flags than the plan's is refused, naming the task and both commands.
  EnsembleOptions other = planned;
  other.base.lr = 1e-3f;
  CHECK_THROWS_WITH(collect_study(other, p, *data), Contains("task 0") && Contains("the plan runs"));
  // A run folder that holds another run than the planned one is refused, naming the flag.
  const std::string ran_other = tasks[1];
  fs::remove_all(planned.out + "/ALGO-1");
  std::string changed = ran_other;
  changed.replace(changed.find("--lr "), std::string("--lr 0.002").size(), "--lr 0.001");
  REQUIRE(std::system((changed + " > /dev/null 2>&1").c_str()) == 0);
  CHECK_THROWS_WITH(collect_study(planned, p, *data),
                    Contains("task 1 (ALGO replica 1") && Contains("not the planned run") && Contains("--lr"));
}

TEST_CASE("figure S4 as a planned study: its cells' tasks give the figure run_fig_s4 gives") {
  FigS4Options f;
  f.lrs = {0.05f};
  EnsembleOptions local = study(scratch("fig-local"));
  fs::remove_all(local.out);
  auto data = load_train_data(local.base);
  const ReportData here = run_fig_s4(local, f, data);

  const FigS4Study planned = fig_s4_study(study(scratch("fig-planned")), f);
  fs::remove_all(planned.o.out);
  REQUIRE(planned.cells.size() == 5);  // four {init} x {order} cells and CONTROL
  const StudyPlanOptions p{DITTO_TRAIN_BINARY, 0, ""};
  REQUIRE(write_study_plan(planned.o, p) == 10);
  const std::vector<std::string> tasks = lines_of(planned.o.out + "/tasks.txt");
  REQUIRE(tasks.size() == 10);
  CHECK_THAT(tasks[0], Contains("--optimizer sgd") && Contains("--lr 0.05") && Contains("--lr-schedule constant"));
  for (const auto& t : tasks) REQUIRE(std::system((t + " > /dev/null 2>&1").c_str()) == 0);
  const ReportData there = fig_s4_report(planned, f, collect_study(planned.o, p, *data), *data);
  REQUIRE(there.fig_s4.size() == here.fig_s4.size());
  for (std::size_t i = 0; i < here.fig_s4.size(); ++i) {
    INFO("cell " << i << ": " << here.fig_s4[i].init << " init, " << here.fig_s4[i].order << " order");
    CHECK(there.fig_s4[i].disagreement == here.fig_s4[i].disagreement);
    CHECK(there.fig_s4[i].kernels == here.fig_s4[i].kernels);
  }
  for (const std::string& s : here.settings) {
    INFO(s);
    CHECK(metric(there, s, "distinct_fingerprints") == metric(here, s, "distinct_fingerprints"));
    CHECK(metric(there, s, "churn") == metric(here, s, "churn"));
  }
}
#endif

TEST_CASE("a study plan refuses what its tasks could not run") {
  EnsembleOptions o = study(scratch("refused"));
  fs::remove_all(o.out);
  CHECK_THROWS_WITH(write_study_plan(o, {"ditto-train", 0, ""}), Contains("by absolute path"));
  CHECK_THROWS_WITH(write_study_plan(o, {"/opt/ditto/bin/ditto-train", 1, ""}),
                    Contains("--device cpu with --slurm-gpus-per-task 1"));
  // Ranks as Slurm tasks need ranks, and one GPU (or CPU) each.
  CHECK_THROWS_WITH(write_study_plan(o, {"/opt/ditto/bin/ditto-train", 0, "", true}), Contains("give --dp-gpus K"));
  o.base.gpus = 2;
  o.base.device = "cuda";
  CHECK_THROWS_WITH(write_study_plan(o, {"/opt/ditto/bin/ditto-train", 2, "", true}),
                    Contains("each rank is a task of one GPU"));
  o.base.gpus = 1;
  o.base.device = "cpu";
  o.tuning = scratch("absent-tuning.json");
  CHECK_THROWS_WITH(write_study_plan(o, {"/opt/ditto/bin/ditto-train", 0, ""}), Contains("tuning file chooses cuDNN"));
  CHECK_FALSE(fs::exists(o.out));  // refused before anything was written
  // A damaged plan is a DataError naming the file, not a crash.
  o.tuning.clear();
  fs::create_directories(o.out);
  std::ofstream(o.out + "/plan.json") << R"({"ditto_study_plan": 1, "tasks": [{"task": 0, "command": 7}]})";
  auto data = load_train_data(o.base);
  CHECK_THROWS_AS(collect_study(o, {"/opt/ditto/bin/ditto-train", 0, ""}, *data), DataError);
  CHECK_THROWS_WITH(collect_study(o, {"/opt/ditto/bin/ditto-train", 0, ""}, *data),
                    Contains("plan.json: not a study plan"));
}
