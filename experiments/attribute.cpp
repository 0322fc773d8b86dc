#include "experiments/attribute.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "datasets/loader.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/param.h"
#include "experiments/data_parallel.h"
#include "experiments/run_dir.h"
#include "experiments/scheduler.h"
#include "experiments/svg.h"
#include "experiments/task_scoring.h"
#include "kernels/loss.h"
#include "nets/nets.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Run-folder names: candidate names contain '=', '*' and spaces.
std::string folder_name(const std::string& s) {
  std::string out;
  for (char ch : s) out += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-') ? ch : '_';
  return out;
}

// What one replica leaves behind for the comparison across replicas.
struct ReplicaTrace {
  std::vector<Fingerprint> step_prints;                 // weights fingerprint after each step
  std::map<int64_t, std::vector<float>> snapshots;     // weights at the early L2 steps
};

double mean_pairwise_l2(const std::vector<const std::vector<float>*>& w) {
  std::vector<double> d;
  for (std::size_t a = 0; a < w.size(); ++a)
    for (std::size_t b = a + 1; b < w.size(); ++b) d.push_back(l2_distance(*w[a], *w[b]));
  return mean(d);
}

// Did every layer of the candidate run the knob at all, and with the asked variant? An entry is
// recorded only when the kernel ran, so a knob that is never called has none.
std::string check_ran(const Candidate& c, AttributionForm form, const std::vector<ManifestEntry>& ops) {
  std::vector<std::string> missing, other;
  for (const auto& layer : c.layers) {
    bool any = false, asked = false;
    for (const auto& e : ops) {
      if (e.layer != layer || e.knob != c.knob) continue;
      any = true;
      if (form == AttributionForm::LeaveOneOut || e.variant == c.variant || e.variant == "cpu-reference" ||
          e.variant == "reference")
        asked = true;
    }
    if (!any) missing.push_back(layer);
    else if (!asked) other.push_back(layer);
  }
  if (!missing.empty() && missing.size() == c.layers.size())
    return fmt::format("{} never runs {} (e.g. the first conv has no input gradient)", fmt::join(missing, ", "), c.knob);
  if (!other.empty()) return fmt::format("{} ran another {} variant than {}", fmt::join(other, ", "), c.knob, c.variant);
  return "";
}

// The (layer, knob) pairs a context's manifest recorded, in first-run order.
std::vector<std::pair<std::string, std::string>> knobs_recorded(Context& ctx) {
  std::vector<std::pair<std::string, std::string>> runs;
  for (const auto& e : ctx.manifest().entries()) {
    auto key = std::make_pair(e.layer, e.knob);
    if (std::find(runs.begin(), runs.end(), key) == runs.end()) runs.push_back(key);
  }
  return runs;
}

}  // namespace

std::vector<Candidate> list_candidates(const std::vector<std::pair<std::string, OpKind>>& knob_layers, bool groups,
                                       const std::vector<std::pair<std::string, std::string>>& runs) {
  std::vector<Candidate> out;
  for (const auto& [layer, kind] : knob_layers)
    for (const auto& spec : knobs()) {
      if (spec.op != kind) continue;
      if (!runs.empty() && std::find(runs.begin(), runs.end(), std::make_pair(layer, spec.name)) == runs.end()) continue;
      for (const auto& v : spec.nondeterministic())
        out.push_back({fmt::format("{}.{}={}", layer, spec.name, v), kind, spec.name, v, {layer}, false});
    }
  if (!groups) return out;
  std::vector<Candidate> grouped;
  for (const auto& c : out) {
    auto it = std::find_if(grouped.begin(), grouped.end(), [&](const Candidate& g) {
      return g.op == c.op && g.knob == c.knob && g.variant == c.variant;
    });
    if (it == grouped.end())
      grouped.push_back({fmt::format("all {}.{}={}", op_kind_name(c.op), c.knob, c.variant), c.op, c.knob, c.variant,
                         c.layers, true});
    else
      it->layers.push_back(c.layers.front());
  }
  for (auto& g : grouped)
    if (g.layers.size() > 1) out.push_back(g);
  return out;
}

