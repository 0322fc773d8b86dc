// The noise lab's first-divergence search: train one configuration twice, fingerprint every
// tensor of every op of every step (engine/tracer.h), and name the first (step, phase, layer, op,
// tensor) whose output differs while all of its inputs were identical — the kernel that
// introduced the difference — with the max ULP distance and the number of differing elements
// there. Then how the difference grows: per step the weights' max ULP and L2 distance, and the
// first step at which test predictions (on a fixed subset, every K steps) differ.
//
// The two runs execute in one process in lockstep: two threads, each with its own Context
// (stream, cuDNN and cuBLAS handles) on the same device, meeting after every step. Each run's
// trace can also be written to a file, and trace files from different machines, GPUs or builds
// compared with compare_trace_files (ditto-diverge compare): that is how one learns whether two
// GPUs agree.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/digest.h"
#include "engine/tracer.h"
#include "experiments/stats.h"
#include "experiments/trace.h"
#include "experiments/train.h"

namespace ditto {

// A tracer that digests every tensor it is shown where the tensor lives (engine/digest.h: one
// pass per tensor on its own stream; only 16 bytes per tensor reach the host, when the step's
// events are read) and collects the events of the current step. With keep_data it also keeps a
// device snapshot of every output until the step is cleared, so the op where two runs part can
// be measured in ULPs; with keep_activations, a snapshot of every named layer's forward output,
// for per-layer growth.
class RecordingTracer : public Tracer {
 public:
  explicit RecordingTracer(TraceWriter* writer = nullptr) : writer_(writer) {}
  void begin_step(int64_t step) override;
  void event(const std::string& phase, const std::string& layer, const std::string& op,
             const std::vector<TracedTensor>& inputs, const std::vector<TracedTensor>& outputs) override;
  // The step's events with their digests (waits for the digests still being computed).
  const std::vector<TraceEvent>& step_events();
  // The snapshot of output `tensor` of the event with index seq in this step; nullptr if none kept.
  const Tensor* output_snapshot(int64_t seq, const std::string& tensor) const;
  void clear_step();  // writes the step's events to the writer (if any), then forgets them
  void set_keep_data(bool on) { keep_data_ = on; }
  void set_keep_activations(bool on) { keep_activations_ = on; }
  int64_t events_seen() const { return events_seen_; }

 private:
  void resolve();  // fills in the digests queued for the step's events

  struct Pending {
    std::size_t event, index, slot;
    bool output;
  };
  TraceWriter* writer_;
  bool keep_data_ = false, keep_activations_ = false;
  int64_t step_ = 0, events_seen_ = 0;
  std::vector<TraceEvent> events_;
  DigestQueue digests_;
  std::vector<Pending> pending_;                  // digests not yet filled into events_
  std::vector<std::vector<Tensor>> snapshots_;    // [event][output]; undefined where not kept
  std::map<std::string, int> unnamed_;            // per-step counters for "relu#3"
};

struct DivergeOptions {
  int64_t eval_every = 10;          // compare test predictions every K steps (0: never)
  std::string trace_a, trace_b;     // write each run's trace here when set
  bool layer_growth = true;         // per layer and step, weight and activation distances (keeps a
                                    // device copy of each named layer's forward output per step)
  std::function<void(const std::string&)> log;  // progress lines; default stderr
};

struct StepGrowth {
  int64_t step = 0;
  int64_t differing_outputs = 0;    // traced tensors whose fingerprints differ in this step
  uint64_t weights_max_ulp = 0;     // over all parameters after the step
  int64_t weights_differing = 0;    // parameter elements whose bits differ
  double weights_l2 = 0;
  int64_t prediction_diffs = -1;    // test examples predicted differently; -1: not evaluated
};

// A difference that no later op reads (the loss value of an atomic reduction, which only feeds
// a reported number) cannot change the training: the source of the drift is the first
// difference that is read on (or is a weight update).
bool output_is_read(const std::vector<TraceEvent>& events, std::size_t index, const std::string& tensor);
// The first difference that is read on; the unread ones before it go to `unread`.
Divergence first_read_divergence(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b,
                                 std::vector<Divergence>* unread = nullptr);

// One layer at one step: how far apart the two runs' parameters of the layer are after the step
// (all of them together) and how far apart its forward output was in the step. Relative
// distances divide by run A's norm.
struct LayerDistance {
  bool has_weights = false, has_activations = false;
  double weights_l2 = 0, weights_norm = 0;
  double activations_l2 = 0, activations_norm = 0;
};

struct DivergeResult {
  Divergence first;                 // where the runs first parted (found == false: never)
  TensorDiff first_diff;            // at that tensor: differing elements and max ULP
  Divergence source;                // the first difference that is read on: the drift's source
  TensorDiff source_diff;
  int64_t first_prediction_step = 0;  // first evaluated step with differing predictions; 0: none
  int64_t steps = 0, events_per_step = 0;
  std::vector<StepGrowth> growth;   // one row per step
  std::vector<std::string> layers;  // named layers in forward order, then parameter-only ones
  std::vector<std::vector<LayerDistance>> layer_growth;  // [step - 1][layer]; a row may be shorter
                                                         // than `layers` (layers first seen later)
  TrainResult run_a, run_b;
  double traced_ms_per_step = 0;    // training time per step with tracing on (both runs sharing the GPU)
  std::vector<ManifestEntry> ops;   // what run A's kernels were
};

// Trains cfg twice in lockstep (CONTROL seeds unless cfg fixes others) and compares. cfg.out,
// when set, gets run folders a/ and b/. Throws ditto::Error when either run fails.
DivergeResult diverge(const TrainConfig& cfg, const DivergeOptions& opts);

// Trains cfg once with a tracer writing every event to trace_path (for comparing machines). An
// existing file at trace_path is an Error before anything is trained, unless overwrite_trace.
TrainResult record_trace(const TrainConfig& cfg, const std::string& trace_path, const TraceMeta& meta = {},
                         bool overwrite_trace = false);

// Compares two trace files: the first divergence and the per-step differing-output counts.
struct TraceComparison {
  Divergence first;
  Divergence source;                // the first difference that is read on
  std::vector<std::pair<int64_t, int64_t>> differing_per_step;
  TraceMeta meta_a, meta_b;
};
TraceComparison compare_trace_files(const std::string& path_a, const std::string& path_b);

// Text reports (what ditto-diverge prints) and diverge.json, growth.csv and, with layer growth,
// layer_growth.csv and layer_growth.svg (heat maps, layer x step, of the relative activation and
// weight distances).
std::string format_divergence(const DivergeResult& r);
std::string format_comparison(const TraceComparison& c);
void write_divergence(const DivergeResult& r, const std::string& dir);

}  // namespace ditto
