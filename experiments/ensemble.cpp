#include "experiments/ensemble.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "datasets/dataset.h"
#include "datasets/stream.h"
#include "engine/context.h"
#include "engine/error.h"
#include "experiments/decomposition.h"
#include "experiments/run_dir.h"
#include "experiments/scheduler.h"
#include "experiments/stats.h"
#include "experiments/task_scoring.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string upper(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// Folder names: "ALGO+IMPL" is not a good path component on every system.
std::string folder_of(const std::string& setting) {
  std::string s;
  for (char ch : setting) s += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.') ? ch : '_';
  return s;
}

std::string replica_dir(const EnsembleOptions& o, const Setting& s, int k) {
  return (fs::path(o.out) / fmt::format("{}-{}", folder_of(s.name), k)).string();
}

TrainConfig replica_config(const EnsembleOptions& o, const Setting& s, int k) {
  TrainConfig c = o.base;
  c.kernels = s.kernels;
  c.pins.insert(c.pins.end(), s.pins.begin(), s.pins.end());
  if (s.lr > 0) c.lr = s.lr;
  if (s.kernels == "deterministic" && s.pins.empty()) c.tuning = o.tuning;
  // Distinct, recorded seeds where the setting varies them (a replica replays exactly); fixed
  // (0) where it does not.
  if (s.vary_init)
    c.seed_init = 1000 + static_cast<uint64_t>(k);
  else
    c.deterministic_init = true;
  if (s.vary_order) {
    c.seed_order = 2000 + static_cast<uint64_t>(k);
    c.seed_augment = 3000 + static_cast<uint64_t>(k);
  } else {
    c.deterministic_input = true;
  }
  c.out = replica_dir(o, s, k);
  c.command_line = fmt::format("ditto-experiment setting {} replica {}", s.name, k);
  return c;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json::object();
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed JSON at byte {}: {}", path, e.byte, e.what()));
  }
}

// What the summary needs from several replicas' per-example predictions.
std::vector<std::vector<int32_t>> predictions_of(const SettingRuns& s) {
  std::vector<std::vector<int32_t>> p;
  for (const auto& r : s.runs) p.push_back(r.predictions);
  return p;
}

ReportDecomposition report_decomposition(const NoiseDecomposition& d, const std::string& intervals) {
  ReportDecomposition r;
  r.measure = d.measure;
  r.verdict = d.verdict;
  r.intervals = intervals;
  for (const auto& [term, i] : std::vector<std::pair<std::string, Interval>>{{"ALGO+IMPL", d.algo_impl},
                                                                            {"ALGO", d.algo},
                                                                            {"IMPL", d.impl},
                                                                            {"CONTROL", d.control},
                                                                            {"excess", d.excess},
                                                                            {"additive", d.additive},
                                                                            {"interaction", d.interaction}})
    r.terms.push_back({term, i.value, i.low, i.high});
  return r;
}

}  // namespace

const std::vector<Setting>& paper_settings() {
  static const std::vector<Setting> s = {{"ALGO+IMPL", true, true, "heuristic", {}, 0},
                                         {"ALGO", true, true, "deterministic", {}, 0},
                                         {"IMPL", false, false, "heuristic", {}, 0},
                                         {"IMPL-ATOMIC", false, false, "nondeterministic", {}, 0},
                                         {"CONTROL", false, false, "deterministic", {}, 0}};
  return s;
}

Setting parse_setting(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) {
    for (const auto& s : paper_settings())
      if (upper(spec) == s.name) return s;
    throw Error(fmt::format("--setting '{}': not a named setting (ALGO+IMPL, ALGO, IMPL, IMPL-ATOMIC, CONTROL) and "
                            "no 'NAME: seeds=... kernels=... pin=...' spec",
                            spec));
  }
  Setting s;
  s.name = spec.substr(0, colon);
  s.name.erase(0, s.name.find_first_not_of(' '));
  s.name.erase(s.name.find_last_not_of(' ') + 1);
  if (s.name.empty()) throw Error(fmt::format("--setting '{}': the name before ':' is empty", spec));
  std::istringstream words(spec.substr(colon + 1));
  std::string w;
  bool have_seeds = false;
  while (words >> w) {
    const auto eq = w.find('=');
    if (eq == std::string::npos)
      throw Error(fmt::format("--setting '{}': '{}' is not KEY=VALUE (keys: seeds, kernels, pin)", spec, w));
    const std::string key = w.substr(0, eq), value = w.substr(eq + 1);
    if (key == "seeds") {
      have_seeds = true;
      if (value == "fixed") {
        s.vary_init = s.vary_order = false;
      } else if (value == "random") {
        s.vary_init = s.vary_order = true;
      } else if (value == "init") {
        s.vary_init = true, s.vary_order = false;
      } else if (value == "order") {
        s.vary_init = false, s.vary_order = true;
      } else {
        throw Error(fmt::format("--setting '{}': seeds={} (valid: fixed, random, init, order)", spec, value));
      }
    } else if (key == "kernels") {
      SelectMode mode;
      if (!parse_mode_word(value, mode))
        throw Error(fmt::format("--setting '{}': kernels={} (valid: {})", spec, value, fmt::join(mode_words(), ", ")));
      s.kernels = value;
    } else if (key == "pin") {
      if (value.find('=') == std::string::npos)
        throw Error(fmt::format("--setting '{}': pin={} is not LAYER.KNOB=VARIANT", spec, value));
      Policy::parse({value});  // the rule's syntax and variant now; its layer when replicas train
      s.pins.push_back(value);
    } else {
      throw Error(fmt::format("--setting '{}': unknown key '{}' (keys: seeds, kernels, pin)", spec, key));
    }
  }
  if (!have_seeds) throw Error(fmt::format("--setting '{}': say seeds=fixed|random|init|order", spec));
  return s;
}

