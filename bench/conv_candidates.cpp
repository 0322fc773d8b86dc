// conv_candidates: every way to run each convolution backward problem of a model, timed and
// checked for bitwise repeatability — the measurement that decides which deterministic variants
// a tuned run can choose from ("measure before you decide").
//
// Per model (batch --batch, the model's image size, 1000 classes): one deterministic training
// step with an empty tuning table collects the model's convolution problems (engine/tuning.h:
// direction, shapes, strides, padding, dilation, groups), and the context's manifest with the
// net's weight shapes says how many layers meet each problem. Then for every bwd_data and
// bwd_filter problem, each candidate runs on random operands:
//   legacy  cuDNN's algorithm enums (algo0, algo1, fft, ...), through ditto's conv2d_backward_*
//           with the algorithm pinned (what a policy pin runs);
//   ditto   ditto-gemm and ditto-direct, the same way;
//   engine  cuDNN's backend engine configurations for the operation graph, as heuristic modes A
//           and FALLBACK list them (engine global index and knob choices), with their numerical
//           notes; those noted TENSOR_CORE or DOWN_CONVERT_INPUTS are listed but not run under
//           --precision fp32 (fp32 allows neither).
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
  std::string precision = "fp32";  // fp32 | tf32: the backend graphs here are float
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

// ---- cuDNN's backend API: engine configurations of one convolution backward operation --------

#define BK_CHECK(expr)                                                                             \
  do {                                                                                             \
    cudnnStatus_t s_ = (expr);                                                                     \
    if (s_ != CUDNN_STATUS_SUCCESS) throw CudnnError(fmt::format("{} failed: {}", #expr, cudnnGetErrorString(s_))); \
  } while (0)

class Backend {
 public:
  explicit Backend(cudnnBackendDescriptorType_t t) { BK_CHECK(cudnnBackendCreateDescriptor(t, &d_)); }
  ~Backend() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Backend(Backend&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
    BK_CHECK(cudnnBackendSetAttribute(d_, a, t, n, v));
  }
  void finalize() { BK_CHECK(cudnnBackendFinalize(d_)); }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* ptr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

Backend tensor_desc(int64_t uid, const std::vector<int64_t>& dims) {
  Backend t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  std::vector<int64_t> strides(4);
  strides[3] = 1;
  for (int i = 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  const int64_t align = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  t.finalize();
  return t;
}

struct EngineCfg {
  std::shared_ptr<Backend> cfg;
  int64_t engine = -1;
  std::vector<std::pair<int, int64_t>> knobs;  // (knob type, value)
  std::vector<int> notes;                      // cudnnBackendNumericalNote_t
  std::string name() const {  // "eng12[k2=3,k5=1]"
    std::string s;
    for (const auto& [k, v] : knobs) s += fmt::format("{}k{}={}", s.empty() ? "" : ",", k, v);
    return fmt::format("eng{}[{}]", engine, s);
  }
  bool has(int note) const { return std::find(notes.begin(), notes.end(), note) != notes.end(); }
};

const char* note_name(int n) {
  switch (n) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: return "TENSOR_CORE";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: return "DOWN_CONVERT_INPUTS";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: return "REDUCED_PRECISION_REDUCTION";
    case CUDNN_NUMERICAL_NOTE_FFT: return "FFT";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: return "NONDETERMINISTIC";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD: return "WINOGRAD";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4: return "WINOGRAD_TILE_4x4";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6: return "WINOGRAD_TILE_6x6";
    case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13: return "WINOGRAD_TILE_13x13";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP: return "STRICT_NAN_PROP";
  }
  return "?";
}

// The operation graph of one backward convolution and the engine configurations cuDNN's
// heuristics (modes A and FALLBACK) list for it, without duplicates.
struct EngineProblem {
  std::vector<Backend> keep;  // tensors, conv, op: alive as long as the graph
  std::shared_ptr<Backend> graph;
  std::vector<EngineCfg> cfgs;
  int64_t uid_in = 1, uid_other = 2, uid_out = 3;
};

// The backward operation's convolution descriptor: fp32 cross-correlation with e's strides,
// padding and dilation.
Backend conv_descriptor(const TuningEntry& e) {
  Backend conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, dil[2] = {e.dilation_h, e.dilation_w}, str[2] = {e.stride_h, e.stride_w},
                pad[2] = {e.pad_h, e.pad_w};
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.finalize();
  return conv;
}

// The backward-data (w, dy -> dx) or backward-filter (x, dy -> dw) operation over p's tensors
// (p.keep: x, w, dy), with p's uids set to its inputs and output.
Backend backward_operation(bool data, const Backend& conv, EngineProblem& p) {
  const float alpha = 1.f, beta = 0.f;
  Backend op(data ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                  : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
  auto xd = p.keep[0].get(), wd = p.keep[1].get(), yd = p.keep[2].get(), cd = conv.get();
  if (data) {
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    p.uid_in = 2, p.uid_other = 3, p.uid_out = 1;  // w, dy -> dx
  } else {
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    p.uid_in = 1, p.uid_other = 3, p.uid_out = 2;  // x, dy -> dw
  }
  op.finalize();
  return op;
}

// The knob choices of an engine configuration, as (knob type, value); none where cuDNN lists none.
std::vector<std::pair<int, int64_t>> knob_choices(const Backend& cfg) {
  std::vector<std::pair<int, int64_t>> knobs;
  int64_t nk = 0;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &nk,
                               nullptr) != CUDNN_STATUS_SUCCESS || nk <= 0)
    return knobs;
  std::vector<Backend> choices;
  std::vector<cudnnBackendDescriptor_t> craw;
  for (int64_t j = 0; j < nk; ++j) {
    choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    craw.push_back(choices.back().get());
  }
  int64_t gk = 0;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, nk, &gk,
                               craw.data()) == CUDNN_STATUS_SUCCESS)
    for (int64_t j = 0; j < gk; ++j) {
      cudnnBackendKnobType_t type;
      int64_t value = 0, m = 0;
      cudnnBackendGetAttribute(craw[j], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &m, &type);
      cudnnBackendGetAttribute(craw[j], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &m, &value);
      knobs.push_back({int(type), value});
    }
  return knobs;
}