std::vector<std::pair<std::string, std::string>> knobs_that_run(const std::string& model, int num_classes,
                                                                int in_channels, int image_size) {
  Context cpu;
  auto net = make_net(cpu, NetConfig{model, num_classes, in_channels});
  net->init(cpu, 0);
  std::vector<float> pixels(static_cast<std::size_t>(2 * in_channels * image_size * image_size));
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 7) / 7.0f - 0.5f;
  Var logits = net->forward(cpu, Var(cpu.from_host(pixels, {2, in_channels, image_size, image_size})), true);
  Var loss = softmax_cross_entropy(cpu, "loss", logits, cpu.from_host(std::vector<int32_t>{0, 1}, {2}));
  cpu.tape().backward(cpu, loss);
  return knobs_recorded(cpu);
}

std::vector<std::pair<std::string, std::string>> knobs_that_run(const std::string& model, const Dataset& probe) {
  Context cpu;
  auto net = make_net(cpu, NetConfig{model, probe.num_classes, probe.channels, probe.categories});
  check_net_fits_data(*net, probe, model, probe.name);
  net->init(cpu, 0);
  // One batch of the probe as the loader hands it to a training step (inputs and targets alike).
  LoaderOptions lo;
  lo.batch_size = std::max<int64_t>(1, probe.n);
  lo.shuffle = false;
  lo.threads = 0;
  Loader loader(cpu, probe, lo);
  loader.start_epoch(0);
  Batch b;
  if (!loader.next(b)) throw Error(fmt::format("knobs_that_run: the probe '{}' has no examples", probe.name));
  Var out = net->forward(cpu, Var(b.images), true);
  const Tensor input_lengths =
      net->task() == Task::Sequence ? ctc_input_lengths(cpu, b.labels.numel(), out.shape().at(0)) : Tensor();
  Var loss = task_loss(cpu, net->task(), out, b.labels, {b.targets, b.target_lengths}, input_lengths);
  cpu.tape().backward(cpu, loss);
  return knobs_recorded(cpu);
}

std::vector<Candidate> model_candidates(const std::string& model, const Dataset& probe, bool groups) {
  Context cpu;
  auto net = make_net(cpu, NetConfig{model, probe.num_classes, probe.channels, probe.categories});
  return list_candidates(net->knob_layers(), groups, knobs_that_run(model, probe));
}

std::vector<Candidate> model_candidates(const std::string& model, int num_classes, int in_channels, int image_size,
                                        bool groups) {
  Context cpu;
  auto net = make_net(cpu, NetConfig{model, num_classes, in_channels});
  return list_candidates(net->knob_layers(), groups, knobs_that_run(model, num_classes, in_channels, image_size));
}

std::vector<Candidate> data_parallel_candidates(const TrainConfig& base, int num_classes, int in_channels,
                                                bool groups) {
  if (!base.data_parallel()) return {};
  Context cpu;
  auto net = make_net(cpu, NetConfig{base.model, num_classes, in_channels});
  return list_candidates(bucket_layers(make_buckets(net->params(), int64_t(base.bucket_mb) << 20)), groups);
}

const char* form_name(AttributionForm f) { return f == AttributionForm::AddOne ? "add-one" : "leave-one-out"; }

AttributionForm parse_form(const std::string& s) {
  if (s == "add-one") return AttributionForm::AddOne;
  if (s == "leave-one-out") return AttributionForm::LeaveOneOut;
  throw Error(fmt::format("--form: unknown form '{}'; forms are add-one, leave-one-out, both", s));
}

std::vector<Candidate> candidates_for(const std::vector<Candidate>& all, AttributionForm form) {
  if (form == AttributionForm::AddOne) return all;
  std::vector<Candidate> out;
  for (const auto& c : all) {
    bool seen = std::any_of(out.begin(), out.end(), [&](const Candidate& o) {
      return o.knob == c.knob && o.layers == c.layers && o.group == c.group;
    });
    if (seen) continue;
    Candidate k = c;
    k.name = c.group ? fmt::format("all {}.{}", op_kind_name(c.op), c.knob) : fmt::format("{}.{}", c.layers[0], c.knob);
    k.variant = "deterministic";
    out.push_back(k);
  }
  return out;
}

std::string form_kernels(AttributionForm form) {
  return form == AttributionForm::AddOne ? "deterministic" : "nondeterministic";
}