namespace {

// Per example, the plurality label (ties: the smallest) and how many replicas predict it.
std::vector<std::pair<int32_t, int>> plurality(const std::vector<std::vector<int32_t>>& p, const char* what) {
  if (p.empty()) return {};
  const std::size_t n = p[0].size();
  for (const auto& r : p)
    if (r.size() != n) throw Error(fmt::format("{}: replicas predict different numbers of examples", what));
  std::vector<std::pair<int32_t, int>> out(n, {0, 0});
  for (std::size_t i = 0; i < n; ++i) {
    std::map<int32_t, int> votes;
    for (const auto& r : p) ++votes[r[i]];
    for (const auto& [label, v] : votes)
      if (v > out[i].second) out[i] = {label, v};  // map order: ties keep the smallest label
  }
  return out;
}

}  // namespace

std::vector<int> majority_agreement(const std::vector<std::vector<int32_t>>& p) {
  std::vector<int> out;
  for (const auto& [label, votes] : plurality(p, "majority_agreement")) out.push_back(votes);
  return out;
}

std::vector<int32_t> plurality_vote(const std::vector<std::vector<int32_t>>& p) {
  std::vector<int32_t> out;
  for (const auto& [label, votes] : plurality(p, "plurality_vote")) out.push_back(label);
  return out;
}

std::vector<int64_t> stability_counts(const std::vector<std::vector<int32_t>>& p) {
  std::vector<int64_t> counts(p.size(), 0);
  for (int a : majority_agreement(p)) ++counts[static_cast<std::size_t>(a - 1)];
  return counts;
}

std::vector<double> not_all_agree(const std::vector<std::vector<int32_t>>& p) {
  std::vector<double> out;
  for (int a : majority_agreement(p)) out.push_back(a == static_cast<int>(p.size()) ? 0.0 : 1.0);
  return out;
}

BinaryRates binary_rates(const std::vector<int32_t>& predicted, const std::vector<int32_t>& labels,
                         const std::vector<bool>& mask) {
  if (predicted.size() != labels.size() || mask.size() != labels.size())
    throw Error("binary_rates: predictions, labels and mask differ in length");
  double fp = 0, tn = 0, fn = 0, tp = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (!mask[i]) continue;
    if (labels[i] == 0) (predicted[i] == 0 ? tn : fp) += 1;
    else (predicted[i] == 1 ? tp : fn) += 1;
  }
  return {fp + tn > 0 ? fp / (fp + tn) : 0.0, fn + tp > 0 ? fn / (fn + tp) : 0.0};
}

namespace {

// --tuning: when a setting takes its convolutions from the tuning file and the file does not exist
// yet, one epoch on `device` writes it before any replica starts. One epoch meets every problem
// the replicas will (full batches, the final partial batch, evaluation); the replicas then only
// read the file, so they choose alike.
void tune_once(const EnsembleOptions& o, const std::string& device, const std::shared_ptr<const TrainData>& data) {
  bool any = false;
  for (const auto& s : o.settings) any = any || (s.kernels == "deterministic" && s.pins.empty());
  if (!any || fs::exists(o.tuning)) return;
  if (o.base.device == "cpu")
    throw Error("--tuning: a tuning file chooses cuDNN algorithms; this experiment runs on the CPU");
  TrainConfig t = o.base;
  t.device = device;
  t.kernels = "deterministic";
  t.tuning = o.tuning;
  t.epochs = 1;
  t.warmup_epochs = 0;  // the schedule does not change which problems an epoch meets
  t.max_steps = 0;
  t.out.clear();
  t.progress = false;
  t.deterministic_init = t.deterministic_input = true;
  if (o.verbose) std::printf("tuning the deterministic convolutions into %s (one epoch)\n", o.tuning.c_str());
  train(t, {}, data);
}

}  // namespace

