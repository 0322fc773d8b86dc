#include "experiments/diverge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/manifest.h"
#include "engine/param.h"
#include "engine/tracer.h"
#include "experiments/run_dir.h"
#include "experiments/svg.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Two runs meet after every step; the second to arrive compares while the first waits, so
// neither runs ahead and each step's traces can be compared (and dropped) together.
class Lockstep {
 public:
  void arrive(const std::function<void()>& meet) {
    std::unique_lock<std::mutex> lk(m_);
    if (failed_) throw Error("stopped: the other run failed");
    if (++arrived_ == 2) {
      arrived_ = 0;
      try {
        meet();
      } catch (...) {
        failed_ = true;
        cv_.notify_all();
        throw;
      }
      ++generation_;
      cv_.notify_all();
      return;
    }
    const uint64_t g = generation_;
    cv_.wait(lk, [&] { return generation_ != g || failed_; });
    if (failed_) throw Error("stopped: the other run failed");
  }
  void fail() {
    std::lock_guard<std::mutex> lk(m_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool failed_ = false;
};

// What a trace records about its run: the kernels side (compared, not required to agree) and
// everything else that decides the bits, which must agree for a comparison to mean anything
// (trace_config_difference): the defining flags, the seeds and the data's fingerprints.
TraceMeta meta_of(const TrainConfig& c, const std::string& run, const TrainData& data) {
  RuntimeInfo info = Context(Device::parse(c.device)).runtime_info();
  std::string pins;
  for (const auto& p : c.pins) pins += (pins.empty() ? "" : " ") + p;
  TraceMeta m = {{"run", run},           {"model", c.model},         {"dataset", c.dataset},
                 {"kernels", c.kernels}, {"pins", pins},             {"device", c.device},
                 {"gpu", info.gpu_name.empty() ? "cpu" : info.gpu_name},  {"cudnn", info.cudnn},
                 {"driver", info.driver}, {"git_commit", info.git_commit}, {"batch_size", std::to_string(c.batch_size)},
                 {"command_line", c.command_line}};
  for (const auto& f : defining_flags(c))
    if (f.kind == DefiningFlag::Kind::Training || f.kind == DefiningFlag::Kind::Length) m[f.flag] = f.value;
  // Traced runs fix their seeds (with_fixed_seeds): a given seed, else the switch's 0.
  m["--seed-init"] = std::to_string(c.seed_init.value_or(0));
  m["--seed-order"] = std::to_string(c.seed_order.value_or(0));
  m["--seed-augment"] = std::to_string(c.seed_augment.value_or(0));
  m["train_fingerprint"] = data.train.fingerprint().hex();
  m["test_fingerprint"] = data.test.fingerprint().hex();
  return m;
}

// A traced run compares with another only under the same seeds: given ones, else the switches'.
TrainConfig with_fixed_seeds(TrainConfig c) {
  if (!c.seed_init) c.deterministic_init = true;
  if (!c.seed_order && !c.seed_augment) c.deterministic_input = true;
  if (!c.seed_order && c.seed_augment) c.seed_order = 0;
  if (c.seed_order && !c.seed_augment) c.seed_augment = 0;
  return c;
}

}  // namespace

bool output_is_read(const std::vector<TraceEvent>& events, std::size_t index, const std::string& tensor) {
  const TraceEvent& e = events.at(index);
  if (e.phase == "update") return true;  // the next step's forward reads the weights
  auto it = std::find_if(e.outputs.begin(), e.outputs.end(), [&](const TraceTensor& t) { return t.name == tensor; });
  if (it == e.outputs.end()) return false;
  for (std::size_t j = index + 1; j < events.size() && events[j].step == e.step; ++j)
    for (const auto& in : events[j].inputs)
      if (in.fingerprint == it->fingerprint && in.numel == it->numel) return true;
  return false;
}

Divergence first_read_divergence(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b,
                                 std::vector<Divergence>* unread) {
  std::size_t offset = 0;
  for (;;) {
    std::vector<TraceEvent> sa(a.begin() + static_cast<std::ptrdiff_t>(std::min(offset, a.size())), a.end());
    std::vector<TraceEvent> sb(b.begin() + static_cast<std::ptrdiff_t>(std::min(offset, b.size())), b.end());
    Divergence d = first_divergence(sa, sb);
    if (!d.found || d.structure_mismatch || d.input_only) return d;  // an input is read by definition
    std::size_t k = offset;
    while (k < a.size() && !(a[k].step == d.event_a.step && a[k].seq == d.event_a.seq)) ++k;
    if (k == a.size()) return d;
    // Any differing output of this event that is read on makes it the source.
    for (std::size_t o = 0; o < a[k].outputs.size() && o < b[k].outputs.size(); ++o)
      if (a[k].outputs[o].fingerprint != b[k].outputs[o].fingerprint && output_is_read(a, k, a[k].outputs[o].name)) {
        d.tensor = a[k].outputs[o].name;
        return d;
      }
    if (unread) unread->push_back(d);
    offset = k + 1;
  }
}

void RecordingTracer::begin_step(int64_t step) {
  if (!events_.empty()) clear_step();
  step_ = step;
  unnamed_.clear();
}

void RecordingTracer::event(const std::string& phase, const std::string& layer, const std::string& op,
                            const std::vector<TracedTensor>& inputs, const std::vector<TracedTensor>& outputs) {
  TraceEvent e;
  e.step = step_;
  e.seq = static_cast<int64_t>(events_.size());
  e.phase = phase;
  // Unnamed ops (ReLU, adds, pooling without knobs) are told apart by their order in the step;
  // the backward closure of "relu#3" gets the same name as its forward.
  if (layer.empty()) {
    const std::string key = phase == "fwd" ? op : phase + op;
    e.layer = fmt::format("{}#{}", op, ++unnamed_[key]);
    if (phase == "bwd") {
      // Backward runs in reverse: count down from the number of forward occurrences.
      int fwd = unnamed_.count(op) ? unnamed_[op] : 0;
      e.layer = fmt::format("{}#{}", op, fwd - unnamed_[key] + 1);
    }
  } else {
    e.layer = layer;
  }
  e.op = op;
  const std::size_t index = events_.size();
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    e.inputs.push_back({inputs[k].name, Fingerprint{}, inputs[k].tensor->numel()});
    pending_.push_back({index, k, digests_.add(*inputs[k].tensor), false});
  }
  const bool keep = keep_data_ || (keep_activations_ && phase == "fwd" && !layer.empty());
  std::vector<Tensor> kept;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    e.outputs.push_back({outputs[k].name, Fingerprint{}, outputs[k].tensor->numel()});
    pending_.push_back({index, k, digests_.add(*outputs[k].tensor), true});
    kept.push_back(keep && is_float(outputs[k].tensor->dtype()) ? snapshot(*outputs[k].tensor) : Tensor());
  }
  events_.push_back(std::move(e));
  snapshots_.push_back(std::move(kept));
  ++events_seen_;
}

