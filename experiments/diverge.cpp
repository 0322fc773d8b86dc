#include "experiments/diverge.h"

#include <fmt/format.h>

#include <algorithm>
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
  for (const auto& t : inputs) e.inputs.push_back({t.name, t.tensor->fingerprint(), t.tensor->numel()});
  std::vector<std::vector<float>> values;
  for (const auto& t : outputs) {
    e.outputs.push_back({t.name, t.tensor->fingerprint(), t.tensor->numel()});
    values.push_back(keep_data_ && t.tensor->dtype() == DType::F32 ? t.tensor->to_host_f32() : std::vector<float>{});
  }
  events_.push_back(std::move(e));
  data_.push_back(std::move(values));
  ++events_seen_;
}

const std::vector<float>* RecordingTracer::output_values(int64_t seq, const std::string& tensor) const {
  if (seq < 0 || seq >= static_cast<int64_t>(events_.size())) return nullptr;
  const auto& e = events_[static_cast<std::size_t>(seq)];
  for (std::size_t k = 0; k < e.outputs.size(); ++k)
    if (e.outputs[k].name == tensor) {
      const auto& v = data_[static_cast<std::size_t>(seq)][k];
      return v.empty() ? nullptr : &v;
    }
  return nullptr;
}

void RecordingTracer::clear_step() {
  if (writer_)
    for (const auto& e : events_) writer_->write(e);
  events_.clear();
  data_.clear();
}

namespace {

// What one run shows the other at a meeting: its weights after the step and, at evaluated steps,
// its test predictions.
struct Side {
  std::vector<float> weights;
  std::vector<int32_t> preds;
  bool evaluated = false;
};

// Compares the two runs each time they meet: where their traces first part, where they first
// part in a way that is read on, and how far their weights and predictions have moved apart.
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
    compare_sides(step, g);
    result_.growth.push_back(g);
    ta_.clear_step();
    tb_.clear_step();
    if (step == 1 || step % 50 == 0)
      log_(fmt::format("step {}: {} traced tensors of {} ops differ; weights max ULP {}, L2 {:.3g}{}", step,
                       g.differing_outputs, result_.events_per_step, g.weights_max_ulp, g.weights_l2,
                       g.prediction_diffs >= 0 ? fmt::format(", {} test predictions differ", g.prediction_diffs) : ""));
  }

 private:
  // The two runs' values of the divergence's tensor, compared element by element (empty when
  // they were not kept).
  TensorDiff measure(const Divergence& d) const {
    TensorDiff diff;
    const auto* va = ta_.output_values(d.event_a.seq, d.tensor);
    const auto* vb = tb_.output_values(d.event_b.seq, d.tensor);
    if (va && vb && va->size() == vb->size()) diff = diff_f32(va->data(), vb->data(), va->size());
    return diff;
  }

  // The first divergence, then the first one read on, each measured once found; the tracers stop
  // keeping values when nothing is left to measure.
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
        ta_.set_keep_data(false);  // the values were kept only to measure these points
        tb_.set_keep_data(false);
      }
    }
    if (result_.first.structure_mismatch) {
      ta_.set_keep_data(false);
      tb_.set_keep_data(false);
    }
  }

  // The weights' distance after the step and, where both runs evaluated, their differing predictions.
  void compare_sides(int64_t step, StepGrowth& g) {
    TensorDiff w = diff_f32(side[0].weights.data(), side[1].weights.data(),
                            std::min(side[0].weights.size(), side[1].weights.size()));
    g.weights_max_ulp = w.max_ulp;
    g.weights_differing = w.differing;
    g.weights_l2 = w.l2;
    if (side[0].evaluated && side[1].evaluated) {
      g.prediction_diffs = 0;
      for (std::size_t i = 0; i < side[0].preds.size(); ++i) g.prediction_diffs += side[0].preds[i] != side[1].preds[i];
      if (g.prediction_diffs > 0 && !result_.first_prediction_step) result_.first_prediction_step = step;
    }
  }

  RecordingTracer &ta_, &tb_;
  DivergeResult& result_;
  std::function<void(const std::string&)> log_;
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
      side.weights = params_to_host(v.params);
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
}

}  // namespace ditto