std::vector<SettingRuns> run_settings(const EnsembleOptions& o, const std::shared_ptr<const TrainData>& data,
                                      double* wall_seconds) {
  if (o.settings.empty()) throw Error("ditto-experiment: no settings to run");
  if (o.replicas < 1) throw Error(fmt::format("--replicas: must be at least 1, got {}", o.replicas));
  if (o.out.empty()) throw Error("--out: the experiment needs a folder");
  std::set<std::string> names;
  for (const auto& s : o.settings)
    if (!names.insert(folder_of(s.name)).second)
      throw Error(fmt::format("--setting: two settings are named '{}'", s.name));
  if (!o.resume)
    for (const auto& s : o.settings)
      for (int k = 0; k < o.replicas; ++k)
        if (fs::exists(replica_dir(o, s, k)))
          throw Error(fmt::format("--out: {} already holds replica {} of {}; pass --resume to keep finished replicas and "
                                  "continue the others, or choose another folder",
                                  o.out, k, s.name));
  const std::vector<std::string> devices = replica_devices(o.base.device, o.gpus);
  make_output_folder(o.out);  // after the checks: a refused experiment leaves no folder behind
  if (!o.tuning.empty()) tune_once(o, devices.front(), data);

  const int jobs = static_cast<int>(o.settings.size()) * o.replicas;
  std::vector<TrainResult> all(static_cast<std::size_t>(jobs));
  std::mutex print_mu;
  int ended = 0;  // replicas ended so far (under print_mu)
  const auto t0 = std::chrono::steady_clock::now();
  run_jobs(jobs, devices, o.concurrent, [&](int j, const std::string& dev) {
    const Setting& s = o.settings[static_cast<std::size_t>(j / o.replicas)];
    const int k = j % o.replicas;
    TrainConfig c = replica_config(o, s, k);
    c.device = dev;
    if (o.concurrent > 1 || devices.size() > 1 || !o.verbose) c.progress = false;
    std::string what = "training";
    if (o.resume && fs::exists(fs::path(c.out) / "manifest.json")) {
      int done = 0;
      TrainResult finished = read_run_result(c.out, *data, &done);
      if (done >= c.epochs && (c.max_steps == 0 || !finished.log.empty())) {
        check_reused_run(c.out, read_run_manifest((fs::path(c.out) / "manifest.json").string()), c);
        all[static_cast<std::size_t>(j)] = std::move(finished);
        what = "finished earlier";
      } else {
        c.resume = c.out;
        what = fmt::format("resuming after epoch {}", done);
      }
    }
    if (o.verbose) {
      std::lock_guard<std::mutex> lk(print_mu);
      std::printf("[%s] replica %d/%d: %s%s\n", s.name.c_str(), k + 1, o.replicas, what.c_str(),
                  devices.size() > 1 ? (" on " + dev).c_str() : "");
      std::fflush(stdout);
    }
    if (what != "finished earlier") all[static_cast<std::size_t>(j)] = train(c, {}, data);
    if (o.on_replica) {
      std::lock_guard<std::mutex> lk(print_mu);
      o.on_replica(s.name, k, ++ended, jobs);
    }
  });
  if (wall_seconds) *wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<SettingRuns> out;
  for (std::size_t si = 0; si < o.settings.size(); ++si) {
    SettingRuns r{o.settings[si], {}};
    for (int k = 0; k < o.replicas; ++k) r.runs.push_back(std::move(all[si * o.replicas + k]));
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// A planned task's config: replica_config on the device its Slurm task has.
// With dp_processes every rank is a task of its own: its device is the one GPU it sees ("cuda",
// which --dp-launch resolves by SLURM_LOCALID among the GPUs visible to it) or the CPU.
TrainConfig planned_config(const EnsembleOptions& o, const StudyPlanOptions& p, const Setting& s, int k) {
  TrainConfig c = replica_config(o, s, k);
  c.device = p.gpus_per_task > 0 ? (p.dp_processes ? "cuda" : "cuda:0") : "cpu";
  if (p.dp_processes) c.dp_launch = "slurm";
  return c;
}

// The ditto-train command of a planned task: its replay line (defining flags, seeds) run by the
// plan's binary into its run folder; under dp_processes started by srun as the array task's ranks
// (one ending in error ends the others).
std::string planned_command(const TrainConfig& c, const StudyPlanOptions& p) {
  const std::string replay = replay_line(c, c.seed_init.value_or(0), c.seed_order.value_or(0), c.seed_augment.value_or(0));
  return (p.dp_processes ? fmt::format("srun --ntasks={} --kill-on-bad-exit=1 ", c.gpus) : std::string()) +
         shell_word(p.train_binary) + replay.substr(std::string("ditto-train").size()) + " --out " + shell_word(c.out);
}

struct PlannedTask {
  std::size_t setting;
  int replica;
  TrainConfig config;
  std::string command;
};

std::vector<PlannedTask> planned_tasks(const EnsembleOptions& o, const StudyPlanOptions& p) {
  if (o.settings.empty()) throw Error("ditto-experiment: no settings to plan");
  if (o.out.empty()) throw Error("--out: the study needs a folder");
  if (p.train_binary.empty() || !fs::path(p.train_binary).is_absolute())
    throw Error(fmt::format("the study's tasks run ditto-train by absolute path; '{}' is not one", p.train_binary));
  if (p.gpus_per_task < 0) throw Error("--slurm-gpus-per-task: must be 0 (CPU replicas) or more");
  const bool cpu_asked = o.base.device == "cpu";
  const bool gpu_asked = o.base.device.rfind("cuda", 0) == 0;
  if (cpu_asked && p.gpus_per_task > 0)
    throw Error(fmt::format("--device cpu with --slurm-gpus-per-task {}: CPU replicas take no GPU; leave one out",
                            p.gpus_per_task));
  if (gpu_asked && p.gpus_per_task == 0)
    throw Error(fmt::format("--device {}: a GPU replica needs --slurm-gpus-per-task 1 (or more)", o.base.device));
  if (p.dp_processes && o.base.gpus < 2)
    throw Error("--slurm-dp-launch: the replicas' data-parallel ranks become Slurm tasks; give --dp-gpus K (2 or more)");
  if (p.dp_processes && p.gpus_per_task > 1)
    throw Error(fmt::format("--slurm-dp-launch with --slurm-gpus-per-task {}: each rank is a task of one GPU; give 1",
                            p.gpus_per_task));
  std::set<std::string> names;
  for (const auto& s : o.settings)
    if (!names.insert(folder_of(s.name)).second)
      throw Error(fmt::format("--setting: two settings are named '{}'", s.name));
  std::vector<PlannedTask> tasks;
  for (std::size_t si = 0; si < o.settings.size(); ++si)
    for (int k = 0; k < o.replicas; ++k) {
      TrainConfig c = planned_config(o, p, o.settings[si], k);
      if (c.device == "cpu" && !c.tuning.empty())
        throw Error("--tuning: a tuning file chooses cuDNN algorithms; this study's replicas run on the CPU");
      tasks.push_back({si, k, c, planned_command(c, p)});
    }
  return tasks;
}

std::string plan_path(const EnsembleOptions& o) { return (fs::path(o.out) / "plan.json").string(); }

}  // namespace

int write_study_plan(const EnsembleOptions& o, const StudyPlanOptions& p) {
  if (o.replicas < 1) throw Error(fmt::format("--replicas: must be at least 1, got {}", o.replicas));
  const std::vector<PlannedTask> tasks = planned_tasks(o, p);
  if (fs::exists(plan_path(o)))
    throw Error(fmt::format("--out: {} already holds a plan; collect it (--collect) or choose another folder", o.out));
  for (const auto& t : tasks)
    if (fs::exists(t.config.out))
      throw Error(fmt::format("--out: {} already holds replica {} of {}; choose another folder", o.out, t.replica,
                              o.settings[t.setting].name));
  if (!o.tuning.empty() && !fs::exists(o.tuning))
    throw Error(fmt::format("--tuning: {} does not exist; a planned study only reads a tuning file (tune it first: "
                            "ditto-train --steps 20 --kernels deterministic --tuning {} ... on one GPU of the cluster)",
                            o.tuning, o.tuning));
  make_output_folder(o.out);
  make_output_folder((fs::path(o.out) / "slurm").string());
  json list = json::array();
  std::string lines;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const PlannedTask& t = tasks[i];
    list.push_back({{"task", i}, {"setting", o.settings[t.setting].name}, {"replica", t.replica},
                    {"run", fs::path(t.config.out).filename().string()}, {"command", t.command}});
    lines += t.command + "\n";
  }
  json settings = json::array();
  for (const auto& s : o.settings) settings.push_back(s.name);
  const json plan{{"ditto_study_plan", 1},  {"command", o.base.command_line}, {"settings", settings},
                  {"replicas", o.replicas}, {"train_binary", p.train_binary}, {"gpus_per_task", p.gpus_per_task},
                  {"ranks_per_replica", p.dp_processes ? o.base.gpus : 1},
                  {"partition", p.partition}, {"tasks", list}};
  const fs::path out = fs::absolute(o.out);
  std::string sbatch = "#!/bin/bash\n";
  sbatch += fmt::format("#SBATCH --job-name=ditto-study\n#SBATCH --array=0-{}\n", tasks.size() - 1);
  sbatch += fmt::format("#SBATCH --output={}\n", (out / "slurm" / "%A_%a.out").string());
  // Under --slurm-dp-launch a replica's K ranks are K tasks (srun in the script starts them).
  sbatch += fmt::format("#SBATCH --ntasks={}\n", p.dp_processes ? o.base.gpus : 1);
  if (p.gpus_per_task > 0) sbatch += fmt::format("#SBATCH --gpus-per-task={}\n", p.gpus_per_task);
  if (!p.partition.empty()) sbatch += fmt::format("#SBATCH --partition={}\n", p.partition);
  sbatch += "# One replica per array task: line SLURM_ARRAY_TASK_ID + 1 of tasks.txt, its exact ditto-train\n";
  sbatch += "# command. Collect with the planning command and --collect once every task has ended.\n";
  sbatch += "set -euo pipefail\n";
  sbatch += fmt::format("line=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" {})\n", shell_word((out / "tasks.txt").string()));
  sbatch += "[ -n \"$line\" ] || { echo \"no task $SLURM_ARRAY_TASK_ID in tasks.txt\" >&2; exit 2; }\n";
  sbatch += "eval \"$line\"\n";
  write_file_atomic((out / "tasks.txt").string(), lines);
  write_file_atomic((out / "study.sbatch").string(), sbatch);
  write_file_atomic(plan_path(o), plan.dump(1) + "\n");  // last: a plan file means a complete plan
  return static_cast<int>(tasks.size());
}

