// overhead: the cost of determinism per model (the paper's figure 6). For each zoo model, kernel
// mode and precision (--precisions, default fp32; each the rule `*.precision=VALUE` after the
// mode's, bench/precision_runs.h): the median milliseconds of a training step (experiments/step.h:
// forward, softmax cross-entropy, backward, SGD with momentum 0.9, device-side loss and accuracy
// sums) on one fixed synthetic batch (fp32, --batch images of 3x224x224, 3x299x299 for
// inception-v3, 1000 classes), eager; the pool's peak memory over the timed steps; the ratios to
// `heuristic` and `fastest`; where the time goes, per op kind and algorithm (engine/profiler.h);
// and the algorithms chosen.
//
// Per model x mode x precision, in a context of its own: `--warmup` untimed steps (the first selects the
// algorithms: cuDNN's heuristic or Find), then `--steps` steps each timed by a pair of CUDA events
// (no profiler attached: nothing between the ops; 100 by default, as the paper profiled 100
// iterations; bench/overhead_steps.py compares a run with fewer), then `--profile-steps` further
// steps with the profiler attached, whose per-kind times are reported separately (events between
// ops cost a little, so they are not the median's steps). deterministic-tuned reads a tuning file
// made once per model, batch and precision under --tuning-dir by a tuning step in a context of its
// own (engine/tuning.h: tune in a run of its own, then read); the tuning time is reported.
//
// Per model and precision, modes run in the order heuristic, fastest, deterministic,
// deterministic-tuned, nondeterministic, so a record can carry its ratios to heuristic and fastest
// in its own precision. Models that make_net does not know are skipped with a note on stderr. A
// configuration that fails (e.g. out of device memory at batch 128) is recorded with its error and
// the study goes on; with --budget-s, configurations that would start after that many seconds are
// recorded as skipped; with --resume, configurations (model, mode, precision; a line without a
// precision is fp32) --out already holds a measurement or an out-of-memory failure of (at any other
// settings: keep one file per setting) are not run again, so a study cut by its budget is completed
// by running the same command again.
//
// One JSON line per model x mode x precision (--out appends; bench/overhead_table.py renders them
// with the PyTorch peer's): tool, model, mode, precision, loss_scale (fp16 only), batch,
// image_size, classes, dtype (the input batch's), optimizer, warmup, steps, ms_median, ms_p10,
// ms_p90, ms_min, ms_wall, ratio_vs_heuristic, ratio_vs_fastest, peak_mem_bytes,
// peak_mem_warmup_bytes, mem_source, profile_steps, profile_ms, breakdown_ms {kind: ms per step},
// breakdown [{kind, variant, ms, calls} per step], conv_algos {direction: {algorithm: layers}},
// variants {op.knob: {variant: layers}}, kernels ["layer.knob=algo"], tuning_file, tuning_s,
// warmup_s, params, weights_fingerprint, device, gpu, cudnn, commit, date; a failed one: tool,
// model, mode, precision, batch, image_size, error, oom (and skipped when the budget ran out).
//   overhead --models resnet50,vgg16 --modes heuristic,deterministic --precisions fp32,bf16
//       --out overhead.jsonl
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/profiler.h"
#include "engine/timer.h"
#include "engine/tuning.h"
#include "experiments/cli.h"
#include "experiments/stats.h"
#include "experiments/run_dir.h"
#include "experiments/step.h"
#include "experiments/train.h"
#include "nets/nets.h"
#include "precision_runs.h"

using namespace ditto;
using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The order they run in: the references first, so later records carry their ratios.
const std::vector<std::string> kModes = {"heuristic", "fastest", "deterministic", "deterministic-tuned",
                                         "nondeterministic"};
const std::vector<std::string> kZoo = {"vgg16",        "vgg19",           "resnet34",     "resnet50",
                                       "resnet101",    "resnet152",       "densenet121",  "densenet169",
                                       "densenet201",  "mobilenet",       "mobilenet-v2", "efficientnet-b0",
                                       "inception-v3", "xception",        "mediumcnn-k1", "mediumcnn-k3",
                                       "mediumcnn-k5", "mediumcnn-k7"};
