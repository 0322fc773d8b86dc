// step_time: milliseconds per training step, the same step ditto-train runs (experiments/step.h:
// forward, loss, backward, Adam update, device-side loss and accuracy sums), for each model under
// each kernel mode and precision, eager and CUDA-graphed. Per configuration: `--warmup` untimed
// steps, then `--steps` steps each timed by a pair of CUDA events on the context's stream (no host
// synchronization while timing); the median, 10th and 90th percentiles, and the wall time per
// step over the timed loop; the context pool's peak memory through the warm-up and over the timed
// steps. The input is one fixed synthetic batch on the device, so the data loader is not measured.
//
// Modes: heuristic, deterministic, deterministic-tuned (deterministic with a tuning file, written
// on first use under --tuning-dir and read afterwards, one per model, batch and precision),
// fastest, nondeterministic. Precisions (--precisions, default fp32): fp32, tf32, bf16, fp16, each
// the rule `*.precision=VALUE` after the mode's (bench/precision_runs.h); TF32 runs that were modes
// of their own ("tf32", "tf32-deterministic") are `--precisions tf32` under heuristic and
// deterministic. Every configuration starts from the same initial weights, so for a deterministic
// mode the eager and graphed runs must end with the same weights fingerprint; the program checks
// that per precision and exits 1 when they differ. A configuration that fails is recorded as a line
// with its error (tool, model, mode, precision, graph, batch, error), the others still run, and the
// exit status is 1.
//
// Each configuration is one JSON line (--out appends; bench/step_time_table.py renders them with
// the PyTorch peer's lines): tool, model, mode, precision, loss_scale (fp16 only), graph, batch,
// ms_median, ms_p10, ms_p90, ms_wall, steps, peak_mem_bytes, peak_mem_warmup_bytes, mem_source
// (a graphed step's own temporaries live in the graph's memory, not the pool's: compare eager
// lines), flops_per_step (conv and linear, forward + backward), weights_fingerprint, graph_nodes,
// kernels (the conv algorithms the run chose), gpu, cudnn, commit, date.
//   step_time --models smallcnn,resnet18 --modes deterministic-tuned,fastest --precisions fp32,bf16
//       --out step_time.jsonl
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/timer.h"
#include "engine/tracer.h"
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