std::vector<SettingRuns> collect_study(const EnsembleOptions& o, const StudyPlanOptions& p, const TrainData& data) {
  const std::vector<PlannedTask> tasks = planned_tasks(o, p);
  if (!fs::exists(plan_path(o)))
    throw Error(fmt::format("--collect: {} holds no plan.json; plan the study first (--plan)", o.out));
  const json plan = read_json(plan_path(o));
  // The planned commands, read once: a hand-edited or damaged plan is a DataError naming the file.
  std::vector<std::string> planned_commands;
  std::string planned_with;
  try {
    planned_with = plan.value("command", std::string("?"));
    for (const json& t : plan.at("tasks")) planned_commands.push_back(t.at("command").get<std::string>());
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not a study plan of ditto-experiment --plan: {}", plan_path(o), e.what()));
  }
  if (planned_commands.size() != tasks.size())
    throw Error(fmt::format("--collect: {} plans {} tasks; these flags make {} (settings x replicas): collect with the "
                            "flags it was planned with ({})",
                            plan_path(o), planned_commands.size(), tasks.size(), planned_with));
  std::vector<SettingRuns> out;
  for (const auto& s : o.settings) out.push_back({s, {}});
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const PlannedTask& t = tasks[i];
    const std::string what = fmt::format("task {} ({} replica {}, {})", i, o.settings[t.setting].name, t.replica,
                                         t.config.out);
    const std::string& planned = planned_commands[i];
    if (planned != t.command)
      throw Error(fmt::format("--collect: {}: the plan runs\n  {}\nbut these flags make\n  {}\ncollect with the "
                              "flags it was planned with ({})",
                              what, planned, t.command, planned_with));
    const std::string manifest = (fs::path(t.config.out) / "manifest.json").string();
    if (!fs::exists(manifest))
      throw Error(fmt::format("--collect: {} has not run (no manifest.json); its log is in {}/slurm; resubmit it: "
                              "sbatch --array={} {}/study.sbatch",
                              what, o.out, i, o.out));
    int done = 0;
    TrainResult r = read_run_result(t.config.out, data, &done);
    if (done < t.config.epochs || (t.config.max_steps && r.log.empty()))
      throw Error(fmt::format("--collect: {} stopped after {} of {} epochs; resubmit it: sbatch --array={} "
                              "{}/study.sbatch",
                              what, done, t.config.epochs, i, o.out));
    try {
      check_reused_run(t.config.out, read_run_manifest(manifest), t.config);
    } catch (const Error& e) {
      throw Error(fmt::format("--collect: {} is not the planned run: {}", what, e.what()));
    }
    out[t.setting].runs.push_back(std::move(r));
  }
  return out;
}

