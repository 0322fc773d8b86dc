// ditto-experiment: the paper's protocol on a small scale. For each setting, train several
// replicas that differ only in what the setting lets vary, then measure how far they drift:
//   ALGO+IMPL  seeds (init, order, augmentation) drawn per replica, nondeterministic kernels
//   ALGO       seeds drawn per replica, deterministic kernels
//   IMPL       seeds fixed, nondeterministic kernels (only the GPU's summation order varies)
//   CONTROL    seeds fixed, deterministic kernels (must be bit-identical)
// Metrics per setting: test accuracy mean and standard deviation, pairwise churn (fraction of
// test predictions that differ between two replicas), pairwise L2 distance of the final
// weights, the number of distinct weight fingerprints, and seconds per epoch (the overhead of
// determinism), and per class / per subgroup the spread of accuracy across replicas. Writes
// results.csv, results.json, results.svg and groups.csv to --out; each replica's own
// run folder (manifest, log, predictions, checkpoint) lies beside them.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <mutex>
#include <set>

#include "engine/checkpoint.h"
#include "engine/error.h"
#include "experiments/cli.h"
#include "experiments/scheduler.h"
#include "experiments/stats.h"

namespace fs = std::filesystem;

namespace {

struct Setting {
  std::string name;
  bool vary_seeds;
  std::string kernels;
};

struct SettingResult {
  std::string name;
  std::vector<double> acc;
  // [group][replica] accuracy per class and per subgroup: their spread across replicas shows
  // which classes (or subgroups) the noise hits hardest.
  std::vector<std::vector<double>> class_acc, subgroup_acc;
  std::vector<std::string> class_names, subgroup_names;
  std::vector<double> churn, l2;
  std::size_t distinct = 0;
  double epoch_seconds = 0;
};

using ditto::mean;
using ditto::stddev;

std::string svg_chart(const std::vector<SettingResult>& rs) {
  // Two panels of bars: mean pairwise churn (%) and accuracy stddev (points), one bar per setting.
  const int w = 720, h = 300, pad = 50, panel = (w - 3 * pad) / 2;
  std::string s = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='12'>\n", w, h);
  s += fmt::format("<rect width='{}' height='{}' fill='white'/>\n", w, h);
  auto panel_svg = [&](int x0, const std::string& title, auto value) {
    double top = 1e-9;
    for (const auto& r : rs) top = std::max(top, value(r));
    s += fmt::format("<text x='{}' y='20' font-weight='bold'>{}</text>\n", x0, title);
    const int base = h - 40, bw = panel / std::max<std::size_t>(1, rs.size());
    s += fmt::format("<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n", x0, base, x0 + panel, base);
    for (std::size_t i = 0; i < rs.size(); ++i) {
      double v = value(rs[i]);
      int bh = static_cast<int>((base - 40) * v / top);
      int x = x0 + static_cast<int>(i) * bw + 6;
      s += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='{}'/>\n", x, base - bh, bw - 12, bh,
                       i % 2 ? "#d95f02" : "#1b9e77");
      s += fmt::format("<text x='{}' y='{}' text-anchor='middle'>{:.3g}</text>\n", x + (bw - 12) / 2, base - bh - 4, v);
      s += fmt::format("<text x='{}' y='{}' text-anchor='middle'>{}</text>\n", x + (bw - 12) / 2, base + 16, rs[i].name);
    }
  };
  panel_svg(pad, "churn between replicas (% of test predictions)", [](const SettingResult& r) { return 100 * mean(r.churn); });
  panel_svg(2 * pad + panel, "test accuracy std dev (points)", [](const SettingResult& r) { return 100 * stddev(r.acc); });
  return s + "</svg>\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ditto-experiment: ALGO+IMPL / ALGO / IMPL / CONTROL replicas on one dataset"};
  app.set_help_all_flag("--help-all");
  ditto::TrainConfig base;
  base.dataset = "synthetic";
  base.model = "smallcnn";
  base.lr = 2e-3f;
  base.epochs = 5;
  base.device = "auto";
  ditto::TrainFlags flags;
  int replicas = 0;
  std::string out = "runs/experiment";
  std::vector<std::string> settings = {"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"};
  // The training flags are ditto-train's own definition; seeds, kernels and the run folder are
  // what the settings decide, so those groups are left out.
  ditto::add_train_flags(app, base, flags, ditto::kFlagsData | ditto::kFlagsOptim | ditto::kFlagsRun | ditto::kFlagsPins);
  app.add_option("--replicas", replicas, "replicas per setting (default 3 on GPU, 2 on CPU)")->check(CLI::Range(2, 100));
  app.add_option("--settings", settings, "subset of ALGO+IMPL ALGO IMPL CONTROL")
      ->check(CLI::IsMember({"ALGO+IMPL", "ALGO", "IMPL", "CONTROL"}));
  int concurrent = 1, gpus = 1;
  app.add_option("--concurrent", concurrent, "replicas trained at once per GPU (s/epoch is then the time under that load)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--gpus", gpus, "spread replicas over up to this many visible GPUs")
      ->check(CLI::Range(1, 64))->capture_default_str();
  std::string tuning;
  app.add_option("--tuning", tuning,
                 "the deterministic settings (ALGO, CONTROL) take each conv's algorithm from this tuning file; when "
                 "it does not exist, one epoch on the first GPU tunes and writes it before the replicas start");
  app.add_option("--out", out)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    ditto::apply_train_flags(base, flags, argc, argv);
    const std::string device = base.device;
    const bool gpu = device != "cpu";
    // The CPU run is small (1000 images of 16x16): smaller batches give it enough steps to learn.
    if (!app.count("--batch-size")) base.batch_size = gpu ? 128 : 32;
    replicas = replicas ? replicas : (gpu ? 3 : 2);
    if (base.dataset == "synthetic") {
      if (!app.count("--synthetic-train")) base.synthetic_train = gpu ? 10000 : 1000;
      if (!app.count("--synthetic-test")) base.synthetic_test = gpu ? 2000 : 500;
      if (!app.count("--synthetic-size")) base.synthetic_size = gpu ? 32 : 16;
    }
    std::printf("ditto-experiment on %s: %s on %s, %d replicas x %d epochs per setting\n", device.c_str(),
                base.model.c_str(), base.dataset.c_str(), replicas, base.epochs);

    const std::vector<std::string> devices = ditto::replica_devices(base.device, gpus);
    auto data = ditto::load_train_data(base);  // once for every replica
    if (!tuning.empty()) {
      if (!gpu) throw ditto::Error("--tuning: a tuning file chooses cuDNN algorithms; this experiment runs on the CPU");
      if (!fs::exists(tuning)) {
        // One epoch meets every problem the replicas will (full batches, the final partial
        // batch, evaluation); the replicas then only read the file, so they choose alike.
        ditto::TrainConfig t = base;
        t.device = devices.front();
        t.kernels = "deterministic";
        t.tuning = tuning;
        t.epochs = 1;
        t.max_steps = 0;
        t.out.clear();
        t.progress = false;
        t.deterministic_init = t.deterministic_input = true;
        std::printf("tuning the deterministic convolutions into %s (one epoch)\n", tuning.c_str());
        ditto::train(t, {}, data);
      }
    }
    const std::vector<Setting> all = {{"ALGO+IMPL", true, "nondeterministic"},
                                      {"ALGO", true, "deterministic"},
                                      {"IMPL", false, "nondeterministic"},
                                      {"CONTROL", false, "deterministic"}};
    std::vector<Setting> chosen;
    for (const auto& s : all)
      if (std::find(settings.begin(), settings.end(), s.name) != settings.end()) chosen.push_back(s);
    // Every setting's replicas form one pool of jobs, trained --concurrent at a time per GPU
    // (over --gpus GPUs); results are taken in (setting, replica) order, so the numbers do not
    // depend on how many ran at once.
    const int jobs = static_cast<int>(chosen.size()) * replicas;
    std::vector<ditto::TrainResult> all_runs(static_cast<std::size_t>(jobs));
    std::mutex print_mu;
    const auto wall0 = std::chrono::steady_clock::now();
    ditto::run_jobs(jobs, devices, concurrent, [&](int j, const std::string& dev) {
      const Setting& s = chosen[static_cast<std::size_t>(j / replicas)];
      const int k = j % replicas;
      ditto::TrainConfig c = base;
      c.device = dev;
      if (concurrent > 1 || devices.size() > 1) c.progress = false;  // one progress line per process
      c.kernels = s.kernels;
      if (s.kernels == "deterministic") c.tuning = tuning;
      if (s.vary_seeds) {
        c.seed_init = 1000 + k;  // distinct, recorded seeds: replays exactly
        c.seed_order = 2000 + k;
        c.seed_augment = 3000 + k;
      } else {
        c.deterministic_init = c.deterministic_input = true;
      }
      c.out = (fs::path(out) / fmt::format("{}-{}", s.name == "ALGO+IMPL" ? "ALGO_IMPL" : s.name, k)).string();
      c.command_line = fmt::format("ditto-experiment setting {} replica {}", s.name, k);
      {
        std::lock_guard<std::mutex> lk(print_mu);
        std::printf("[%s] replica %d/%d%s\n", s.name.c_str(), k + 1, replicas,
                    devices.size() > 1 ? (" on " + dev).c_str() : "");
        std::fflush(stdout);
      }
      all_runs[static_cast<std::size_t>(j)] = ditto::train(c, {}, data);
    });
    const double wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    std::vector<SettingResult> results;
    for (std::size_t si = 0; si < chosen.size(); ++si) {
      const Setting& s = chosen[si];
      SettingResult r{s.name};
      std::vector<std::vector<int32_t>> preds;
      std::vector<std::vector<float>> weights;
      std::set<uint64_t> prints;
      double secs = 0;
      int epochs_counted = 0;
      const std::vector<ditto::TrainResult> runs(all_runs.begin() + long(si) * replicas,
                                                 all_runs.begin() + long(si + 1) * replicas);
      for (const auto& res : runs) {
        r.acc.push_back(res.test_top1);
        auto group_acc = [&](const std::vector<int32_t>& group, std::size_t groups, std::vector<std::vector<double>>& out) {
          std::vector<double> hit(groups, 0), n(groups, 0);
          for (std::size_t i = 0; i < group.size(); ++i) {
            hit[group[i]] += res.predictions[i] == res.test_labels[i];
            n[group[i]] += 1;
          }
          out.resize(groups);
          for (std::size_t g = 0; g < groups; ++g) out[g].push_back(n[g] ? hit[g] / n[g] : 0.0);
        };
        r.class_names = res.class_names;
        group_acc(res.test_labels, res.class_names.size(), r.class_acc);
        if (!res.test_subgroups.empty()) {
          // Subgroups crossed with classes (e.g. "Blond_Hair=1 & Male=1"): the paper found the
          // small cells the most sensitive to noise.
          const std::size_t ns = res.subgroup_names.size();
          std::vector<int32_t> cell(res.test_labels.size());
          for (std::size_t i = 0; i < cell.size(); ++i) cell[i] = res.test_labels[i] * int32_t(ns) + res.test_subgroups[i];
          group_acc(cell, res.class_names.size() * ns, r.subgroup_acc);
          r.subgroup_names.clear();
          for (const auto& cn : res.class_names)
            for (const auto& sn : res.subgroup_names) r.subgroup_names.push_back(cn + " & " + sn);
        }
        preds.push_back(res.predictions);
        prints.insert(res.weights_fingerprint);
        weights.push_back(res.weights);
        for (const auto& e : res.log) secs += e.seconds, ++epochs_counted;
      }
      for (int a = 0; a < replicas; ++a)
        for (int b = a + 1; b < replicas; ++b) {
          r.churn.push_back(ditto::churn(preds[a], preds[b]));
          r.l2.push_back(ditto::l2_distance(weights[a], weights[b]));
        }
      r.distinct = prints.size();
      r.epoch_seconds = secs / std::max(1, epochs_counted);
      results.push_back(r);
    }

    std::string csv = "setting,replicas,acc_mean,acc_std,churn_mean,l2_mean,distinct_weights,seconds_per_epoch,"
                      "class_acc_std_max\n";
    std::string groups_csv = "setting,kind,group,acc_mean,acc_std\n";
    auto std_max = [](const std::vector<std::vector<double>>& g) {
      double m = 0;
      for (const auto& v : g) m = std::max(m, stddev(v));
      return m;
    };
    nlohmann::json j = nlohmann::json::array();
    std::printf("\n%-10s %8s %8s %10s %10s %9s %8s %14s\n", "setting", "acc", "acc_std", "churn", "weight_L2", "distinct",
                "s/epoch", "class_std_max");
    for (const auto& r : results) {
      csv += fmt::format("{},{},{:.6f},{:.6f},{:.6f},{:.6g},{},{:.3f},{:.6f}\n", r.name, r.acc.size(), mean(r.acc),
                         stddev(r.acc), mean(r.churn), mean(r.l2), r.distinct, r.epoch_seconds, std_max(r.class_acc));
      nlohmann::json per_class = nlohmann::json::object(), per_subgroup = nlohmann::json::object();
      for (std::size_t g = 0; g < r.class_acc.size(); ++g) {
        per_class[r.class_names[g]] = {{"accuracy", r.class_acc[g]}, {"std", stddev(r.class_acc[g])}};
        groups_csv += fmt::format("{},class,{},{:.6f},{:.6f}\n", r.name, r.class_names[g], mean(r.class_acc[g]),
                                  stddev(r.class_acc[g]));
      }
      for (std::size_t g = 0; g < r.subgroup_acc.size(); ++g) {
        per_subgroup[r.subgroup_names[g]] = {{"accuracy", r.subgroup_acc[g]}, {"std", stddev(r.subgroup_acc[g])}};
        groups_csv += fmt::format("{},subgroup,{},{:.6f},{:.6f}\n", r.name, r.subgroup_names[g],
                                  mean(r.subgroup_acc[g]), stddev(r.subgroup_acc[g]));
      }
      j.push_back({{"setting", r.name}, {"accuracy", r.acc}, {"churn", r.churn}, {"weight_l2", r.l2},
                   {"distinct_weight_fingerprints", r.distinct}, {"seconds_per_epoch", r.epoch_seconds},
                   {"per_class", per_class}, {"per_subgroup", per_subgroup}});
      std::printf("%-10s %8.4f %8.4f %9.2f%% %10.4g %5zu/%-3zu %8.2f %14.4f\n", r.name.c_str(), mean(r.acc), stddev(r.acc),
                  100 * mean(r.churn), mean(r.l2), r.distinct, r.acc.size(), r.epoch_seconds, std_max(r.class_acc));
    }
    nlohmann::json doc{{"device", device}, {"model", base.model}, {"dataset", base.dataset}, {"epochs", base.epochs},
                       {"replicas", replicas}, {"concurrent", concurrent}, {"gpus", devices.size()},
                       {"graph", base.graph}, {"wall_seconds", wall_seconds}, {"settings", j}};
    ditto::write_file_atomic((fs::path(out) / "results.csv").string(), csv);
    ditto::write_file_atomic((fs::path(out) / "results.json").string(), doc.dump(2));
    ditto::write_file_atomic((fs::path(out) / "groups.csv").string(), groups_csv);
    ditto::write_file_atomic((fs::path(out) / "results.svg").string(), svg_chart(results));
    std::printf("\n%d replicas x %d epochs in %.1f s wall (%d at a time per GPU on %zu GPU(s)%s)\n", jobs, base.epochs,
                wall_seconds, concurrent, devices.size(), base.graph ? ", CUDA graphs" : "");
    std::printf("wrote %s/results.{csv,json,svg} and groups.csv (per-class / per-subgroup spread)\n", out.c_str());
    for (const auto& r : results)
      if (r.name == "CONTROL" && r.distinct != 1) {
        std::fprintf(stderr, "CONTROL replicas are not bit-identical: %zu distinct weight fingerprints\n", r.distinct);
        return 1;
      }
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "ditto-experiment: %s\n", e.what());
    return 2;
  }
}
