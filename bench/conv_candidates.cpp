// conv_candidates: every way to run each convolution problem of a model, timed and checked for
// bitwise repeatability — the measurement that decides which deterministic variants a tuned run
// can choose from ("measure before you decide").
//
// Per model (batch --batch, the model's image size, 1000 classes): one deterministic training
// step with an empty tuning table collects the model's convolution problems (engine/tuning.h:
// direction, shapes, strides, padding, dilation, groups), and the context's manifest with the
// net's weight shapes says how many layers meet each problem. Then for every problem (bwd_data
// and bwd_filter; fwd too with --forward), each candidate runs on random operands in the
// --precision's dtype and the --layout:
//   legacy  cuDNN's algorithm enums (algo0, algo1, fft, ...), through ditto's conv2d_forward /
//           conv2d_backward_* with the algorithm pinned (what a policy pin runs); `engine` among
//           them is ditto's engine variant (kernels/conv2d.h: heuristic mode A's first allowed
//           configuration);
//   ditto   ditto-gemm and ditto-direct, the same way;
//   engine  every engine configuration of cuDNN's backend API for the operation graph, as
//           heuristic modes A and FALLBACK list them (engine global index and knob choices), with
//           their numerical notes (kernels/detail/cudnn_engine.h); those noted TENSOR_CORE or
//           DOWN_CONVERT_INPUTS are listed but not run under --precision fp32 (fp32 allows
//           neither).
// A candidate gets one warm-up call, --runs timed calls (CUDA events; the median is reported)
// and --repeat calls whose outputs are fingerprinted: `distinct` is how many different results
// the repeats gave (1: the same bits every call).
//
// One JSON line per (problem, direction, candidate) to --out: model, batch, direction, problem
// (tuning key), x, w, stride, pad, dilation, groups, layers (how many layers of the model meet
// it), family, candidate, labelled (cuDNN's or ditto's determinism label: yes/no/unknown),
// notes, ms, workspace_bytes, distinct, error. bench/conv_candidates_table.py sums them per model.
//   conv_candidates --models resnet50 --out conv_candidates.jsonl
#include <CLI/CLI.hpp>
#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "engine/context.h"
#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/timer.h"
#include "engine/tuning.h"
#include "experiments/cli.h"
#include "experiments/stats.h"
#include "experiments/step.h"
#include "kernels/conv2d.h"
#include "kernels/detail/cudnn_engine.h"
#include "engine/tensor_ops.h"
#include "nets/nets.h"

using namespace ditto;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<std::string> models = {"resnet50"};
  int64_t batch = 128;
  int image_size = 0;  // 0: the model's own
  int runs = 5, repeat = 3;
  std::string precision = "fp32";  // fp32 | tf32 | bf16 | fp16
  std::string layout = "nchw";     // nchw | nhwc
  bool forward = false;
  std::string out;
  bool engines = true;
  int max_engines = 0;  // 0: every configuration the heuristics list
  double budget_s = 0;
};

int image_size(const Options& o, const std::string& model) {
  if (o.image_size > 0) return o.image_size;
  if (model == "inception-v3") return 299;
  if (model == "resnet18" || model == "smallcnn" || model == "smallcnn-bn") return 32;
  return 224;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- measurement -------------------------------------------------------------------------------

struct Timing {
  double ms = -1;
  int distinct = 0;
  std::string error;
};

template <class Fn>
Timing measure(Context& ctx, const Options& o, Fn&& run_once) {
  Timing t;
  try {
    run_once();  // warm-up (and selection)
    IntervalTimer timer(ctx);
    for (int i = 0; i < o.runs; ++i) {
      timer.start();
      run_once();
      timer.stop();
    }
    std::vector<double> ms = timer.milliseconds();
    t.ms = percentile(ms, 0.5);
    std::set<Fingerprint> prints;
    for (int i = 0; i < o.repeat; ++i) prints.insert(run_once().fingerprint());
    t.distinct = int(prints.size());
  } catch (const std::exception& e) {
    t.error = e.what();
  }
  return t;
}

Tensor random_tensor(Context& ctx, const Shape& s, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(s)));
  for (auto& x : v) x = d(g);
  return ctx.from_host(v, s);
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--models", o.models, "comma list")->delimiter(',');
  app.add_option("--batch", o.batch, "batch size")->check(ditto::detail::at_least(1));
  app.add_option("--image-size", o.image_size, "image side (0: the model's own)")->check(ditto::detail::at_least(0));
  app.add_option("--runs", o.runs, "timed calls per candidate (median)")->check(ditto::detail::at_least(1));
  app.add_option("--repeat", o.repeat, "fingerprinted calls per candidate")->check(ditto::detail::at_least(2));
  app.add_option("--precision", o.precision, "fp32 | tf32 | bf16 | fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--layout", o.layout, "nchw | nhwc (the layout cuDNN computes in)")
      ->check(CLI::IsMember({"nchw", "nhwc"}));
  app.add_flag("--forward", o.forward, "the forward problems too");
  app.add_option("--budget-s", o.budget_s, "skip models that would start after this many seconds (0: none)");
  app.add_flag("!--no-engines", o.engines, "leave out cuDNN's backend engine configurations");
  app.add_option("--max-engines", o.max_engines, "run at most this many engine configurations per problem, in "
                                                 "heuristic order (0: all)")->check(ditto::detail::at_least(0));
  app.add_option("--out", o.out, "append one JSON line per candidate")->required();
}