namespace {

// Each replica's accuracy over the units `selected` picks: the share of them it predicts as
// `truth` says (0 where none are picked).
template <class Selected>
std::vector<double> accuracy_where(const std::vector<TrainResult>& runs, const std::vector<int32_t>& truth,
                                   std::size_t n, const Selected& selected) {
  std::vector<double> v;
  for (const auto& r : runs) {
    double hit = 0, cnt = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (selected(i)) cnt += 1, hit += r.predictions[i] == truth[i];
    v.push_back(cnt ? hit / cnt : 0.0);
  }
  return v;
}

// Test example i's image as a JPEG; a streamed test set decodes its evaluation view
// (datasets/stream.h).
std::vector<uint8_t> example_jpeg(const Dataset& test, std::size_t i) {
  const std::vector<uint8_t> shown =
      test.streamed() ? test.source->eval_image(static_cast<int64_t>(i)) : std::vector<uint8_t>();
  return encode_jpeg(test.streamed() ? shown.data() : test.image(static_cast<int64_t>(i)), test.channels, test.height,
                     test.width);
}

// The test set as the summary counts it. Predictions are units (experiments/task_scoring.h): examples, or
// a segmentation's pixels, which the intervals resample image by image.
struct TestUnits {
  const Dataset& test;
  Task task;
  std::size_t per;              // units per example
  std::vector<int32_t> labels;  // one per unit
  std::size_t n;                // units in all
};

TestUnits test_units(const Dataset& test) {
  std::vector<int32_t> labels = unit_labels(test);
  const std::size_t n = labels.size();
  return {test, test.task, static_cast<std::size_t>(units_per_example(test)), std::move(labels), n};
}

// One setting's part of the report, added stage by stage. Every bootstrap interval takes the next
// seed from `seed`, so summarize calls the stages in one fixed order and the intervals repeat.
class SettingSummary {
 public:
  SettingSummary(ReportData& rep, const SettingRuns& sr, const EnsembleOptions& o, const TestUnits& u, uint64_t& seed)
      : rep_(rep), sr_(sr), o_(o), u_(u), seed_(seed), name_(sr.setting.name), preds_(predictions_of(sr)) {}

  // Churn and the not-all-agree fraction, with bootstrap intervals, and the lowest and highest
  // churn of one replica pair: the interval resamples test examples for these replicas, the pair
  // range shows how much the replicas drawn move it (with few replicas, more than the interval),
  // and churn_replicas gives that an interval (stats.h, churn_replica_interval).
  void add_agreement() {
    interval("churn", churn_interval(preds_, o_.bootstrap, seed_++, 0.95, u_.per));
    std::vector<double> pairs;
    for (std::size_t a = 0; a < preds_.size(); ++a)
      for (std::size_t b = a + 1; b < preds_.size(); ++b) pairs.push_back(churn(preds_[a], preds_[b]));
    if (!pairs.empty()) {
      metric("churn_pair_min", *std::min_element(pairs.begin(), pairs.end()));
      metric("churn_pair_max", *std::max_element(pairs.begin(), pairs.end()));
    }
    // The interval for another draw of replicas (the jackknife over them), from three replicas on.
    if (preds_.size() >= 3) interval("churn_replicas", churn_replica_interval(preds_));
    interval("disagreement", bootstrap_mean(group_means(not_all_agree(preds_), u_.per), o_.bootstrap, seed_++));
  }

  // Accuracy mean and std (over replicas), the secondary score, weight L2 between replicas,
  // distinct fingerprints and seconds per epoch.
  void add_scores() {
    std::vector<double> acc, top5;
    std::set<Fingerprint> prints;
    double secs = 0;
    int epochs = 0;
    for (const auto& r : sr_.runs) {
      acc.push_back(r.test_top1);
      top5.push_back(r.log.empty() ? 0.0 : r.log.back().test_top5);
      prints.insert(r.weights_fingerprint);
      for (const auto& e : r.log) secs += e.seconds, ++epochs;
    }
    metric("accuracy_mean", mean(acc));
    interval("accuracy_std", bootstrap_stddev(acc, o_.bootstrap, seed_++));
    metric(fmt::format("{}_mean", secondary_score(u_.task)), mean(top5));
    std::vector<double> l2;
    for (std::size_t a = 0; a < sr_.runs.size(); ++a)
      for (std::size_t c = a + 1; c < sr_.runs.size(); ++c)
        if (!sr_.runs[a].weights.empty() && sr_.runs[a].weights.size() == sr_.runs[c].weights.size())
          l2.push_back(l2_distance(sr_.runs[a].weights, sr_.runs[c].weights));
    if (!l2.empty()) metric("weight_l2", mean(l2));
    metric("distinct_fingerprints", static_cast<double>(prints.size()));
    metric("seconds_per_epoch", epochs ? secs / epochs : 0.0);
  }