std::vector<std::string> candidate_pins(const Candidate& c, AttributionForm form) {
  std::vector<std::string> pins;
  for (const auto& l : c.layers)
    pins.push_back(fmt::format("{}.{}={}", l, c.knob, form == AttributionForm::AddOne ? c.variant : "deterministic"));
  return pins;
}

namespace {

// A configuration to train: its report row, and the candidate it tests (none for a baseline).
struct Configuration {
  ConfigResult row;
  const Candidate* cand = nullptr;
};

// The baselines (with opts.baselines), then one configuration per candidate.
std::vector<Configuration> configurations(const std::vector<Candidate>& candidates, const AttributeOptions& opts) {
  std::vector<Configuration> configs;
  if (opts.baselines) {
    configs.push_back({{"all-deterministic", "baseline"}, nullptr});
    configs.back().row.kernels = "deterministic";
    configs.push_back({{"all-nondeterministic", "baseline"}, nullptr});
    configs.back().row.kernels = "nondeterministic";
  }
  for (const auto& c : candidates) {
    configs.push_back({{c.name, c.group ? "group" : "candidate"}, &c});
    configs.back().row.kernels = form_kernels(opts.form);
    configs.back().row.pins = candidate_pins(c, opts.form);
  }
  return configs;
}

// The replicas of one configuration, each with its run folder (under opts.out) recorded in the row.
std::vector<TrainConfig> replica_configs(const TrainConfig& base, ConfigResult& row, const AttributeOptions& opts) {
  std::vector<TrainConfig> cfgs;
  for (int k = 0; k < opts.replicas; ++k) {
    TrainConfig c = base;
    c.kernels = row.kernels;
    // Pins the user gave apply to every configuration, then the candidate's own.
    c.pins.insert(c.pins.end(), row.pins.begin(), row.pins.end());
    // CONTROL: the same seeds for every replica, so only kernels can make them differ.
    c.deterministic_init = c.deterministic_input = true;
    c.progress = false;
    c.resume.clear();
    if (!opts.out.empty()) {
      c.out = (fs::path(opts.out) / form_name(opts.form) / folder_name(row.name) / fmt::format("r{}", k)).string();
      row.run_dirs.push_back(c.out);
    }
    c.command_line = fmt::format("ditto-attribute {} '{}' replica {}", form_name(opts.form), row.name, k);
    cfgs.push_back(std::move(c));
  }
  return cfgs;
}

// One line per finished replica over the whole attribution: how many ran, elapsed time, ETA.
class AttributionProgress {
 public:
  AttributionProgress(std::size_t total, std::function<void(const std::string&)> log)
      : total_(total), log_(std::move(log)), start_(Clock::now()) {}
  void replica_done(const AttributeOptions& opts, const ConfigResult& row, int k, const std::string& device_note,
                    const std::string& outcome) {
    std::lock_guard<std::mutex> lk(mu_);
    ++done_;
    double el = std::chrono::duration<double>(Clock::now() - start_).count();
    log_(fmt::format("[{}/{}] {} {} replica {}/{}{}: {}  elapsed {}  ETA {}", done_, total_, form_name(opts.form),
                     row.name, k + 1, opts.replicas, device_note, outcome, format_hms(el),
                     format_hms(el / done_ * (total_ - done_))));
  }