void RecordingTracer::resolve() {
  if (pending_.empty()) return;
  const std::vector<Fingerprint> values = digests_.take();
  for (const auto& p : pending_) {
    TraceEvent& e = events_[p.event];
    (p.output ? e.outputs : e.inputs)[p.index].fingerprint = values[p.slot];
  }
  pending_.clear();
}

const std::vector<TraceEvent>& RecordingTracer::step_events() {
  resolve();
  return events_;
}

const Tensor* RecordingTracer::output_snapshot(int64_t seq, const std::string& tensor) const {
  if (seq < 0 || seq >= static_cast<int64_t>(events_.size())) return nullptr;
  const auto& e = events_[static_cast<std::size_t>(seq)];
  for (std::size_t k = 0; k < e.outputs.size(); ++k)
    if (e.outputs[k].name == tensor) {
      const Tensor& t = snapshots_[static_cast<std::size_t>(seq)][k];
      return t.defined() ? &t : nullptr;
    }
  return nullptr;
}

void RecordingTracer::clear_step() {
  resolve();
  if (writer_)
    for (const auto& e : events_) writer_->write(e);
  events_.clear();
  snapshots_.clear();
}

namespace {

// What one run shows the other at a meeting: its parameters after the step (on its device; the
// run waits at the meeting, so they hold still) and, at evaluated steps, its test predictions.
struct Side {
  const std::vector<Param>* params = nullptr;
  std::vector<int32_t> preds;
  bool evaluated = false;
};

// The layer a parameter belongs to: its name without the last component ("layer1.0.conv1.weight"
// -> "layer1.0.conv1").
std::string layer_of_param(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

TensorDiff to_diff(const BitDistance& d) {
  TensorDiff t;
  t.numel = d.numel;
  t.differing = d.differing;
  t.max_ulp = d.max_ulp;
  t.l2 = d.l2;
  t.max_abs = d.max_abs;
  return t;
}

// Compares the two runs each time they meet: where their traces first part, where they first
// part in a way that is read on, how far their weights and predictions have moved apart, and per
// layer how far its weights and its forward output are apart (all distances on the device).
class StepComparer {
 public:
  StepComparer(RecordingTracer& ta, RecordingTracer& tb, DivergeResult& result,
               std::function<void(const std::string&)> log)
      : ta_(ta), tb_(tb), result_(result), log_(std::move(log)) {}

  Side side[2];  // filled by each run before it arrives

  void meet(int64_t step) {
    const auto& ea = ta_.step_events();
    const auto& eb = tb_.step_events();
    if (result_.events_per_step == 0) result_.events_per_step = static_cast<int64_t>(ea.size());
    StepGrowth g;
    g.step = step;
    auto per_step = differing_outputs_per_step(ea, eb);
    g.differing_outputs = per_step.empty() ? 0 : per_step.front().second;
    locate_divergences(ea, eb);
    compare_sides(step, ea, eb, g);
    result_.growth.push_back(g);
    ta_.clear_step();
    tb_.clear_step();
    if (step == 1 || step % 50 == 0)
      log_(fmt::format("step {}: {} traced tensors of {} ops differ; weights max ULP {}, L2 {:.3g}{}", step,
                       g.differing_outputs, result_.events_per_step, g.weights_max_ulp, g.weights_l2,
                       g.prediction_diffs >= 0 ? fmt::format(", {} test predictions differ", g.prediction_diffs) : ""));
  }

 private:
  // The two runs' snapshots of the divergence's tensor, compared element by element on their
  // device (empty when they were not kept).
  TensorDiff measure(const Divergence& d) const {
    const Tensor* va = ta_.output_snapshot(d.event_a.seq, d.tensor);
    const Tensor* vb = tb_.output_snapshot(d.event_b.seq, d.tensor);
    if (va && vb && va->shape() == vb->shape() && va->dtype() == vb->dtype()) return to_diff(bit_distance(*va, *vb));
    return {};
  }

  // The first divergence, then the first one read on, each measured once found; the tracers stop
  // keeping every output when nothing is left to measure.
  void locate_divergences(const std::vector<TraceEvent>& ea, const std::vector<TraceEvent>& eb) {
    if (!result_.first.found && !result_.first.structure_mismatch) {
      Divergence d = first_divergence(ea, eb);
      if (d.found || d.structure_mismatch) {
        result_.first = d;
        if (d.found) result_.first_diff = measure(d);
      }
    }
    if (result_.first.found && !result_.source.found && !result_.source.structure_mismatch) {
      Divergence d = first_read_divergence(ea, eb);
      if (d.found || d.structure_mismatch) {
        result_.source = d;
        if (d.found) result_.source_diff = measure(d);
        ta_.set_keep_data(false);  // the outputs were kept only to measure these points
        tb_.set_keep_data(false);
      }
    }
    if (result_.first.structure_mismatch) {
      ta_.set_keep_data(false);
      tb_.set_keep_data(false);
      ta_.set_keep_activations(false);
      tb_.set_keep_activations(false);
    }
  }

  // The row of `layer` in the per-layer table, added in the order layers are first seen.
  std::size_t layer_row(const std::string& layer) {
    auto it = layer_rows_.find(layer);
    if (it != layer_rows_.end()) return it->second;
    result_.layers.push_back(layer);
    return layer_rows_[layer] = result_.layers.size() - 1;
  }

  // One device pass over every parameter pair and every named layer's forward output pair: the
  // weights' distance after the step (whole and per layer), the activations' per layer and,
  // where both runs evaluated, their differing predictions.
  void compare_sides(int64_t step, const std::vector<TraceEvent>& ea, const std::vector<TraceEvent>& eb,
                     StepGrowth& g) {
    std::vector<std::pair<const Tensor*, const Tensor*>> pairs;
    std::vector<std::pair<std::size_t, bool>> rows;  // per pair: layer row, is an activation
    const auto& pa = *side[0].params;
    const auto& pb = *side[1].params;
    // Layers in forward order first (the named forward events), then any parameter's layer
    // that no forward event named.
    if (!result_.first.structure_mismatch)
      for (std::size_t k = 0; k < ea.size() && k < eb.size(); ++k) {
        if (ea[k].phase != "fwd" || ea[k].layer.find('#') != std::string::npos) continue;
        const Tensor* ya = ta_.output_snapshot(ea[k].seq, "y");
        const Tensor* yb = tb_.output_snapshot(eb[k].seq, "y");
        if (!ya || !yb || ya->shape() != yb->shape() || ya->dtype() != yb->dtype()) continue;
        const std::size_t row = layer_row(ea[k].layer);
        if (std::any_of(rows.begin(), rows.end(), [&](const auto& r) { return r.first == row && r.second; }))
          continue;  // a layer applied twice: its first output stands for it
        pairs.push_back({ya, yb});
        rows.push_back({row, true});
      }
    for (std::size_t i = 0; i < pa.size() && i < pb.size(); ++i) {
      pairs.push_back({&pa[i].var.value(), &pb[i].var.value()});
      rows.push_back({layer_row(layer_of_param(pa[i].name)), false});
    }
    const std::vector<BitDistance> d = bit_distances(pairs);
    std::vector<LayerDistance> layers(result_.layers.size());
    double weights_sq = 0;
    for (std::size_t k = 0; k < d.size(); ++k) {
      LayerDistance& l = layers[rows[k].first];
      if (rows[k].second) {
        l.has_activations = true;
        l.activations_l2 = d[k].l2;
        l.activations_norm = d[k].norm;
        continue;
      }
      l.has_weights = true;
      l.weights_l2 = std::hypot(l.weights_l2, d[k].l2);
      l.weights_norm = std::hypot(l.weights_norm, d[k].norm);
      g.weights_max_ulp = std::max(g.weights_max_ulp, d[k].max_ulp);
      g.weights_differing += d[k].differing;
      weights_sq += d[k].l2 * d[k].l2;
    }
    g.weights_l2 = std::sqrt(weights_sq);
    result_.layer_growth.push_back(std::move(layers));
    if (side[0].evaluated && side[1].evaluated) {
      g.prediction_diffs = 0;
      for (std::size_t i = 0; i < side[0].preds.size(); ++i) g.prediction_diffs += side[0].preds[i] != side[1].preds[i];
      if (g.prediction_diffs > 0 && !result_.first_prediction_step) result_.first_prediction_step = step;
    }
  }

  RecordingTracer &ta_, &tb_;
  DivergeResult& result_;
  std::function<void(const std::string&)> log_;
  std::map<std::string, std::size_t> layer_rows_;
};

// Trains configs[0] (on this thread) and configs[1] (on another) in lockstep, meeting after every
// step to compare. When a run fails, the other stops; the failure that stopped them is rethrown
// before the other's "stopped" error.
std::array<TrainResult, 2> train_in_lockstep(const TrainConfig (&configs)[2], RecordingTracer* const (&tracers)[2],
                                             StepComparer& comparer, const DivergeOptions& opts,
                                             const std::shared_ptr<const TrainData>& data) {
  Lockstep lockstep;
  std::exception_ptr err[2];
  bool secondary[2] = {false, false};
  std::array<TrainResult, 2> res;
  auto run = [&](int k) {
    TrainHooks hooks;
    hooks.tracer = tracers[k];
    hooks.after_step = [&, k](const StepView& v) {
      Side& side = comparer.side[k];
      side.params = &v.params;
      side.evaluated = opts.eval_every > 0 && v.step % opts.eval_every == 0;
      if (side.evaluated) side.preds = v.predict();
      lockstep.arrive([&] { comparer.meet(v.step); });
    };
    try {
      res[k] = train(configs[k], hooks, data);
    } catch (const Error& e) {
      secondary[k] = std::string(e.what()).rfind("stopped: the other run failed", 0) == 0;
      err[k] = std::current_exception();
      lockstep.fail();
    } catch (...) {
      err[k] = std::current_exception();
      lockstep.fail();
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  for (int k = 0; k < 2; ++k)
    if (err[k] && !secondary[k]) std::rethrow_exception(err[k]);
  for (int k = 0; k < 2; ++k)
    if (err[k]) std::rethrow_exception(err[k]);
  return res;
}

}  // namespace

DivergeResult diverge(const TrainConfig& cfg, const DivergeOptions& opts) {
  auto log = opts.log ? opts.log : [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  // Same seeds in both runs: only the kernels may make them differ.
  TrainConfig base = with_fixed_seeds(cfg);
  base.progress = false;
  TrainConfig configs[2] = {base, base};
  if (!cfg.out.empty()) {
    configs[0].out = (fs::path(cfg.out) / "a").string();
    configs[1].out = (fs::path(cfg.out) / "b").string();
  }

  if (!opts.trace_a.empty()) check_output_file(opts.trace_a, cfg.overwrite, "--trace-a");
  if (!opts.trace_b.empty()) check_output_file(opts.trace_b, cfg.overwrite, "--trace-b");
  std::shared_ptr<const TrainData> data = load_train_data(base);  // one copy, read by both runs
  std::unique_ptr<TraceWriter> wa, wb;
  if (!opts.trace_a.empty()) wa = std::make_unique<TraceWriter>(opts.trace_a, meta_of(configs[0], "a", *data));
  if (!opts.trace_b.empty()) wb = std::make_unique<TraceWriter>(opts.trace_b, meta_of(configs[1], "b", *data));
  RecordingTracer ta(wa.get()), tb(wb.get());
  ta.set_keep_data(true);
  tb.set_keep_data(true);
  ta.set_keep_activations(opts.layer_growth);
  tb.set_keep_activations(opts.layer_growth);

  DivergeResult result;
  StepComparer comparer(ta, tb, result, log);
  RecordingTracer* const tracers[2] = {&ta, &tb};
  std::array<TrainResult, 2> res = train_in_lockstep(configs, tracers, comparer, opts, data);
  if (wa) wa->close();
  if (wb) wb->close();
  result.run_a = std::move(res[0]);
  result.run_b = std::move(res[1]);
  result.steps = result.run_a.steps;
  result.traced_ms_per_step = 1000.0 * result.run_a.train_seconds / std::max<int64_t>(1, result.run_a.steps);
  result.ops = result.run_a.ops;
  return result;
}

TrainResult record_trace(const TrainConfig& given, const std::string& trace_path, const TraceMeta& meta,
                         bool overwrite_trace) {
  const TrainConfig cfg = with_fixed_seeds(given);
  check_output_file(trace_path, overwrite_trace, "--trace");
  std::shared_ptr<const TrainData> data = load_train_data(cfg);
  TraceMeta m = meta_of(cfg, "single", *data);
  for (const auto& [k, v] : meta) m[k] = v;
  TraceWriter writer(trace_path, m);
  RecordingTracer tracer(&writer);
  TrainHooks hooks;
  hooks.tracer = &tracer;
  hooks.after_step = [&](const StepView&) { tracer.clear_step(); };
  TrainResult r = train(cfg, hooks, data);
  tracer.clear_step();
  writer.close();
  return r;
}

TraceComparison compare_trace_files(const std::string& path_a, const std::string& path_b) {
  Trace a = read_trace(path_a), b = read_trace(path_b);
  // Traces of different trainings part at once for reasons no kernel is to blame for; a
  // comparison would name a kernel all the same.
  const std::string differs = trace_config_difference(a.meta, b.meta);
  if (!differs.empty())
    throw Error(fmt::format("{} and {} record different trainings ({}); only traces of one configuration, differing in "
                            "kernels, pins, device or build, can be compared",
                            path_a, path_b, differs));
  TraceComparison c;
  c.first = first_divergence(a.events, b.events);
  c.source = first_read_divergence(a.events, b.events);
  c.differing_per_step = differing_outputs_per_step(a.events, b.events);
  c.meta_a = a.meta;
  c.meta_b = b.meta;
  return c;
}

namespace {
std::string describe_first(const Divergence& d, const Divergence& source) {
  if (d.structure_mismatch) return "the two runs ran different sequences of ops: " + d.note;
  if (!d.found) return "no divergence: every traced tensor of every step was bitwise identical";
  auto one = [](const Divergence& x) {
    if (x.input_only)
      return describe(x.event_a, x.tensor) +
             " — an input that differs while every traced output before it was identical: the runs were fed "
             "different inputs (or an untraced op changed them)";
    return describe(x.event_a, x.tensor) +
           (x.inputs_identical ? " — all of its inputs were identical, so this kernel introduced it"
                               : " — but its inputs already differed (an untraced op changed them): " + x.note);
  };
  const bool same = source.found && source.event_a.step == d.event_a.step && source.event_a.seq == d.event_a.seq &&
                    source.tensor == d.tensor;
  if (same) return "first divergence: " + one(d);
  std::string out = "first difference: " + one(d) + "\n  no later op reads it (a reported value), so it cannot change "
                    "the training\n";
  out += source.found ? "first divergence that is read on (the drift's source): " + one(source)
                      : "no difference that is read on: the training itself never diverged";
  return out;
}
}  // namespace

namespace {

double relative(double l2, double norm) { return norm > 0 ? l2 / norm : (l2 > 0 ? INFINITY : 0); }

// Where in the network the difference first shows in the activations, and where it is largest
// at the end.
// The first step and layer (forward order) whose activations differ; "" when none did.
std::string first_activation_difference(const DivergeResult& r) {
  for (std::size_t s = 0; s < r.layer_growth.size(); ++s)
    for (std::size_t l = 0; l < r.layer_growth[s].size(); ++l) {
      const LayerDistance& d = r.layer_growth[s][l];
      if (d.has_activations && d.activations_l2 > 0)
        return fmt::format("activations first differ at step {}, first in forward order at {} (relative distance "
                           "{:.3g})\n",
                           s + 1, r.layers[l], relative(d.activations_l2, d.activations_norm));
    }
  return "";
}

std::string layer_growth_summary(const DivergeResult& r) {
  std::string out = first_activation_difference(r);
  if (!r.layer_growth.empty()) {
    const auto& last = r.layer_growth.back();
    std::size_t best = last.size();
    for (std::size_t l = 0; l < last.size(); ++l)
      if (last[l].has_activations && last[l].activations_l2 > 0 &&
          (best == last.size() || relative(last[l].activations_l2, last[l].activations_norm) >
                                      relative(last[best].activations_l2, last[best].activations_norm)))
        best = l;
    if (best < last.size())
      out += fmt::format("at the last step the activations are furthest apart at {} (relative {:.3g}); per layer and "
                         "step: layer_growth.csv\n",
                         r.layers[best], relative(last[best].activations_l2, last[best].activations_norm));
  }
  return out;
}

// layer_growth.csv and the heat maps of relative activation and weight distance (layer x step).
void write_layer_growth(const DivergeResult& r, const std::string& dir) {
  std::string csv = "step,layer,weights_l2,weights_relative,activations_l2,activations_relative\n";
  auto field = [](bool has, double v) { return has ? fmt::format("{:.6g}", v) : std::string(); };
  for (std::size_t s = 0; s < r.layer_growth.size(); ++s)
    for (std::size_t l = 0; l < r.layer_growth[s].size(); ++l) {
      const LayerDistance& d = r.layer_growth[s][l];
      if (!d.has_weights && !d.has_activations) continue;
      csv += fmt::format("{},{},{},{},{},{}\n", s + 1, r.layers[l], field(d.has_weights, d.weights_l2),
                         field(d.has_weights, relative(d.weights_l2, d.weights_norm)),
                         field(d.has_activations, d.activations_l2),
                         field(d.has_activations, relative(d.activations_l2, d.activations_norm)));
    }
  write_file_atomic((fs::path(dir) / "layer_growth.csv").string(), csv);
  std::vector<double> steps;
  for (std::size_t s = 0; s < r.layer_growth.size(); ++s) steps.push_back(double(s + 1));
  for (const bool activations : {true, false}) {
    std::vector<std::string> labels;
    std::vector<std::vector<std::optional<double>>> rows;
    for (std::size_t l = 0; l < r.layers.size(); ++l) {
      std::vector<std::optional<double>> row(steps.size());
      bool any = false;
      for (std::size_t s = 0; s < steps.size(); ++s) {
        if (l >= r.layer_growth[s].size()) continue;
        const LayerDistance& d = r.layer_growth[s][l];
        if (activations ? !d.has_activations : !d.has_weights) continue;
        const double v = activations ? relative(d.activations_l2, d.activations_norm) : relative(d.weights_l2, d.weights_norm);
        if (std::isfinite(v)) row[s] = v;
        any = true;
      }
      if (!any) continue;
      labels.push_back(r.layers[l]);
      rows.push_back(std::move(row));
    }
    if (labels.empty()) continue;
    const std::string what = activations ? "activations" : "weights";
    write_file_atomic((fs::path(dir) / ("layer_growth_" + what + ".svg")).string(),
                      svg_heat_map(fmt::format("Where the two runs' {} part: relative distance per layer (rows, "
                                               "forward order) and step",
                                               what),
                                   "step", labels, steps, rows));
  }
}

}  // namespace

std::string format_divergence(const DivergeResult& r) {
  std::string out = describe_first(r.first, r.source) + "\n";
  const Divergence& src = r.source.found ? r.source : r.first;
  const TensorDiff& diff = r.source.found ? r.source_diff : r.first_diff;
  if (src.found && diff.numel)
    out += fmt::format("  there: {} of {} elements differ, max {} ULP, max |a-b| {:.3g}\n", diff.differing,
                       diff.numel, diff.max_ulp, diff.max_abs);
  if (src.found) {
    // The kernel that ran there, from the manifest.
    const std::string knob = src.event_a.phase == "fwd" ? "fwd" : "";
    for (const auto& e : r.ops)
      if (e.layer == src.event_a.layer && (knob.empty() ? e.knob != "fwd" : e.knob == knob))
        out += fmt::format("  {}.{} ran {} ({}){}\n", e.layer, e.knob, e.variant, determinism_name(e.deterministic),
                           e.shape.empty() ? "" : " at " + e.shape);
  }
  int64_t first_weights = 0;
  for (const auto& g : r.growth)
    if (g.weights_differing && !first_weights) first_weights = g.step;
  out += fmt::format("steps traced: {} ({} ops traced per step), traced training {:.2f} ms/step\n", r.steps,
                     r.events_per_step, r.traced_ms_per_step);
  out += first_weights ? fmt::format("weights first differ after step {}\n", first_weights)
                       : "weights identical after every step\n";
  out += r.first_prediction_step ? fmt::format("test predictions first differ at step {}\n", r.first_prediction_step)
                                 : "test predictions never differed at the evaluated steps\n";
  if (!r.growth.empty()) {
    out += "growth (step: weights max ULP, differing weights, L2, differing predictions):\n";
    for (const auto& g : r.growth) {
      bool show = g.step == 1 || g.step == 2 || g.step == 5 || (g.step % 10 == 0 && (g.step <= 50 || g.step % 50 == 0)) ||
                  &g == &r.growth.back();
      if (show)
        out += fmt::format("  {:>6}: {:>12} {:>9} {:>10.3g} {:>6}\n", g.step, g.weights_max_ulp, g.weights_differing,
                           g.weights_l2, g.prediction_diffs >= 0 ? std::to_string(g.prediction_diffs) : "");
    }
  }
  out += layer_growth_summary(r);
  out += fmt::format("final weights fingerprints: {} {}\n", r.run_a.weights_fingerprint.hex(),
                     r.run_b.weights_fingerprint.hex());
  return out;
}

std::string format_comparison(const TraceComparison& c) {
  std::string out;
  for (const auto* m : {&c.meta_a, &c.meta_b}) {
    auto get = [&](const char* k) { auto it = m->find(k); return it == m->end() ? std::string("?") : it->second; };
    out += fmt::format("trace: {} {} on {} ({}), kernels {}\n", get("model"), get("dataset"), get("gpu"), get("device"),
                       get("kernels"));
  }
  out += describe_first(c.first, c.source) + "\n";
  int64_t total = 0, steps_diff = 0;
  for (const auto& [s, n] : c.differing_per_step) total += n, steps_diff += n > 0;
  out += fmt::format("{} steps compared, {} with differing tensors ({} differing tensors in all)\n",
                     c.differing_per_step.size(), steps_diff, total);
  return out;
}

void write_divergence(const DivergeResult& r, const std::string& dir) {
  make_output_folder(dir);
  std::string csv = "step,differing_tensors,weights_max_ulp,weights_differing,weights_l2,prediction_diffs\n";
  for (const auto& g : r.growth)
    csv += fmt::format("{},{},{},{},{:.6g},{}\n", g.step, g.differing_outputs, g.weights_max_ulp, g.weights_differing,
                       g.weights_l2, g.prediction_diffs >= 0 ? std::to_string(g.prediction_diffs) : "");
  auto tensors = [](const std::vector<TraceTensor>& ts) {
    json j = json::array();
    for (const auto& t : ts) j.push_back({{"name", t.name}, {"fingerprint", t.fingerprint.hex()}, {"numel", t.numel}});
    return j;
  };
  json first{{"found", r.first.found}, {"structure_mismatch", r.first.structure_mismatch},
             {"inputs_identical", r.first.inputs_identical}, {"note", r.first.note}};
  if (r.first.found)
    first.update({{"step", r.first.event_a.step}, {"phase", r.first.event_a.phase}, {"layer", r.first.event_a.layer},
                  {"op", r.first.event_a.op}, {"tensor", r.first.tensor}, {"inputs", tensors(r.first.event_a.inputs)},
                  {"outputs_a", tensors(r.first.event_a.outputs)}, {"outputs_b", tensors(r.first.event_b.outputs)},
                  {"differing_elements", r.first_diff.differing}, {"numel", r.first_diff.numel},
                  {"max_ulp", r.first_diff.max_ulp}, {"max_abs", r.first_diff.max_abs}});
  json source{{"found", r.source.found}};
  if (r.source.found)
    source.update({{"step", r.source.event_a.step}, {"phase", r.source.event_a.phase}, {"layer", r.source.event_a.layer},
                   {"op", r.source.event_a.op}, {"tensor", r.source.tensor}, {"inputs_identical", r.source.inputs_identical},
                   {"differing_elements", r.source_diff.differing}, {"numel", r.source_diff.numel},
                   {"max_ulp", r.source_diff.max_ulp}, {"max_abs", r.source_diff.max_abs}});
  int64_t first_weights = 0;
  for (const auto& g : r.growth)
    if (g.weights_differing && !first_weights) first_weights = g.step;
  json doc{{"first_divergence", first},
           {"first_read_divergence", source},
           {"first_weights_difference_step", first_weights},
           {"first_prediction_difference_step", r.first_prediction_step},
           {"steps", r.steps},
           {"events_per_step", r.events_per_step},
           {"traced_ms_per_step", r.traced_ms_per_step},
           {"final_fingerprints", {r.run_a.weights_fingerprint.hex(), r.run_b.weights_fingerprint.hex()}}};
  write_file_atomic((fs::path(dir) / "growth.csv").string(), csv);
  write_file_atomic((fs::path(dir) / "diverge.json").string(), doc.dump(2));
  if (!r.layer_growth.empty()) write_layer_growth(r, dir);
}

}  // namespace ditto