  // Curves of both scores: per epoch, the mean and the lowest / highest replica.
  void add_curves() {
    for (const char* m : {primary_score(u_.task), secondary_score(u_.task)}) {
      ReportCurve cv{name_, m, {}, {}, {}, {}};
      const bool first = std::string(m) == primary_score(u_.task);
      const std::size_t ne = sr_.runs.empty() ? 0 : sr_.runs[0].log.size();
      for (std::size_t e = 0; e < ne; ++e) {
        std::vector<double> v;
        for (const auto& r : sr_.runs)
          if (e < r.log.size()) v.push_back(first ? r.log[e].test_top1 : r.log[e].test_top5);
        cv.epochs.push_back(sr_.runs[0].log[e].epoch);
        cv.mean.push_back(mean(v));
        cv.low.push_back(*std::min_element(v.begin(), v.end()));
        cv.high.push_back(*std::max_element(v.begin(), v.end()));
      }
      rep_.curves.push_back(cv);
    }
  }

  // The spread across replicas of per class accuracy (a segmentation's per pixel class; a
  // sequence's per label length).
  void add_class_spreads() {
    const Dataset& test = u_.test;
    if (u_.task != Task::Sequence) {
      for (std::size_t c = 0; c < test.class_names.size(); ++c)
        spread("class", test.class_names[c], "accuracy",
               accuracy_where(sr_.runs, u_.labels, u_.n, [&](std::size_t i) { return u_.labels[i] == int32_t(c); }));
      return;
    }
    const std::set<int32_t> lengths(test.labels.begin(), test.labels.end());
    for (int32_t len : lengths)
      spread("length", fmt::format("{} symbols", len), "accuracy",
             accuracy_where(sr_.runs, u_.labels, u_.n, [&](std::size_t i) { return test.labels[i] == len; }));
  }

  // The spread across replicas of per subgroup accuracy (and FPR / FNR on two-class data), and of
  // per class x subgroup cell accuracy.
  void add_subgroup_spreads() {
    const Dataset& test = u_.test;
    if (!test.has_subgroups()) return;
    const std::size_t n = u_.n;
    for (std::size_t g = 0; g < test.subgroup_names.size(); ++g) {
      std::vector<bool> mask(n);
      for (std::size_t i = 0; i < n; ++i) mask[i] = test.subgroups[i] == int32_t(g);
      const std::string& group = test.subgroup_names[g];
      spread("subgroup", group, "accuracy",
             accuracy_where(sr_.runs, test.labels, n, [&](std::size_t i) { return bool(mask[i]); }));
      if (test.num_classes == 2) {
        std::vector<double> fpr, fnr;
        for (const auto& r : sr_.runs) {
          const BinaryRates br = binary_rates(r.predictions, test.labels, mask);
          fpr.push_back(br.fpr);
          fnr.push_back(br.fnr);
        }
        spread("subgroup", group, "fpr", fpr);
        spread("subgroup", group, "fnr", fnr);
      }
      // The cells (the paper's figure 4: Blond_Hair x Male), where the small ones vary most.
      for (std::size_t c = 0; c < test.class_names.size(); ++c)
        spread("subgroup", test.class_names[c] + " & " + group, "accuracy",
               accuracy_where(sr_.runs, test.labels, n,
                              [&](std::size_t i) { return mask[i] && test.labels[i] == int32_t(c); }));
    }
  }

  // Per-example stability, and the least stable examples with each replica's prediction (and the
  // input itself, where it is an image).
  void add_unstable_examples() {
    rep_.stability.push_back({name_, stability_counts(preds_)});
    const std::size_t n = u_.n;
    const std::vector<int> agree = majority_agreement(preds_);
    const std::vector<double> pairs = per_example_disagreement(preds_);
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) { return pairs[a] > pairs[c]; });
    // Examples are shown where a unit is one (not a segmentation's pixels), with their image
    // where they have one (not category ids).
    const std::size_t shown = u_.per == 1 ? std::size_t(std::max(0, o_.unstable_shown)) : 0;
    for (std::size_t j = 0; j < std::min<std::size_t>(shown, n); ++j) {
      const std::size_t i = order[j];
      if (pairs[i] == 0) break;  // the rest all agree
      ReportExample e{name_, static_cast<int64_t>(i), class_name(u_.labels[i]), agree[i],
                      static_cast<int>(preds_.size()), {}, {}};
      for (const auto& r : preds_) e.predicted.push_back(class_name(r[i]));
      if (u_.test.categories == 0) e.jpeg = example_jpeg(u_.test, i);
      rep_.unstable.push_back(std::move(e));
    }
  }

  // The ensemble (the plurality vote) on the examples that move against the rest, and on those
  // every replica agrees on.
  void add_ensemble_accuracy() {
    const std::vector<int> agree = majority_agreement(preds_);
    const std::vector<int32_t> vote = plurality_vote(preds_);
    std::vector<double> hit_all, hit_unstable, hit_stable;
    double replica_hits_unstable = 0;
    for (std::size_t i = 0; i < u_.n; ++i) {
      const double hit = vote[i] == u_.labels[i] ? 1.0 : 0.0;
      hit_all.push_back(hit);
      if (agree[i] == static_cast<int>(preds_.size())) {
        hit_stable.push_back(hit);
      } else {
        hit_unstable.push_back(hit);
        for (const auto& r : preds_) replica_hits_unstable += r[i] == u_.labels[i];
      }
    }
    metric(u_.per == 1 ? "unstable_examples" : fmt::format("unstable_{}s", unit_name(u_.task)),
           double(hit_unstable.size()));
    metric("ensemble_accuracy", mean(hit_all));
    if (!hit_unstable.empty()) {
      estimate("ensemble_acc_unstable", hit_unstable);
      metric("replica_acc_unstable", replica_hits_unstable / double(hit_unstable.size() * preds_.size()));
    }
    if (!hit_stable.empty()) estimate("ensemble_acc_stable", hit_stable);
  }

 private:
  void metric(const std::string& m, double v) { rep_.metrics.push_back({name_, m, v, 0, 0, false}); }
  void interval(const std::string& m, const Interval& i) {
    rep_.metrics.push_back({name_, m, i.value, i.low, i.high, true});
  }
  // Pixels are not independent draws: for a segmentation these are plain means, without a
  // bootstrap interval over pixels.
  void estimate(const std::string& m, const std::vector<double>& v) {
    if (u_.per == 1) interval(m, bootstrap_mean(v, o_.bootstrap, seed_++));
    else metric(m, mean(v));
  }
  void spread(const std::string& kind, const std::string& group, const std::string& m, const std::vector<double>& v) {
    rep_.groups.push_back({name_, kind, group, m, mean(v), stddev(v)});
  }
  std::string class_name(int32_t label) const {
    const Dataset& test = u_.test;
    if (u_.task == Task::Sequence) return "\"" + symbols_text(sequence_symbols(label, test.num_classes)) + "\"";
    return label >= 0 && std::size_t(label) < test.class_names.size() ? test.class_names[std::size_t(label)]
                                                                       : std::to_string(label);
  }

  ReportData& rep_;
  const SettingRuns& sr_;
  const EnsembleOptions& o_;
  const TestUnits& u_;
  uint64_t& seed_;
  const std::string& name_;
  const std::vector<std::vector<int32_t>> preds_;
};