namespace {

const std::vector<std::string> kModes = {"heuristic", "deterministic", "deterministic-tuned", "fastest",
                                         "nondeterministic"};

std::vector<std::string> mode_rules(const std::string& mode) {
  if (mode == "deterministic-tuned") return {"*=deterministic"};
  return {"*=" + mode};
}

// Counts the fp32 FLOPs of the convolutions and linear layers in one forward pass; a training
// step does each again for the weight gradient and, except where the input needs no gradient
// (the network's input), for the input gradient.
struct FlopCounter : Tracer {
  const void* input = nullptr;
  double flops = 0;
  void begin_step(int64_t) override {}
  void event(const std::string& phase, const std::string&, const std::string& op, const std::vector<TracedTensor>& in,
             const std::vector<TracedTensor>& out) override {
    if (phase != "fwd" || (op != "conv2d" && op != "linear")) return;
    const Tensor* x = nullptr;
    const Tensor* w = nullptr;
    for (const auto& t : in) {
      if (t.name == "x") x = t.tensor;
      if (t.name == "w") w = t.tensor;
    }
    if (!x || !w || out.empty()) return;
    // Per output element: one multiply-add per weight element that reaches it.
    const double fwd = 2.0 * double(out[0].tensor->numel()) * double(w->numel() / w->dim(0));
    flops += fwd * (x->raw() == input ? 2.0 : 3.0);
  }
};

struct Batch {
  Tensor images, labels;
};

Batch make_batch(Context& ctx, int64_t n, int classes) {
  std::mt19937_64 g(12345);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(n * 3 * 32 * 32));
  for (auto& v : x) v = d(g);
  std::vector<int32_t> y(static_cast<std::size_t>(n));
  for (auto& v : y) v = static_cast<int32_t>(g() % static_cast<uint64_t>(classes));
  return {ctx.from_host(x, {n, 3, 32, 32}), ctx.from_host(y, {n})};
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

struct Options {
  std::vector<std::string> models = {"smallcnn", "smallcnn-bn", "resnet18"};
  std::vector<std::string> modes = kModes;
  std::vector<std::string> precisions = {"fp32"};
  bool channels_last = false;  // bf16/fp16 convolutions channels-last (bench/precision_runs.h)
  bool native = false;         // ... handing on bf16/fp16 channels-last results (likewise)
  std::vector<std::string> rules;  // --rules, after each configuration's own
  std::string graph = "both";
  std::string device = "auto";
  std::string out, tuning_dir = "step_time_tuning";
  int64_t batch = 128;
  int warmup = 20, steps = 100;
};

// The tuning file of a model, batch, precision and layout (fp32 keeps the name it had before
// precisions).
std::string tuning_file(const Options& o, const std::string& model, const std::string& precision) {
  std::string name = fmt::format("{}-b{}", model, o.batch);
  if (precision != "fp32") name += "-" + precision;
  if (bench::channels_last_for(o.channels_last, precision)) name += "-nhwc";
  if (bench::native_for(o.native, o.channels_last, precision)) name += "-native";
  return (fs::path(o.tuning_dir) / (name + ".json")).string();
}

json measure(const Options& o, const std::string& model, const std::string& mode, const std::string& precision,
             bool graphed) {
  Context ctx(Device::parse(o.device), Policy::parse(bench::with_precision(mode_rules(mode), precision, o.channels_last, o.native, o.rules)));
  std::shared_ptr<TuningTable> tuning;
  std::string tuning_path;
  if (mode == "deterministic-tuned") {
    const RuntimeInfo info = ctx.runtime_info();
    tuning_path = tuning_file(o, model, precision);
    if (fs::exists(tuning_path)) {
      tuning = std::make_shared<TuningTable>(TuningTable::load(tuning_path, info.gpu_name, info.cudnn));
    } else {
      tuning = std::make_shared<TuningTable>();
      tuning->gpu = info.gpu_name;
      tuning->cudnn = info.cudnn;
    }
    ctx.set_tuning(tuning);
  }
  const int classes = 10;
  std::unique_ptr<Net> net = make_net(ctx, {model, classes, 3});
  net->init(ctx, 0);
  std::vector<Param> params = net->params();
  Adam opt(ctx, params, AdamOptions{});
  Batch batch = make_batch(ctx, o.batch, classes);
  Tensor loss_sum = ctx.zeros({1});
  Tensor correct = ctx.zeros({2}, DType::I32);
  const std::unique_ptr<LossScaler> scaler = bench::loss_scaler_for(ctx, precision);
  TrainStep step(ctx, *net, opt, graphed, nullptr, 0, scaler.get());
  const float lr = 4e-4f;
  step.plan(std::vector<float>(static_cast<std::size_t>(o.warmup + o.steps), lr));
  for (int i = 0; i < o.warmup; ++i) step.run(batch.images, batch.labels, lr, loss_sum, correct);
  ctx.synchronize();
  const std::size_t peak_warmup = ctx.memory_peak();
  ctx.reset_memory_peak();
  IntervalTimer timer(ctx);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) {
    timer.start();
    step.run(batch.images, batch.labels, lr, loss_sum, correct);
    timer.stop();
  }
  ctx.synchronize();
  const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<double> ms = timer.milliseconds();
  const std::size_t peak = ctx.memory_peak();
  if (tuning && !tuning->reading()) tuning->save(tuning_path);

  // The FLOPs of the step are the same in every precision: counted under the mode's rules alone.
  FlopCounter counter;
  {
    Context fctx(ctx.device(), Policy::parse(mode_rules(mode == "deterministic-tuned" ? "deterministic" : mode)));
    std::unique_ptr<Net> fnet = make_net(fctx, {model, classes, 3});
    Batch fb = make_batch(fctx, o.batch, classes);
    counter.input = fb.images.raw();
    fctx.set_tracer(&counter);
    fnet->forward(fctx, Var(fb.images), true);
    fctx.set_tracer(nullptr);
    fctx.tape().clear();
  }