// An engine configuration's engine (global index), numerical notes and sorted knob choices; false
// where cuDNN does not say which engine it configures.
bool describe_engine_cfg(EngineCfg& c) {
  Backend eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (cudnnBackendGetAttribute(c.cfg->get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                               eng.ptr()) != CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendGetAttribute(eng.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &c.engine);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t nn = 0;
  if (cudnnBackendGetAttribute(eng.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS)
    for (int64_t j = 0; j < nn; ++j) c.notes.push_back(int(notes[j]));
  c.knobs = knob_choices(*c.cfg);
  std::sort(c.knobs.begin(), c.knobs.end());
  return true;
}

// The engine configurations heuristic mode `hm` lists for `graph`, in its order (none where the
// mode does not apply).
std::vector<std::shared_ptr<Backend>> heuristic_cfgs(const Backend& graph, cudnnBackendHeurMode_t hm) {
  Backend heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  auto gd = graph.get();
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS || count <= 0)
    return {};
  std::vector<std::shared_ptr<Backend>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_shared<Backend>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  BK_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                    &got, raw.data()));
  cfgs.resize(static_cast<std::size_t>(std::min(got, count)));
  return cfgs;
}

EngineProblem engine_problem(cudnnHandle_t h, const std::string& direction, const TuningEntry& e) {
  EngineProblem p;
  const int64_t N = e.x[0], K = e.w[0];
  const auto& x = e.x;
  const auto& w = e.w;
  const int64_t Ho = (x[2] + 2 * e.pad_h - e.dilation_h * (w[2] - 1) - 1) / e.stride_h + 1;
  const int64_t Wo = (x[3] + 2 * e.pad_w - e.dilation_w * (w[3] - 1) - 1) / e.stride_w + 1;
  p.keep.push_back(tensor_desc(1, x));
  p.keep.push_back(tensor_desc(2, w));
  p.keep.push_back(tensor_desc(3, {N, K, Ho, Wo}));
  Backend conv = conv_descriptor(e);
  Backend op = backward_operation(direction == "bwd_data", conv, p);
  p.graph = std::make_shared<Backend>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  auto opd = op.get();
  p.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opd);
  p.graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  p.graph->finalize();
  p.keep.push_back(std::move(conv));
  p.keep.push_back(std::move(op));

  std::set<std::string> seen;
  for (cudnnBackendHeurMode_t hm : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK})
    for (auto& cfg : heuristic_cfgs(*p.graph, hm)) {
      EngineCfg c;
      c.cfg = std::move(cfg);
      if (!describe_engine_cfg(c)) continue;
      if (seen.insert(c.name()).second) p.cfgs.push_back(std::move(c));
    }
  return p;
}

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
  app.add_option("--precision", o.precision, "fp32 | tf32")->check(CLI::IsMember({"fp32", "tf32"}));
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
  Context ctx(Device::cuda(0), Policy::parse({"*=deterministic", "*.precision=" + o.precision}));
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