constexpr float kLr = 0.01f, kMomentum = 0.9f;

std::vector<std::string> mode_rules(const std::string& mode) {
  return {"*=" + (mode == "deterministic-tuned" ? std::string("deterministic") : mode)};
}

struct Options {
  std::vector<std::string> models = kZoo;
  std::vector<std::string> modes = kModes;
  std::vector<std::string> precisions = {"fp32"};
  bool channels_last = false;  // bf16/fp16 convolutions channels-last (bench/precision_runs.h)
  bool native = false;         // ... handing on bf16/fp16 channels-last results (likewise)
  std::vector<std::string> rules;  // --rules, after each configuration's own
  int64_t tuning_workspace_mb = 0;  // deterministic-tuned: the tuning files' workspace budget (0: none)
  std::string device = "auto";
  std::string out, tuning_dir = "overhead_tuning";
  int64_t batch = 128;
  int classes = 1000;
  int image_size = 0;  // 0: the model's own (224; 299 for inception-v3)
  int warmup = 3, steps = 100, profile_steps = 2;  // 100 timed steps: what the paper profiled
  double budget_s = 0;  // 0: none
  bool resume = false;
};

// A configuration as --resume finds it in --out: model, mode, precision.
using ConfigKey = std::tuple<std::string, std::string, std::string>;

// The configurations --out already holds a measurement of, with their medians (the last line
// wins), and those that ran out of memory (median -1: the same batch would again). A line
// without a precision was written before precisions: fp32.
std::map<ConfigKey, double> measured_in(const std::string& path) {
  std::map<ConfigKey, double> done;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    const json j = json::parse(text, nullptr, false);
    if (!j.is_object() || j.value("tool", "") != "ditto" || !j.contains("model") || !j.contains("mode")) continue;
    const ConfigKey key{j["model"].get<std::string>(), j["mode"].get<std::string>(), j.value("precision", "fp32")};
    if (!j.contains("error") && j.contains("ms_median") && j["ms_median"].is_number())
      done[key] = j["ms_median"].get<double>();
    else if (j.value("oom", false) && !j.value("skipped", false))
      done[key] = -1;
    else
      done.erase(key);
  }
  return done;
}

int image_size(const Options& o, const std::string& model) {
  if (o.image_size > 0) return o.image_size;
  return model == "inception-v3" ? 299 : 224;
}

// One synthetic batch on the host, made once per image size and copied into each context.
struct HostBatch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};

using HostBatches = std::map<int, HostBatch>;  // by image size