  json kernels = json::array();
  for (const auto& e : ctx.manifest().entries())
    if (e.op == "conv2d" && (e.knob == "fwd" || e.knob == "bwd_data" || e.knob == "bwd_filter"))
      kernels.push_back(fmt::format("{}.{}={}", e.layer, e.knob, e.variant));
  const RuntimeInfo info = ctx.runtime_info();
  json line{{"tool", "ditto"},
            {"model", model},
            {"mode", mode},
            {"graph", graphed},
            {"batch", o.batch},
            {"ms_median", percentile(ms, 0.5)},
            {"ms_p10", percentile(ms, 0.1)},
            {"ms_p90", percentile(ms, 0.9)},
            {"ms_wall", wall / o.steps},
            {"steps", o.steps},
            {"peak_mem_bytes", peak},
            {"peak_mem_warmup_bytes", peak_warmup},
            {"mem_source", bench::pool_mem_source(ctx.is_cuda()) +
                               (graphed ? "; graphed: the graph's own memory (the step's temporaries) left out" : "")},
            {"flops_per_step", counter.flops},
            {"weights_fingerprint", params_fingerprint(params).hex()},
            {"graph_nodes", step.graph_nodes()},
            {"kernels", kernels},
            {"gpu", info.gpu_name},
            {"cudnn", info.cudnn},
            {"commit", info.git_commit},
            {"date", today()}};
  bench::add_precision_fields(line, precision, o.channels_last, o.native, o.rules);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ms per training step, eager and CUDA-graphed, per model, kernel mode and precision"};
  Options o;
  app.add_option("--models", o.models, "comma list")->delimiter(',')->check(CLI::IsMember(known_models()));
  app.add_option("--modes", o.modes, "comma list")->delimiter(',')->check(CLI::IsMember(kModes));
  bench::add_precisions_option(app, o.precisions, o.channels_last, o.native);
  bench::add_rules_option(app, o.rules);
  app.add_option("--graph", o.graph, "eager | graph | both")->check(CLI::IsMember({"eager", "graph", "both"}));
  app.add_option("--batch", o.batch, "batch size")->check(detail::at_least(1));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(detail::at_least(1));
  app.add_option("--steps", o.steps, "timed steps")->check(detail::at_least(1));
  app.add_option("--device", o.device, "auto | cpu | cuda | cuda:N");
  app.add_option("--out", o.out, "append one JSON line per configuration to this file");
  app.add_option("--tuning-dir", o.tuning_dir, "where deterministic-tuned keeps its tuning files");
  CLI11_PARSE(app, argc, argv);
  try {
    o.device = resolve_device(o.device);
    if (o.graph != "eager" && o.device == "cpu") throw Error("--graph: CUDA graphs need a CUDA device; use --graph eager");
    make_output_folder(o.tuning_dir, "--tuning-dir");
    std::vector<bool> graph_settings;
    if (o.graph != "graph") graph_settings.push_back(false);
    if (o.graph != "eager") graph_settings.push_back(true);
    std::ofstream out;
    if (!o.out.empty()) {
      out.open(o.out, std::ios::app);
      if (!out) throw IoError(fmt::format("--out: cannot open '{}' for appending", o.out));
    }
    int mismatches = 0, failures = 0;
    for (const auto& model : o.models)
      for (const auto& precision : o.precisions)
        for (const auto& mode : o.modes) {
          std::map<bool, std::string> fingerprint;
          for (bool g : graph_settings) {
            json line;
            try {
              line = measure(o, model, mode, precision, g);
            } catch (const std::exception& e) {
              // Recorded, and the study goes on: one precision a model cannot run loses no other line.
              ++failures;
              line = {{"tool", "ditto"}, {"model", model}, {"mode", mode}, {"precision", precision}, {"graph", g},
                      {"batch", o.batch}, {"error", e.what()}};
            }
            std::printf("%s\n", line.dump().c_str());
            std::fflush(stdout);
            if (out) out << line.dump() << "\n" << std::flush;
            if (line.contains("error")) {
              std::fprintf(stderr, "%-12s %-20s %-5s %-6s %s\n", model.c_str(), mode.c_str(), precision.c_str(),
                           g ? "graph" : "eager", line["error"].get<std::string>().substr(0, 300).c_str());
              continue;
            }
            fingerprint[g] = line["weights_fingerprint"];
            std::fprintf(stderr, "%-12s %-20s %-5s %-6s %8.3f ms/step (p10 %.3f, p90 %.3f, wall %.3f) peak %.1f MiB\n",
                         model.c_str(), mode.c_str(), precision.c_str(), g ? "graph" : "eager",
                         line["ms_median"].get<double>(), line["ms_p10"].get<double>(), line["ms_p90"].get<double>(),
                         line["ms_wall"].get<double>(), double(line["peak_mem_bytes"].get<std::size_t>()) / (1 << 20));
          }
          const bool deterministic = mode.find("deterministic") != std::string::npos && mode != "nondeterministic";
          if (fingerprint.size() == 2) {
            const bool same = fingerprint[false] == fingerprint[true];
            std::fprintf(stderr, "BITS %s %s %s eager %s graphed: %s\n", model.c_str(), mode.c_str(), precision.c_str(),
                         same ? "==" : "!=", deterministic ? (same ? "ok" : "MISMATCH") : "(not a deterministic mode)");
            if (deterministic && !same) ++mismatches;
          }
        }
    return mismatches || failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_time: %s\n", e.what());
    return 2;
  }
}