// Additive or interacting: the decomposition of churn and of accuracy variance over the paper's
// four settings, when each of them ran with two replicas or more.
void add_decompositions(ReportData& rep, const std::vector<SettingRuns>& settings, const EnsembleOptions& o,
                        const TestUnits& u, uint64_t& seed) {
  std::map<std::string, const SettingRuns*> by_name;
  for (const auto& sr : settings) by_name[sr.setting.name] = &sr;
  for (const char* s : {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"})
    if (!by_name.count(s) || by_name[s]->runs.size() < 2) return;
  const SettingRuns *ai = by_name["ALGO+IMPL"], *a = by_name["ALGO"], *im = by_name["IMPL"], *c = by_name["CONTROL"];
  auto accuracies = [](const SettingRuns* sr) {
    std::vector<double> v;
    for (const auto& r : sr->runs) v.push_back(r.test_top1);
    return v;
  };
  const std::size_t n = u.n, per = u.per;
  rep.decomposition.push_back(report_decomposition(
      decompose_churn(predictions_of(*ai), predictions_of(*a), predictions_of(*im), predictions_of(*c), o.bootstrap,
                      seed++, 0.95, per),
      per == 1 ? fmt::format("a paired bootstrap over the {} test {}s ({} resamples); the replicas are held fixed", n,
                             unit_name(u.task), o.bootstrap)
               : fmt::format("a paired bootstrap over the {} test images, each with its {} pixels ({} resamples); "
                             "the replicas are held fixed",
                             n / per, per, o.bootstrap)));
  rep.decomposition.push_back(report_decomposition(
      decompose_accuracy_variance(accuracies(ai), accuracies(a), accuracies(im), accuracies(c), o.bootstrap, seed++),
      fmt::format("a bootstrap over each setting's replicas ({}, {}, {}, {} of them; {} resamples)", ai->runs.size(),
                  a->runs.size(), im->runs.size(), c->runs.size(), o.bootstrap)));
}

// The manifest summary: the runtime, build and configuration the first setting's first replica
// recorded in its folder, and per setting the kernels its first replica ran.
json manifest_summary(const std::vector<SettingRuns>& settings, const EnsembleOptions& o) {
  json m = read_json((fs::path(replica_dir(o, settings[0].setting, 0)) / "manifest.json").string());
  json summary;
  if (m.contains("runtime")) summary["runtime"] = m["runtime"];
  if (m.contains("ditto")) summary["ditto"] = m["ditto"];
  if (m.contains("config")) summary["config"] = m["config"];
  json kernels = json::object();
  for (const auto& sr : settings) {
    std::vector<std::string> rows;
    for (const auto& e : sr.runs[0].ops)
      rows.push_back(fmt::format("{}.{}{}={}", e.layer, e.knob, e.shape.empty() ? "" : "@" + e.shape, e.variant));
    kernels[sr.setting.name] = rows;
  }
  summary["kernels"] = kernels;
  summary["command_line"] = o.base.command_line;
  return summary;
}

}  // namespace

ReportData summarize(const std::vector<SettingRuns>& settings, const EnsembleOptions& o, const TrainData& data) {
  ReportData rep;
  const TrainConfig& b = o.base;
  rep.title = fmt::format("{} on {}: {} replicas x {} epochs per setting", b.model, b.dataset, o.replicas, b.epochs);
  const TestUnits units = test_units(data.test);
  uint64_t seed = 7;
  for (const auto& sr : settings) {
    rep.settings.push_back(sr.setting.name);
    SettingSummary s(rep, sr, o, units, seed);
    s.add_agreement();
    s.add_scores();
    s.add_curves();
    s.add_class_spreads();
    s.add_subgroup_spreads();
    s.add_unstable_examples();
    s.add_ensemble_accuracy();
  }
  add_decompositions(rep, settings, o, units, seed);
  if (!settings.empty() && !settings[0].runs.empty()) rep.manifest = manifest_summary(settings, o);
  return rep;
}

FigS4Study fig_s4_study(EnsembleOptions o, const FigS4Options& f) {
  if (f.lrs.empty()) throw Error("--lrs: figure S4 needs at least one learning rate");
  for (float lr : f.lrs)
    if (!(lr > 0)) throw Error(fmt::format("--lrs: learning rates must be positive, got {}", lr));
  if (!(f.momentum >= 0 && f.momentum < 1))
    throw Error(fmt::format("--momentum: figure S4 needs 0 <= momentum < 1, got {}", f.momentum));
  if (f.nesterov && f.momentum == 0) throw Error("--nesterov: needs --momentum above 0");
  o.base.optimizer = "sgd";
  o.base.momentum = f.momentum;
  o.base.nesterov = f.nesterov;
  o.base.augment = false;
  o.base.lr_schedule = "constant";
  o.base.warmup_epochs = 0;
  o.settings.clear();
  std::vector<ReportFigS4Point> cells;  // one per setting, disagreement filled in by fig_s4_report
  for (float lr : f.lrs) {
    for (bool init : {false, true})
      for (bool order : {false, true}) {
        Setting s;
        s.name = fmt::format("lr{}-{}init-{}order", lr, init ? "random" : "fixed", order ? "random" : "fixed");
        s.vary_init = init;
        s.vary_order = order;
        s.kernels = f.kernels;
        s.lr = lr;
        o.settings.push_back(s);
        cells.push_back({lr, init ? "random" : "fixed", order ? "random" : "fixed", 0, f.kernels, ""});
      }
    if (f.control) {
      Setting s{fmt::format("lr{}-CONTROL", lr), false, false, "deterministic", {}, lr};
      o.settings.push_back(s);
      cells.push_back({lr, "fixed", "fixed", 0, "deterministic", "CONTROL"});
    }
  }
  return {std::move(o), std::move(cells)};
}

ReportData fig_s4_report(const FigS4Study& study, const FigS4Options& f, const std::vector<SettingRuns>& runs,
                         const TrainData& data) {
  const EnsembleOptions& o = study.o;
  if (runs.size() != study.cells.size())
    throw Error(fmt::format("figure S4: {} cells but {} settings' runs", study.cells.size(), runs.size()));
  ReportData rep = summarize(runs, o, data);
  rep.title = fmt::format("Figure S4: {} on {}, SGD momentum {}{}, {} kernels{}, {} replicas x {} epochs", o.base.model,
                          o.base.dataset, f.momentum, f.nesterov ? " (Nesterov)" : "", f.kernels,
                          f.control ? " and a CONTROL cell" : "", o.replicas, o.base.epochs);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    ReportFigS4Point cell = study.cells[i];
    cell.disagreement = mean(not_all_agree(predictions_of(runs[i])));
    rep.fig_s4.push_back(cell);
  }
  return rep;
}