// A model's convolution problems (every direction) and, per problem key without its direction,
// how many of the model's layers meet it.
struct ModelProblems {
  std::vector<TuningEntry> problems;
  std::map<std::string, int> layers_of;
};

// Layers per problem: a layer's x shape (manifest) and weight shape (params) against the
// problems with those shapes (strides and padding cannot be told apart this way; where
// several problems share x and w, each is counted).
std::map<std::string, int> layers_per_problem(const Manifest& manifest, const std::vector<Param>& params,
                                              const std::vector<TuningEntry>& problems) {
  std::map<std::string, int> layers_of;
  std::map<std::string, Shape> weight_of;
  for (const auto& p : params) weight_of[p.name] = p.var.shape();
  for (const auto& m : manifest.entries()) {
    if (m.op != "conv2d" || m.knob != "fwd") continue;
    auto w = weight_of.find(m.layer + ".weight");
    if (w == weight_of.end()) continue;
    std::set<std::string> keys;
    for (const auto& e : problems) {
      TuningEntry k = e;
      k.direction = "";
      if (shape_key(e.x) == m.shape && e.w == w->second) keys.insert(k.key());
    }
    for (const auto& k : keys) layers_of[k] += 1;
  }
  return layers_of;
}

// The problems: one deterministic training step with an empty tuning table.
ModelProblems model_problems(const Options& o, const std::string& model, int size, int classes) {
  ModelProblems mp;
  Context ctx(Device::cuda(0),
              Policy::parse({"*=deterministic", "*.precision=" + o.precision, "*.layout=" + o.layout}));
  auto table = std::make_shared<TuningTable>();
  ctx.set_tuning(table);
  auto net = make_net(ctx, {model, classes, 3});
  net->init(ctx, 0);
  auto params = net->params();
  Sgd opt(ctx, params, SgdOptions{});
  TrainStep step(ctx, *net, opt, false, nullptr, 1);
  Tensor images = random_tensor(ctx, {o.batch, 3, size, size}, 1);
  std::vector<int32_t> lab(static_cast<std::size_t>(o.batch));
  for (std::size_t i = 0; i < lab.size(); ++i) lab[i] = int32_t(i % std::size_t(classes));
  Tensor labels = ctx.from_host(lab, {o.batch});
  Tensor loss = ctx.zeros({1}), correct = ctx.zeros({2}, DType::I32);
  step.run(images, labels, 0.01f, loss, correct);
  ctx.synchronize();
  for (const auto& e : table->entries())
    if (e.op == "conv2d") mp.problems.push_back(e);  // the table also tunes pool and bias knobs
  mp.layers_of = layers_per_problem(ctx.manifest(), params, mp.problems);
  return mp;
}

// One problem of one model, with its operands, and the JSON line each candidate gets.
struct ProblemRun {
  const Options& o;
  const std::string& model;
  int size;
  const TuningEntry& e;
  std::string key;  // e's key without its direction
  int layers;
  RuntimeInfo info;
  std::ofstream& out;
  detail::ConvDirection dir;
  Conv2dParams p;
  Tensor x, w, dy;  // fp32 NCHW: what the library path reads (and prepares)