const HostBatch& host_batch(HostBatches& cache, const Options& o, int size) {
  auto it = cache.find(size);
  if (it != cache.end()) return it->second;
  HostBatch b;
  std::mt19937_64 g(12345);
  std::normal_distribution<float> d(0.f, 1.f);
  b.images.resize(static_cast<std::size_t>(o.batch * 3 * size * size));
  for (auto& v : b.images) v = d(g);
  b.labels.resize(static_cast<std::size_t>(o.batch));
  for (auto& v : b.labels) v = static_cast<int32_t>(g() % static_cast<uint64_t>(o.classes));
  return cache.emplace(size, std::move(b)).first->second;
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A model, its optimizer and its batch in one context, ready to step.
struct Setup {
  std::unique_ptr<Net> net;
  std::vector<Param> params;
  std::unique_ptr<Sgd> opt;
  Tensor images, labels, loss_sum, correct;
  std::unique_ptr<LossScaler> scaler;  // fp16: dynamic, as a training run's default
  std::unique_ptr<TrainStep> step;
  void run() { step->run(images, labels, kLr, loss_sum, correct); }
};

Setup make_setup(Context& ctx, const Options& o, const std::string& model, const std::string& precision,
                 const HostBatch& hb) {
  const int size = image_size(o, model);
  Setup s;
  s.net = make_net(ctx, {model, o.classes, 3});
  s.net->init(ctx, 0);
  s.params = s.net->params();
  SgdOptions so;
  so.momentum = kMomentum;
  s.opt = std::make_unique<Sgd>(ctx, s.params, so);
  s.images = ctx.from_host(hb.images, {o.batch, 3, size, size});
  s.labels = ctx.from_host(hb.labels, {o.batch});
  s.loss_sum = ctx.zeros({1});
  s.correct = ctx.zeros({2}, DType::I32);
  // Eager always: nets with dropout draw new masks each step (keyed by this seed and the step).
  s.scaler = bench::loss_scaler_for(ctx, precision);
  s.step = std::make_unique<TrainStep>(ctx, *s.net, *s.opt, false, nullptr, 1, s.scaler.get());
  return s;
}

// The tuning file of a model in a precision: made by one step in a context of its own when it
// does not exist. Returns the seconds spent tuning (0 when the file was there).
double ensure_tuning(const Options& o, const std::string& model, const std::string& precision,
                     const std::string& path, const HostBatch& hb) {
  if (fs::exists(path)) return 0;
  const auto t0 = Clock::now();
  Context ctx(Device::parse(o.device), Policy::parse(bench::with_precision({"*=deterministic"}, precision, o.channels_last, o.native, o.rules)));
  const RuntimeInfo info = ctx.runtime_info();
  auto table = std::make_shared<TuningTable>();
  table->gpu = info.gpu_name;
  table->cudnn = info.cudnn;
  table->workspace_budget = std::size_t(o.tuning_workspace_mb) << 20;
  ctx.set_tuning(table);
  Setup s = make_setup(ctx, o, model, precision, hb);
  s.run();
  ctx.synchronize();
  table->save(path);
  return seconds_since(t0);
}

json counts_json(const std::map<std::string, std::map<std::string, int>>& m) {
  json j = json::object();
  for (const auto& [k, inner] : m) {
    json v = json::object();
    for (const auto& [name, n] : inner) v[name] = n;
    j[k] = v;
  }
  return j;
}

// The timed steps, after o.warmup untimed ones (the first selects algorithms): milliseconds per
// step by the context's interval timer, wall milliseconds per step, and the pool's peak memory
// through the warm-up and over the timed steps.
struct StepTimes {
  double warmup_s = 0, wall_ms = 0;
  std::size_t peak_warmup = 0, peak = 0;
  std::vector<double> ms;
};

StepTimes time_steps(Context& ctx, const Options& o, Setup& s) {
  StepTimes st;
  const auto t_warm = Clock::now();
  for (int i = 0; i < o.warmup; ++i) s.run();
  ctx.synchronize();
  st.warmup_s = seconds_since(t_warm);
  st.peak_warmup = ctx.memory_peak();
  ctx.reset_memory_peak();

  IntervalTimer timer(ctx);
  const auto t0 = Clock::now();
  for (int i = 0; i < o.steps; ++i) {
    timer.start();
    s.run();
    timer.stop();
  }
  ctx.synchronize();
  st.wall_ms = seconds_since(t0) * 1e3 / o.steps;
  st.ms = timer.milliseconds();
  st.peak = ctx.memory_peak();
  return st;
}

// o.profile_steps profiled steps after the timed ones (none: an empty report).
ProfileReport profile_steps(Context& ctx, const Options& o, Setup& s) {
  ProfileReport prof;
  if (o.profile_steps > 0) {
    Profiler profiler(ctx);
    ctx.set_profiler(&profiler);
    for (int i = 0; i < o.profile_steps; ++i) {
      profiler.begin_step();
      s.run();
      profiler.end_step();
    }
    ctx.set_profiler(nullptr);
    prof = profiler.report();
  }
  return prof;
}

// The profile, per step: milliseconds by op kind, and every (kind, variant) with its calls.
void add_breakdown(json& j, const ProfileReport& prof) {
  const double per = prof.steps > 0 ? 1.0 / double(prof.steps) : 0.0;
  json by_kind = json::object(), breakdown = json::array();
  std::map<std::string, double> kind_ms;
  for (const auto& e : prof.entries) {
    kind_ms[e.kind] += e.ms * per;
    breakdown.push_back({{"kind", e.kind}, {"variant", e.variant}, {"ms", e.ms * per}, {"calls", double(e.calls) * per}});
  }
  for (const auto& [k, v] : kind_ms) by_kind[k] = v;
  j["profile_steps"] = prof.steps;
  j["profile_ms"] = prof.total_ms * per;
  j["breakdown_ms"] = by_kind;
  j["breakdown"] = breakdown;
}

// The kernels the manifest recorded: layers per variant of each op.knob, per algorithm of each
// conv direction, and each conv layer's choice.
void add_kernel_choices(json& j, Context& ctx) {
  std::map<std::string, std::map<std::string, int>> conv_algos, variants;
  json kernels = json::array();
  for (const auto& e : ctx.manifest().entries()) {
    variants[e.op + "." + e.knob][e.variant] += 1;
    if (e.op == "conv2d" && (e.knob == "fwd" || e.knob == "bwd_data" || e.knob == "bwd_filter")) {
      conv_algos[e.knob][e.variant] += 1;
      kernels.push_back(fmt::format("{}.{}={}", e.layer, e.knob, e.variant));
    }
  }
  j["conv_algos"] = counts_json(conv_algos);
  j["variants"] = counts_json(variants);
  j["kernels"] = kernels;
}

// The tuning file of a model, batch, image size and precision (fp32 keeps the name it had before
// precisions).
std::string tuning_file(const Options& o, const std::string& model, const std::string& precision) {
  std::string name = fmt::format("{}-b{}-s{}", model, o.batch, image_size(o, model));
  if (precision != "fp32") name += "-" + precision;
  if (bench::channels_last_for(o.channels_last, precision)) name += "-nhwc";
  if (bench::native_for(o.native, o.channels_last, precision)) name += "-native";
  if (o.tuning_workspace_mb) name += fmt::format("-ws{}mb", o.tuning_workspace_mb);
  return (fs::path(o.tuning_dir) / (name + ".json")).string();
}

json measure(const Options& o, const std::string& model, const std::string& mode, const std::string& precision,
             const HostBatch& hb) {
  const int size = image_size(o, model);
  Context ctx(Device::parse(o.device), Policy::parse(bench::with_precision(mode_rules(mode), precision, o.channels_last, o.native, o.rules)));
  std::string tuning_path;
  double tuning_s = 0;
  if (mode == "deterministic-tuned") {
    tuning_path = tuning_file(o, model, precision);
    tuning_s = ensure_tuning(o, model, precision, tuning_path, hb);
    const RuntimeInfo info = ctx.runtime_info();
    ctx.set_tuning(std::make_shared<TuningTable>(TuningTable::load(tuning_path, info.gpu_name, info.cudnn)));
  }
  Setup s = make_setup(ctx, o, model, precision, hb);
  const StepTimes st = time_steps(ctx, o, s);
  const ProfileReport prof = profile_steps(ctx, o, s);
  const std::vector<double>& ms = st.ms;
  const RuntimeInfo info = ctx.runtime_info();
  json j{{"tool", "ditto"},
         {"model", model},
         {"mode", mode},
         {"batch", o.batch},
         {"image_size", size},
         {"classes", o.classes},
         {"dtype", "fp32"},
         {"optimizer", fmt::format("sgd lr {} momentum {}", kLr, kMomentum)},
         {"warmup", o.warmup},
         {"steps", o.steps},
         {"ms_median", percentile(ms, 0.5)},
         {"ms_p10", percentile(ms, 0.1)},
         {"ms_p90", percentile(ms, 0.9)},
         {"ms_min", *std::min_element(ms.begin(), ms.end())},
         {"ms_wall", st.wall_ms},
         {"peak_mem_bytes", st.peak},
         {"peak_mem_warmup_bytes", st.peak_warmup},
         {"mem_source", bench::pool_mem_source(ctx.is_cuda())},
         {"tuning_file", tuning_path},
         {"tuning_workspace_mb", o.tuning_workspace_mb},
         {"tuning_s", tuning_s},
         {"warmup_s", st.warmup_s},
         {"params", s.net->param_count()},
         {"weights_fingerprint", params_fingerprint(s.params).hex()},
         {"device", info.device},
         {"gpu", info.gpu_name},
         {"cudnn", info.cudnn},
         {"commit", info.git_commit},
         {"date", today()}};
  bench::add_precision_fields(j, precision, o.channels_last, o.native, o.rules);
  add_breakdown(j, prof);
  add_kernel_choices(j, ctx);
  return j;
}

bool is_oom(const std::string& what) {
  return what.find("out of device memory") != std::string::npos || what.find("out of memory") != std::string::npos ||
         what.find("cannot be allocated") != std::string::npos || what.find("could not be allocated") != std::string::npos ||
         what.find("ALLOC_FAILED") != std::string::npos;
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--models", o.models, "comma list (default: the 17 zoo models; unknown ones are skipped)")
      ->delimiter(',');
  app.add_option("--modes", o.modes, "comma list")->delimiter(',')->check(CLI::IsMember(kModes));
  bench::add_precisions_option(app, o.precisions, o.channels_last, o.native);
  bench::add_rules_option(app, o.rules);
  app.add_option("--batch", o.batch, "batch size")->check(detail::at_least(1));
  app.add_option("--classes", o.classes, "classes of the synthetic labels")->check(detail::at_least(2));
  app.add_option("--image-size", o.image_size, "image side (0: 224, 299 for inception-v3)")->check(detail::at_least(0));
  app.add_option("--warmup", o.warmup, "untimed steps first (the first selects algorithms)")->check(detail::at_least(1));
  app.add_option("--steps", o.steps, "timed steps (median; the paper profiled 100, fewer for a quick look)")
      ->check(detail::at_least(1))
      ->capture_default_str();
  app.add_option("--profile-steps", o.profile_steps, "profiled steps after the timed ones (0: no breakdown)")
      ->check(detail::at_least(0));
  app.add_option("--budget-s", o.budget_s, "start no configuration after this many seconds (0: no limit)")
      ->check(detail::at_least(0));
  app.add_flag("--resume", o.resume,
               "skip the model x mode x precision configurations --out already holds a measurement (or an "
               "out-of-memory failure) of");
  app.add_option("--device", o.device, "auto | cpu | cuda | cuda:N");
  app.add_option("--out", o.out, "append one JSON line per model x mode x precision to this file");
  app.add_option("--tuning-dir", o.tuning_dir, "where deterministic-tuned keeps its tuning files");
  app.add_option("--tuning-workspace-mb", o.tuning_workspace_mb,
                 "deterministic-tuned: the largest workspace (MiB) a tuned convolution algorithm may take (0: none)")
      ->check(CLI::NonNegativeNumber);
}

// The run: its options, where it appends, and what it has measured so far.
struct Run {
  const Options& o;
  std::map<ConfigKey, double> done;  // by --resume: already in --out
  std::ofstream out;
  HostBatches batches;
  Clock::time_point t_start = Clock::now();
  int failures = 0;
};

// One model x mode x precision's line: its measurement with its ratios to the model's heuristic
// and fastest medians in the same precision measured before it (`median`, by mode, gets its own),
// the error it failed with, or that --budget-s was spent.
json model_mode_line(Run& run, const std::string& model, const std::string& mode, const std::string& precision,
                     std::map<std::string, double>& median) {
  const Options& o = run.o;
  if (o.budget_s > 0 && seconds_since(run.t_start) > o.budget_s)
    return {{"tool", "ditto"}, {"model", model}, {"mode", mode}, {"precision", precision}, {"batch", o.batch},
            {"image_size", image_size(o, model)}, {"skipped", true}, {"oom", false},
            {"error", fmt::format("skipped: --budget-s {} spent", o.budget_s)}};
  try {
    json line = measure(o, model, mode, precision, host_batch(run.batches, o, image_size(o, model)));
    const double m = line["ms_median"].get<double>();
    median[mode] = m;
    if (median.count("heuristic")) line["ratio_vs_heuristic"] = m / median["heuristic"];
    if (median.count("fastest")) line["ratio_vs_fastest"] = m / median["fastest"];
    return line;
  } catch (const std::exception& e) {
    ++run.failures;
    return {{"tool", "ditto"}, {"model", model}, {"mode", mode}, {"precision", precision}, {"batch", o.batch},
            {"image_size", image_size(o, model)}, {"error", e.what()}, {"oom", is_oom(e.what())}};
  }
}

// The line on stdout and to --out, and a one-line summary on stderr.
void report_line(Run& run, const json& line, const std::string& model, const std::string& mode,
                 const std::string& precision) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  if (run.out) run.out << line.dump() << "\n" << std::flush;
  if (line.contains("error")) {
    std::fprintf(stderr, "%-16s %-20s %-5s %s\n", model.c_str(), mode.c_str(), precision.c_str(),
                 line["error"].get<std::string>().substr(0, 300).c_str());
  } else {
    std::fprintf(stderr,
                 "%-16s %-20s %-5s %9.2f ms/step (p10 %.2f, p90 %.2f) peak %.2f GiB x heur %s x fastest %s  [%.0f s]\n",
                 model.c_str(), mode.c_str(), precision.c_str(), line["ms_median"].get<double>(),
                 line["ms_p10"].get<double>(),
                 line["ms_p90"].get<double>(), double(line["peak_mem_bytes"].get<std::size_t>()) / (1 << 30),
                 line.contains("ratio_vs_heuristic") ? fmt::format("{:.2f}", line["ratio_vs_heuristic"].get<double>()).c_str() : "-",
                 line.contains("ratio_vs_fastest") ? fmt::format("{:.2f}", line["ratio_vs_fastest"].get<double>()).c_str() : "-",
                 seconds_since(run.t_start));
  }
}