ReportData run_fig_s4(EnsembleOptions o, const FigS4Options& f, const std::shared_ptr<const TrainData>& data) {
  const FigS4Study study = fig_s4_study(std::move(o), f);
  return fig_s4_report(study, f, run_settings(study.o, data), *data);
}

ReportData run_overhead(EnsembleOptions o, const std::vector<std::string>& modes, int warmup, int steps,
                        const std::shared_ptr<const TrainData>& data) {
  if (steps < 1) throw Error(fmt::format("--overhead-steps: must be at least 1, got {}", steps));
  if (warmup < 1) throw Error(fmt::format("--overhead-warmup: must be at least 1, got {}", warmup));
  ReportData rep;
  rep.title = fmt::format("Overhead of determinism: {} on {}, {} timed steps after {} warm-up, batch {}", o.base.model,
                          o.base.dataset, steps, warmup, o.base.batch_size);
  make_output_folder(o.out);
  double heuristic_ms = 0;
  for (const auto& mode : modes) {
    Setting s{mode, false, false, mode, {}, 0};
    TrainConfig c = replica_config(o, s, 0);
    c.max_steps = warmup + steps;
    c.max_steps_flag = "--overhead-steps";  // with --overhead-warmup: the protocol's own flags
    c.checkpoint = false;
    c.progress = false;
    if (!o.resume && fs::exists(c.out))
      throw Error(fmt::format("--out: {} already holds a {} run; choose another folder", o.out, mode));
    c.overwrite = o.resume;  // timings cannot be read back: a resumed overhead protocol measures again
    // The clock runs from the end of the warm-up to the last step; the device is waited for at
    // both ends so queued work is counted where it ran.
    std::chrono::steady_clock::time_point t0, t1;
    int epoch0 = 0;
    TrainHooks hooks;
    hooks.after_step = [&](const StepView& v) {
      if (v.step == warmup) {
        v.ctx.synchronize();
        t0 = std::chrono::steady_clock::now();
        epoch0 = v.epoch;
      } else if (v.step == warmup + steps) {
        v.ctx.synchronize();
        t1 = std::chrono::steady_clock::now();
        if (v.epoch != epoch0)
          throw Error(fmt::format("--overhead-steps: steps {} to {} cross an epoch's end, whose evaluation would be "
                                  "timed; take fewer steps or more training data",
                                  warmup + 1, warmup + steps));
      }
    };
    // Steps the data's epochs cannot hold are refused by train, naming --overhead-steps.
    train(c, hooks, data);
    const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
    if (mode == "heuristic") heuristic_ms = ms;
    rep.overhead.push_back({mode, ms, 0});
    rep.settings.push_back(mode);
    rep.metrics.push_back({mode, "ms_per_step", ms, 0, 0, false});
    if (o.verbose) std::printf("%-18s %8.3f ms/step\n", mode.c_str(), ms);
  }
  const double base = heuristic_ms > 0 ? heuristic_ms : rep.overhead.front().ms_per_step;
  for (auto& row : rep.overhead) {
    row.ratio = row.ms_per_step / base;
    rep.metrics.push_back({row.mode, "overhead_ratio", row.ratio, 0, 0, false});
  }
  return rep;
}

}  // namespace ditto