 private:
  std::size_t total_, done_ = 0;
  std::function<void(const std::string&)> log_;
  Clock::time_point start_;
  std::mutex mu_;
};

// Trains the replicas at once (opts.concurrent per device, over the devices), each leaving its
// trace. A variant cuDNN refuses for a layer's shape marks the row "unsupported" (reported, not
// skipped). Returns the finished replicas in index order.
std::vector<TrainResult> train_replicas(const std::vector<TrainConfig>& cfgs, ConfigResult& row,
                                        std::vector<ReplicaTrace>& traces, const std::vector<std::string>& devices,
                                        const AttributeOptions& opts, const std::shared_ptr<const TrainData>& data,
                                        AttributionProgress& progress) {
  std::vector<TrainResult> slots(static_cast<std::size_t>(opts.replicas));
  std::vector<char> done(static_cast<std::size_t>(opts.replicas), 0);
  std::mutex mu;
  run_jobs(opts.replicas, devices, opts.concurrent, [&](int k, const std::string& device) {
    TrainConfig c = cfgs[static_cast<std::size_t>(k)];
    c.device = device;
    ReplicaTrace& tr = traces[static_cast<std::size_t>(k)];
    TrainHooks hooks;
    hooks.after_step = [&](const StepView& v) {
      if (v.step <= opts.fingerprint_steps) tr.step_prints.push_back(params_fingerprint(v.params));
      if (std::find(opts.l2_steps.begin(), opts.l2_steps.end(), v.step) != opts.l2_steps.end())
        tr.snapshots[v.step] = params_to_host(v.params);
    };
    std::string outcome;
    try {
      slots[static_cast<std::size_t>(k)] = train(c, hooks, data);
      done[static_cast<std::size_t>(k)] = 1;
      outcome = fmt::format("top-1 {:.4f}", slots[static_cast<std::size_t>(k)].test_top1);
    } catch (const PolicyError& e) {
      std::lock_guard<std::mutex> lk(mu);
      if (row.status == "ok") row.message = e.what();
      row.status = "unsupported";
      outcome = "unsupported";
    }
    progress.replica_done(opts, row, k, devices.size() > 1 ? " on " + device : "", outcome);
  });
  std::vector<TrainResult> results;
  for (std::size_t k = 0; k < slots.size(); ++k)
    if (done[k]) results.push_back(std::move(slots[k]));
  return results;
}

// The row's end-of-run statistics: accuracy, time per step and epoch, churn, final weight L2,
// distinct fingerprints.
void score_results(ConfigResult& row, const std::vector<TrainResult>& results, const TrainConfig& base,
                   const AttributeOptions& opts) {
  std::vector<std::vector<int32_t>> preds;
  std::vector<const std::vector<float>*> finals;
  std::set<Fingerprint> prints;
  double ms = 0, epoch_s = 0;
  int epochs_logged = 0;
  for (const auto& r : results) {
    preds.push_back(r.predictions);
    finals.push_back(&r.weights);
    prints.insert(r.weights_fingerprint);
    row.accuracy.push_back(r.test_top1);
    ms += 1000.0 * r.train_seconds / std::max<int64_t>(1, r.steps);
    if (!base.max_steps)
      for (const auto& e : r.log) epoch_s += e.seconds, ++epochs_logged;
  }
  row.ms_per_step = ms / results.size();
  row.seconds_per_epoch = epochs_logged ? epoch_s / epochs_logged : 0;
  // Units (experiments/task_scoring.h): a segmentation's pixels are resampled image by image.
  row.churn = churn_interval(preds, opts.bootstrap, opts.bootstrap_seed, 0.95,
                             static_cast<std::size_t>(results.front().units_per_example));
  row.weight_l2 = mean_pairwise_l2(finals);
  row.accuracy_std = stddev(row.accuracy);
  row.distinct_fingerprints = static_cast<int>(prints.size());
}

// The row's statistics over the steps: the first step after which the replicas' weights differ,
// their L2 distance at the early steps, and its growth per step.
void score_traces(ConfigResult& row, const std::vector<ReplicaTrace>& traces, const AttributeOptions& opts) {
  std::size_t compared = traces.front().step_prints.size();
  for (const auto& t : traces) compared = std::min(compared, t.step_prints.size());
  row.first_divergence_step = 0;
  for (std::size_t s = 0; s < compared && !row.first_divergence_step; ++s)
    for (const auto& t : traces)
      if (t.step_prints[s] != traces.front().step_prints[s]) row.first_divergence_step = static_cast<int64_t>(s) + 1;
  if (!row.first_divergence_step && row.distinct_fingerprints > 1) row.first_divergence_step = opts.fingerprint_steps + 1;
  for (int64_t s : opts.l2_steps) {
    std::vector<const std::vector<float>*> snaps;
    for (const auto& t : traces)
      if (auto it = t.snapshots.find(s); it != t.snapshots.end()) snaps.push_back(&it->second);
    if (snaps.size() == traces.size()) row.l2_at.push_back({s, mean_pairwise_l2(snaps)});
  }
  std::vector<std::pair<int64_t, double>> nonzero;
  for (const auto& p : row.l2_at)
    if (p.second > 0) nonzero.push_back(p);
  if (nonzero.size() >= 2)
    row.growth_per_step = (std::log(nonzero.back().second) - std::log(nonzero.front().second)) /
                          double(nonzero.back().first - nonzero.front().first);
}

AttributionResult result_header(const TrainConfig& base, const AttributeOptions& opts) {
  AttributionResult result;
  result.form = opts.form;
  result.model = base.model;
  result.dataset = base.dataset;
  result.device = base.device;
  result.replicas = opts.replicas;
  result.epochs = base.epochs;
  result.max_steps = base.max_steps;
  result.l2_steps = opts.l2_steps;
  return result;
}

}  // namespace