// One backward problem of one model, with its operands, and the JSON line each candidate gets.
struct ProblemRun {
  const Options& o;
  const std::string& model;
  int size;
  const TuningEntry& e;
  std::string key;  // e's key without its direction
  int layers;
  RuntimeInfo info;
  std::ofstream& out;
  bool data;  // bwd_data (w, dy -> dx); otherwise bwd_filter (x, dy -> dw)
  Conv2dParams p;
  Tensor x, w, dy;

  void line(const std::string& family, const std::string& cand, const std::string& label,
            const std::vector<std::string>& notes, const Timing& t, std::size_t ws) const {
    json j{{"tool", "conv_candidates"}, {"model", model}, {"batch", o.batch}, {"image_size", size},
           {"direction", e.direction}, {"problem", key}, {"x", e.x}, {"w", e.w},
           {"stride", {e.stride_h, e.stride_w}}, {"pad", {e.pad_h, e.pad_w}},
           {"dilation", {e.dilation_h, e.dilation_w}}, {"groups", e.groups}, {"layers", layers},
           {"precision", o.precision}, {"family", family}, {"candidate", cand}, {"labelled", label}, {"notes", notes},
           {"workspace_bytes", ws}, {"gpu", info.gpu_name}, {"cudnn", info.cudnn}, {"commit", info.git_commit}};
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

// Legacy algorithms and ditto's own, through the library with the algorithm pinned.
void library_candidates(Context& ctx, const ProblemRun& r) {
  const TuningEntry& e = r.e;
  for (const auto& info_a : conv_algos(ctx, e.direction, e.x, e.w, r.p,
                                       parse_precision(r.o.precision))) {
    ctx.policy().set("bench." + e.direction + "=" + info_a.name);
    Timing t = measure(ctx, r.o, [&] {
      return r.data ? conv2d_backward_data(ctx, "bench", r.dy, r.w, e.x, r.p)
                    : conv2d_backward_filter(ctx, "bench", r.x, r.dy, e.w, r.p);
    });
    const bool own = info_a.name.rfind("ditto-", 0) == 0;
    r.line(own ? "ditto" : "legacy", info_a.name, determinism_name(info_a.deterministic), {}, t,
           info_a.workspace_bytes);
  }
}

// One engine configuration: its execution plan, workspace and variant pack, then measured into
// out_t.
void run_engine_cfg(Context& ctx, const ProblemRun& r, const EngineProblem& ep, const EngineCfg& c,
                    const std::string& label, const std::vector<std::string>& notes, Tensor& out_t) {
  cudnnHandle_t h = detail::cuda_state(ctx).cudnn;
  Backend plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  auto cd = c.cfg->get();
  plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
  if (const cudnnStatus_t st = plan.try_finalize(); st != CUDNN_STATUS_SUCCESS)
    return r.not_run(c.name(), label, notes, fmt::format("plan not built: {}", cudnnGetErrorString(st)), 0);
  int64_t ws_bytes = 0, n = 0;
  cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws_bytes);
  ditto::detail::Workspace ws(detail::cuda_state(ctx), std::size_t(ws_bytes));
  if (!ws.ok())
    return r.not_run(c.name(), label, notes, fmt::format("workspace of {} bytes not allocatable", ws_bytes),
                     std::size_t(ws_bytes));
  void* ptrs[3] = {r.data ? r.w.raw() : r.x.raw(), r.dy.raw(), out_t.raw()};
  int64_t uids[3] = {ep.uid_in, ep.uid_other, ep.uid_out};
  Backend pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  void* wsp = ws.get();
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
  pack.finalize();
  Timing t = measure(ctx, r.o, [&] {
    BK_CHECK(cudnnBackendExecute(h, plan.get(), pack.get()));
    return out_t;  // fingerprinted after each repeat, before the next overwrites it
  });
  r.line("engine", c.name(), label, notes, t, std::size_t(ws_bytes));
}

// cuDNN's backend engine configurations, in heuristic order; those fp32 forbids are listed,
// not run.
void engine_candidates(Context& ctx, const ProblemRun& r) {
  try {
    EngineProblem ep = engine_problem(detail::cuda_state(ctx).cudnn, r.e.direction, r.e);
    Tensor out_t = ctx.empty(r.data ? r.e.x : r.e.w);
    int tried = 0;
    for (const auto& c : ep.cfgs) {
      std::vector<std::string> notes;
      for (int n : c.notes) notes.push_back(note_name(n));
      const std::string label = c.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) ? "no" : "yes";
      if (r.o.precision == "fp32" &&
          (c.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) || c.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))) {
        r.not_run(c.name(), label, notes, "not run: tensor-core or down-converting engine under fp32", 0);
        continue;
      }
      if (r.o.max_engines > 0 && tried >= r.o.max_engines) break;
      ++tried;
      run_engine_cfg(ctx, r, ep, c, label, notes, out_t);
    }
  } catch (const std::exception& ex) {
    Timing t;
    t.error = ex.what();
    r.line("engine", "(graph)", "unknown", {}, t, 0);
  }
}