  void line(const std::string& family, const std::string& cand, const std::string& label,
            const std::vector<std::string>& notes, const Timing& t, std::size_t ws,
            const std::string& algorithm = "") const {
    json j{{"tool", "conv_candidates"}, {"model", model}, {"batch", o.batch}, {"image_size", size},
           {"direction", e.direction}, {"problem", key}, {"x", e.x}, {"w", e.w},
           {"stride", {e.stride_h, e.stride_w}}, {"pad", {e.pad_h, e.pad_w}},
           {"dilation", {e.dilation_h, e.dilation_w}}, {"groups", e.groups}, {"layers", layers},
           {"precision", o.precision}, {"layout", o.layout}, {"family", family}, {"candidate", cand},
           {"labelled", label}, {"notes", notes}, {"workspace_bytes", ws}, {"gpu", info.gpu_name},
           {"cudnn", info.cudnn}, {"commit", info.git_commit}};
    if (!algorithm.empty()) j["algorithm"] = algorithm;
    if (t.error.empty()) j["ms"] = t.ms, j["distinct"] = t.distinct;
    else j["error"] = t.error.substr(0, 400);
    out << j.dump() << "\n" << std::flush;
  }
  void not_run(const std::string& cand, const std::string& label, const std::vector<std::string>& notes,
               std::string why, std::size_t ws) const {
    Timing t;
    t.error = std::move(why);
    line("engine", cand, label, notes, t, ws);
  }
};

// Legacy algorithms, ditto's own and ditto's engine variant, through the library with the
// algorithm pinned.
void library_candidates(Context& ctx, const ProblemRun& r) {
  const TuningEntry& e = r.e;
  for (const auto& info_a : conv_algos(ctx, e.direction, e.x, e.w, r.p, parse_precision(r.o.precision),
                                       r.o.layout == "nhwc" ? ConvLayout::Nhwc : ConvLayout::Nchw)) {
    ctx.policy().set("bench." + e.direction + "=" + info_a.name);
    Timing t = measure(ctx, r.o, [&] {
      switch (r.dir) {
        case detail::ConvDirection::Fwd: return conv2d_forward(ctx, "bench", r.x, r.w, r.p);
        case detail::ConvDirection::BwdData: return conv2d_backward_data(ctx, "bench", r.dy, r.w, e.x, r.p);
        case detail::ConvDirection::BwdFilter: break;
      }
      return conv2d_backward_filter(ctx, "bench", r.x, r.dy, e.w, r.p);
    });
    const bool own = info_a.name.rfind("ditto-", 0) == 0;
    const ManifestEntry* ran = ctx.manifest().find("bench", e.direction, shape_key(e.x));
    r.line(own ? "ditto" : "legacy", info_a.name, determinism_name(info_a.deterministic), {}, t,
           info_a.workspace_bytes, ran ? ran->algorithm : "");
  }
}

// Every engine configuration cuDNN's backend heuristics list, in their order; those fp32 forbids
// are listed, not run.
void engine_candidates(Context& ctx, const ProblemRun& r) {
  const DType dtype = precision_dtype(parse_precision(r.o.precision));
  const Layout layout = r.o.layout == "nhwc" ? Layout::Nhwc : Layout::Nchw;
  try {
    detail::EngineConvSpec es;
    es.direction = r.dir;
    es.x = r.e.x, es.w = r.e.w, es.y = r.dy.shape();
    es.stride[0] = r.p.stride_h, es.stride[1] = r.p.stride_w, es.pad[0] = r.p.pad_h, es.pad[1] = r.p.pad_w;
    es.dilation[0] = r.p.dilation_h, es.dilation[1] = r.p.dilation_w;
    es.dtype = dtype;
    es.nhwc = layout == Layout::Nhwc;
    cudnnHandle_t h = detail::cuda_state(ctx).cudnn;
    const detail::EngineGraph g = detail::engine_graph(h, es);
    // The operands in the form the graph describes; the direction's result overwrites its slot.
    Tensor x = to_form(ctx, r.x, dtype, layout), w = to_form(ctx, r.w, dtype, layout);
    Tensor y = to_form(ctx, r.dy, dtype, layout);
    Tensor& out_t = r.dir == detail::ConvDirection::Fwd ? y : r.dir == detail::ConvDirection::BwdData ? x : w;
    int tried = 0;
    for (const auto& c : g.configs) {
      const std::vector<std::string> notes = c.note_names();
      const std::string label = c.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) ? "no" : "yes";
      if (r.o.precision == "fp32" &&
          (c.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) || c.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))) {
        r.not_run(c.name(), label, notes, "not run: tensor-core or down-converting engine under fp32", 0);
        continue;
      }
      if (r.o.max_engines > 0 && tried >= r.o.max_engines) break;
      ++tried;
      detail::EnginePlan plan;
      if (const cudnnStatus_t st = detail::engine_plan(h, c, &plan); st != CUDNN_STATUS_SUCCESS) {
        r.not_run(c.name(), label, notes, fmt::format("plan not built: {}", cudnnGetErrorString(st)), 0);
        continue;
      }
      ditto::detail::Workspace ws(detail::cuda_state(ctx), std::size_t(plan.workspace_bytes));
      if (!ws.ok()) {
        r.not_run(c.name(), label, notes, fmt::format("workspace of {} bytes not allocatable", plan.workspace_bytes),
                  std::size_t(plan.workspace_bytes));
        continue;
      }
      Timing t = measure(ctx, r.o, [&] {
        const cudnnStatus_t st = detail::engine_execute(h, plan, x.raw(), w.raw(), y.raw(), ws.get());
        if (st != CUDNN_STATUS_SUCCESS) throw CudnnError(fmt::format("execute: {}", cudnnGetErrorString(st)));
        return out_t;  // fingerprinted after each repeat, before the next overwrites it
      });
      r.line("engine", c.name(), label, notes, t, std::size_t(plan.workspace_bytes));
    }
  } catch (const std::exception& ex) {
    Timing t;
    t.error = ex.what();
    r.line("engine", "(graph)", "unknown", {}, t, 0);
  }
}