AttributionResult attribute(const TrainConfig& base, const std::vector<Candidate>& candidates,
                            const AttributeOptions& opts) {
  if (opts.replicas < 2) throw Error(fmt::format("--replicas must be at least 2, got {}", opts.replicas));
  if (opts.fingerprint_steps < 0) throw Error("--fingerprint-steps must be at least 0");
  auto log = opts.log ? opts.log : [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  std::vector<Configuration> configs = configurations(candidates, opts);
  AttributionResult result = result_header(base, opts);

  // One copy of the data for every run (decoding CIFAR-10's JPEGs takes longer than a short run).
  std::shared_ptr<const TrainData> data = load_train_data(base);
  const std::vector<std::string> devices = replica_devices(base.device, opts.gpus);
  AttributionProgress progress(configs.size() * static_cast<std::size_t>(opts.replicas), log);
  for (auto& config : configs) {
    ConfigResult& row = config.row;
    row.status = "ok";
    const std::vector<TrainConfig> cfgs = replica_configs(base, row, opts);
    std::vector<ReplicaTrace> traces(static_cast<std::size_t>(opts.replicas));
    const std::vector<TrainResult> results = train_replicas(cfgs, row, traces, devices, opts, data, progress);
    if (row.status != "ok") continue;
    if (config.cand) {
      std::string why = check_ran(*config.cand, opts.form, results.front().ops);
      if (!why.empty()) {
        row.status = "not run";
        row.message = why;
      }
    }
    score_results(row, results, base, opts);
    score_traces(row, traces, opts);
  }
  for (auto& c : configs) result.rows.push_back(std::move(c.row));
  rank_rows(result.rows);
  return result;
}

void rank_rows(std::vector<ConfigResult>& rows) {
  // The earliest distance measures the noise a kernel injects before training amplifies it;
  // later distances and end-of-run churn converge to one envelope for every live source.
  auto early_l2 = [](const ConfigResult& r) { return r.l2_at.empty() ? r.weight_l2 : r.l2_at.front().second; };
  auto first_step = [](const ConfigResult& r) {
    return r.first_divergence_step ? r.first_divergence_step : std::numeric_limits<int64_t>::max();
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const ConfigResult& a, const ConfigResult& b) {
    bool ab = a.kind == "baseline", bb = b.kind == "baseline";
    if (ab != bb) return ab;
    if (ab) return false;
    if ((a.status == "ok") != (b.status == "ok")) return a.status == "ok";
    if (a.diverged() != b.diverged()) return a.diverged();
    if (first_step(a) != first_step(b)) return first_step(a) < first_step(b);
    if (early_l2(a) != early_l2(b)) return early_l2(a) > early_l2(b);
    return a.churn.value > b.churn.value;
  });
}