// Every candidate of every backward problem of one model.
void model_candidates(const Options& o, const std::string& model, int size, const ModelProblems& mp,
                      std::ofstream& out) {
  Context ctx(Device::cuda(0), Policy::parse({"*.precision=" + o.precision}));
  const RuntimeInfo info = ctx.runtime_info();
  for (const auto& e : mp.problems) {
    if (e.direction == "fwd") continue;
    Conv2dParams p;
    p.stride_h = e.stride_h, p.stride_w = e.stride_w, p.pad_h = e.pad_h, p.pad_w = e.pad_w;
    p.dilation_h = e.dilation_h, p.dilation_w = e.dilation_w, p.groups = e.groups;
    const Shape y = conv2d_output_shape("bench", e.x, e.w, p);
    Tensor x = random_tensor(ctx, e.x, 2), w = random_tensor(ctx, e.w, 3), dy = random_tensor(ctx, y, 4);
    TuningEntry k = e;
    k.direction = "";
    const auto layers = mp.layers_of.find(k.key());
    const ProblemRun r{o, model, size, e, k.key(), layers != mp.layers_of.end() ? layers->second : 0, info, out,
                       e.direction == "bwd_data", p, x, w, dy};
    library_candidates(ctx, r);
    if (o.engines) engine_candidates(ctx, r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"every candidate for each convolution backward problem of a model: time and repeatability"};
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