// Every mode of one model in each precision, modes in kModes' order; those --resume finds in --out
// are not run again.
void measure_model(Run& run, const std::string& model, const std::vector<std::string>& modes) {
  for (const auto& precision : run.o.precisions) {
    std::map<std::string, double> median;  // this model's in this precision, by mode
    for (const auto& mode : modes) {
      if (auto it = run.done.find({model, mode, precision}); it != run.done.end()) {
        if (it->second >= 0) median[mode] = it->second;
        std::fprintf(stderr, "%-16s %-20s %-5s %s in %s already (--resume)\n", model.c_str(), mode.c_str(),
                     precision.c_str(), it->second >= 0 ? "measured" : "out of memory", run.o.out.c_str());
        continue;
      }
      report_line(run, model_mode_line(run, model, mode, precision, median), model, mode, precision);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the cost of determinism per zoo model: ms per step, peak memory and a per-op-kind breakdown per "
               "kernel mode"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    o.device = resolve_device(o.device);
    make_output_folder(o.tuning_dir, "--tuning-dir");
    std::vector<std::string> modes;
    for (const auto& m : kModes)
      if (std::find(o.modes.begin(), o.modes.end(), m) != o.modes.end()) modes.push_back(m);
    if (o.resume && o.out.empty()) throw Error("--resume needs --out (the file whose measurements are kept)");
    Run run{o};
    if (o.resume) run.done = measured_in(o.out);
    if (!o.out.empty()) {
      run.out.open(o.out, std::ios::app);
      if (!run.out) throw IoError(fmt::format("--out: cannot open '{}' for appending", o.out));
    }
    const auto& known = known_models();
    run.t_start = Clock::now();
    for (const auto& model : o.models) {
      if (std::find(known.begin(), known.end(), model) == known.end()) {
        std::fprintf(stderr, "overhead: skipping '%s': make_net does not know it\n", model.c_str());
        continue;
      }
      measure_model(run, model, modes);
    }
    return run.failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overhead: %s\n", e.what());
    return 2;
  }
}