// Every candidate of every problem of one model.
void model_candidates(const Options& o, const std::string& model, int size, const ModelProblems& mp,
                      std::ofstream& out) {
  Context ctx(Device::cuda(0), Policy::parse({"*.precision=" + o.precision, "*.layout=" + o.layout}));
  const RuntimeInfo info = ctx.runtime_info();
  for (const auto& e : mp.problems) {
    if (e.direction == "fwd" && !o.forward) continue;
    Conv2dParams p;
    p.stride_h = e.stride_h, p.stride_w = e.stride_w, p.pad_h = e.pad_h, p.pad_w = e.pad_w;
    p.dilation_h = e.dilation_h, p.dilation_w = e.dilation_w, p.groups = e.groups;
    const Shape y = conv2d_output_shape("bench", e.x, e.w, p);
    Tensor x = random_tensor(ctx, e.x, 2), w = random_tensor(ctx, e.w, 3), dy = random_tensor(ctx, y, 4);
    TuningEntry k = e;
    k.direction = "";
    const auto layers = mp.layers_of.find(k.key());
    const detail::ConvDirection dir = e.direction == "fwd"        ? detail::ConvDirection::Fwd
                                      : e.direction == "bwd_data" ? detail::ConvDirection::BwdData
                                                                  : detail::ConvDirection::BwdFilter;
    const ProblemRun r{o, model, size, e, k.key(), layers != mp.layers_of.end() ? layers->second : 0, info, out,
                       dir, p, x, w, dy};
    library_candidates(ctx, r);
    if (o.engines) engine_candidates(ctx, r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"every candidate for each convolution problem of a model: time and repeatability"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  std::ofstream out(o.out, std::ios::app);
  if (!out) {
    std::fprintf(stderr, "conv_candidates: cannot open %s\n", o.out.c_str());
    return 2;
  }
  const auto t_start = Clock::now();
  try {
    for (const auto& model : o.models) {
      if (o.budget_s > 0 && seconds_since(t_start) > o.budget_s) {
        std::fprintf(stderr, "%s: skipped, --budget-s spent\n", model.c_str());
        continue;
      }
      const int size = image_size(o, model);
      const int classes = (model == "resnet18" || model.rfind("smallcnn", 0) == 0) ? 10 : 1000;
      const ModelProblems mp = model_problems(o, model, size, classes);
      std::fprintf(stderr, "%s: %zu problem directions [%.0f s]\n", model.c_str(), mp.problems.size(),
                   seconds_since(t_start));
      model_candidates(o, model, size, mp, out);
      std::fprintf(stderr, "%s: done [%.0f s]\n", model.c_str(), seconds_since(t_start));
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "conv_candidates: %s\n", ex.what());
    return 1;
  }
  return 0;
}