AttributionResult read_attribution(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open", path));
  json doc;
  try {
    doc = json::parse(in);
    AttributionResult r;
    r.form = parse_form(doc.at("form").get<std::string>());
    r.model = doc.at("model").get<std::string>();
    r.dataset = doc.at("dataset").get<std::string>();
    r.device = doc.at("device").get<std::string>();
    r.replicas = doc.at("replicas").get<int>();
    r.epochs = doc.at("epochs").get<int>();
    r.max_steps = doc.at("max_steps").get<int64_t>();
    r.l2_steps = doc.at("l2_steps").get<std::vector<int64_t>>();
    for (const auto& j : doc.at("configurations")) {
      ConfigResult c;
      c.name = j.at("configuration").get<std::string>();
      c.kind = j.at("kind").get<std::string>();
      c.status = j.at("status").get<std::string>();
      c.message = j.at("message").get<std::string>();
      c.kernels = j.at("kernels").get<std::string>();
      c.pins = j.at("pins").get<std::vector<std::string>>();
      c.run_dirs = j.at("run_dirs").get<std::vector<std::string>>();
      c.accuracy = j.at("accuracy").get<std::vector<double>>();
      const auto& ch = j.at("churn");
      c.churn = {ch.at("mean_pairwise").get<double>(), ch.at("ci95_low").get<double>(), ch.at("ci95_high").get<double>()};
      c.weight_l2 = j.at("weight_l2").get<double>();
      c.accuracy_std = j.at("accuracy_std").get<double>();
      c.distinct_fingerprints = j.at("distinct_weight_fingerprints").get<int>();
      c.first_divergence_step = j.at("first_divergence_step").get<int64_t>();
      for (const auto& [step, v] : j.at("weight_l2_at_step").items()) c.l2_at.push_back({std::stoll(step), v.get<double>()});
      std::sort(c.l2_at.begin(), c.l2_at.end());
      c.growth_per_step = j.at("growth_per_step").get<double>();
      c.ms_per_step = j.at("ms_per_step").get<double>();
      c.seconds_per_epoch = j.at("seconds_per_epoch").get<double>();
      r.rows.push_back(std::move(c));
    }
    return r;
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not an attribution.json: {}", path, e.what()));
  }
}

std::string format_attribution(const AttributionResult& r) {
  std::string l2_head;
  for (int64_t s : r.l2_steps) l2_head += fmt::format(" {:>9}", fmt::format("L2@{}", s));
  std::string out = fmt::format("{} attribution: {} on {} ({}), {} replicas, {}\n", form_name(r.form), r.model,
                                r.dataset, r.device, r.replicas,
                                r.max_steps ? fmt::format("{} steps", r.max_steps) : fmt::format("{} epochs", r.epochs));
  out += fmt::format("{:>4} {:<36} {:>6}{} {:>8} {:>22} {:>9} {:>7} {:>8} {:>8} {:>8}\n", "rank", "configuration",
                     "div@", l2_head, "growth", "churn % [95% CI]", "L2 final", "acc_sd", "distinct", "ms/step",
                     "s/epoch");
  int rank = 0;
  for (const auto& row : r.rows) {
    std::string rk = row.kind == "baseline" ? "-" : std::to_string(++rank);
    if (row.status != "ok") {
      out += fmt::format("{:>4} {:<36} {}: {}\n", rk, row.name, row.status, row.message);
      continue;
    }
    std::string l2;
    for (int64_t s : r.l2_steps) {
      auto it = std::find_if(row.l2_at.begin(), row.l2_at.end(), [&](const auto& p) { return p.first == s; });
      l2 += it == row.l2_at.end() ? fmt::format(" {:>9}", "-") : fmt::format(" {:>9.3g}", it->second);
    }
    std::string div = row.first_divergence_step == 0 ? "none" : std::to_string(row.first_divergence_step);
    out += fmt::format("{:>4} {:<36} {:>6}{} {:>8.3g} {:>6.2f} [{:>5.2f}, {:>5.2f}] {:>9.3g} {:>7.4f} {:>4}/{:<3} {:>8.2f} {:>8.2f}{}\n",
                       rk, row.name, div, l2, row.growth_per_step, 100 * row.churn.value, 100 * row.churn.low,
                       100 * row.churn.high, row.weight_l2, row.accuracy_std, row.distinct_fingerprints,
                       row.accuracy.size(), row.ms_per_step, row.seconds_per_epoch,
                       row.diverged() ? "" : "  no divergence");
  }
  return out;
}

void write_attribution(const AttributionResult& r, const std::string& dir) {
  make_output_folder(dir);
  std::string csv = "form,rank,configuration,kind,status,kernels,pins,first_divergence_step";
  for (int64_t s : r.l2_steps) csv += fmt::format(",l2_step{}", s);
  csv += ",growth_per_step,churn,churn_low,churn_high,weight_l2,acc_mean,acc_std,distinct_weights,replicas,ms_per_step,"
         "seconds_per_epoch,message\n";
  json rows = json::array();
  std::vector<BarRow> churn_bars, l2_bars;
  int rank = 0;
  for (const auto& row : r.rows) {
    const std::string rk = row.kind == "baseline" ? "" : std::to_string(++rank);
    std::string msg = row.message;
    std::replace(msg.begin(), msg.end(), '"', '\'');
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    csv += fmt::format("{},{},\"{}\",{},{},{},\"{}\",{}", form_name(r.form), rk, row.name, row.kind, row.status,
                       row.kernels, fmt::join(row.pins, " "), row.first_divergence_step);
    for (int64_t s : r.l2_steps) {
      auto it = std::find_if(row.l2_at.begin(), row.l2_at.end(), [&](const auto& p) { return p.first == s; });
      csv += it == row.l2_at.end() ? "," : fmt::format(",{:.6g}", it->second);
    }
    csv += fmt::format(",{:.6g},{:.6f},{:.6f},{:.6f},{:.6g},{:.6f},{:.6f},{},{},{:.4f},{:.4f},\"{}\"\n",
                       row.growth_per_step, row.churn.value, row.churn.low, row.churn.high, row.weight_l2,
                       mean(row.accuracy), row.accuracy_std, row.distinct_fingerprints, row.accuracy.size(),
                       row.ms_per_step, row.seconds_per_epoch, msg);
    json l2 = json::object();
    for (const auto& [s, v] : row.l2_at) l2[std::to_string(s)] = v;
    rows.push_back({{"configuration", row.name}, {"kind", row.kind}, {"rank", rk}, {"status", row.status},
                    {"message", row.message}, {"kernels", row.kernels}, {"pins", row.pins},
                    {"run_dirs", row.run_dirs}, {"accuracy", row.accuracy},
                    {"churn", {{"mean_pairwise", row.churn.value}, {"ci95_low", row.churn.low}, {"ci95_high", row.churn.high}}},
                    {"weight_l2", row.weight_l2}, {"accuracy_std", row.accuracy_std},
                    {"distinct_weight_fingerprints", row.distinct_fingerprints},
                    {"first_divergence_step", row.first_divergence_step}, {"weight_l2_at_step", l2},
                    {"growth_per_step", row.growth_per_step}, {"ms_per_step", row.ms_per_step},
                    {"seconds_per_epoch", row.seconds_per_epoch}, {"diverged", row.diverged()}});
    BarRow cb{row.name, row.churn.value, row.churn.low, row.churn.high, true, ""};
    BarRow lb{row.name, row.l2_at.empty() ? 0.0 : row.l2_at.front().second, 0, 0, false, ""};
    if (row.status != "ok") cb.note = lb.note = row.status, cb.value = cb.low = cb.high = 0, cb.has_interval = false;
    else if (!row.diverged()) cb.note = lb.note = "no divergence";
    churn_bars.push_back(cb);
    l2_bars.push_back(lb);
  }
  json doc{{"form", form_name(r.form)}, {"model", r.model}, {"dataset", r.dataset}, {"device", r.device},
           {"replicas", r.replicas}, {"epochs", r.epochs}, {"max_steps", r.max_steps}, {"l2_steps", r.l2_steps},
           {"ranking", "diverged first, then the earlier first divergence, then the larger weight L2 after the first "
                       "early step, then churn"},
           {"configurations", rows}};
  const fs::path d(dir);
  const std::string what = r.max_steps ? fmt::format("{} steps", r.max_steps) : fmt::format("{} epochs", r.epochs);
  write_file_atomic((d / "attribution.csv").string(), csv);
  write_file_atomic((d / "attribution.json").string(), doc.dump(2));
  write_file_atomic((d / "attribution.svg").string(),
                    svg_bar_chart(fmt::format("{} {}: churn between {} replicas after {} (95% bootstrap CI)",
                                              r.model, form_name(r.form), r.replicas, what),
                                  "churn (% of test predictions)", churn_bars, 100.0));
  if (!r.l2_steps.empty())
    write_file_atomic((d / "attribution_l2.svg").string(),
                      svg_log_bar_chart(fmt::format("{} {}: weight L2 distance between replicas after step {}",
                                                    r.model, form_name(r.form), r.l2_steps.front()),
                                        "mean pairwise L2 distance of the weights (log scale)", l2_bars));
}

}  // namespace ditto
