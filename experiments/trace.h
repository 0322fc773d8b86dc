// Per-op traces of a training run, and where two of them first part.
//
// A traced run records, for every step, one event per op execution: a forward output ("fwd"), one
// op's backward closure ("bwd") or an optimizer update of one parameter ("update"), each with the
// 128-bit digests of the tensors it read and wrote. Two traces of "the same" run are walked in
// lockstep; the first event whose output differs while all of its inputs were identical is the op
// whose kernel introduced the difference. Everything downstream differs too, so only the first
// event says anything about which kernel is not bit-reproducible.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/fingerprint.h"

namespace ditto {

struct TraceTensor {
  std::string name;          // "x", "w", "y", "dy", "dx", "dw", "w_before", ...
  Fingerprint fingerprint;  // the tensor's digest (engine/digest.h)
  int64_t numel = 0;
};

struct TraceEvent {
  int64_t step = 0;          // 1-based training step
  int64_t seq = 0;           // 0-based index of the event within its step
  std::string phase;         // "fwd" | "bwd" | "update"
  std::string layer;         // "conv2", "layer1.0.bn1", or "relu#3" for unnamed ops
  std::string op;            // "conv2d", "bias_add", "relu", "adam", ...
  std::vector<TraceTensor> inputs, outputs;
};

// Key/value header: model, gpu, cudnn, kernels, command line, ... (strings).
using TraceMeta = std::map<std::string, std::string>;

struct Trace {
  TraceMeta meta;
  std::vector<TraceEvent> events;
};

// Streams a trace to a JSON-lines file: first line {"ditto_trace": 3, "meta": {...}}, then one
// compact JSON object per event. Digests are written as 32-digit lowercase hex strings (JSON
// numbers cannot hold 128-bit values). Streaming, rather than collecting
// events and writing at the end, keeps memory flat over long runs.
//
// The file is written under a temporary name beside `path`; close() flushes, syncs and renames it
// onto `path`, so a run killed mid-way never leaves half a trace under the final name. The
// destructor of an unclosed writer (an exception unwound past it) removes the temporary file.
// Strings that are not valid UTF-8 are written with U+FFFD in place of the bad bytes.
class TraceWriter {
 public:
  // Throws IoError when the temporary file cannot be created or the header not written.
  TraceWriter(const std::string& path, const TraceMeta& meta);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Appends one event. Throws IoError when the write fails, Error after close().
  void write(const TraceEvent& e);
  // Makes the trace visible under `path`. Throws IoError when flushing or renaming fails (the
  // temporary file is removed then). A second close() does nothing, nor does one after a failed
  // write, which removed the temporary file and threw already.
  void close();

 private:
  void write_line(const std::string& line);
  void discard_temporary();

  std::string path_, temporary_path_;
  std::FILE* file_ = nullptr;  // open from construction until close() or discard
};

// Writes a whole trace at once, atomically (through TraceWriter).
void write_trace(const std::string& path, const Trace& t);

// Reads a trace written by TraceWriter. Throws IoError when the file cannot be opened, DataError
// "path:LINE: what is wrong" on a wrong first line, malformed JSON (a truncated line), missing or
// mistyped fields, a bad hex fingerprint, or events out of (step, seq) order.
Trace read_trace(const std::string& path);

// Where two traces first part.
struct Divergence {
  bool found = false;              // some output differs
  bool structure_mismatch = false; // the two traces ran different event sequences (different step,
                                   // seq, op, layer, phase, tensor names or sizes at the same position,
                                   // or one trace is shorter); the comparison stops there and `note`
                                   // says where and what
  bool inputs_identical = false;   // every input of `event` had equal fingerprints in both traces
  bool input_only = false;         // no output differs up to `event`, but its input `tensor` does: the
                                   // traces were fed different data (or an untraced op changed it)
  TraceEvent event_a, event_b;     // the event (from each trace) at the first difference; at a
                                   // structure mismatch where one trace ended, that one's is empty
  std::string tensor;              // name of its first differing output
  int64_t events_compared = 0;     // event pairs examined, including the one at the difference
  std::string note;                // one human sentence describing the finding
};

// Walks both event lists in order (they must be in (step, seq) order, as read_trace guarantees)
// and stops at the first event with a differing output or input (or a structure mismatch): an
// input that differs while every output before it was identical is a divergence too (input_only). When the
// differing event's inputs were not all identical, inputs_identical is false and note says an
// untraced op must have changed them: no traced op before it produced a differing output.
Divergence first_divergence(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b);

// Per step present in both traces: the number of output tensors whose fingerprints differ
// (pairs (step, count), steps ascending, steps without differences included with count 0), which
// shows how a difference spreads once introduced. Stops at a structure mismatch; the step holding
// it is counted up to the mismatch.
std::vector<std::pair<int64_t, int64_t>> differing_outputs_per_step(const std::vector<TraceEvent>& a,
                                                                     const std::vector<TraceEvent>& b);

// Two traces can be compared only when they record the same training: the same model, data (by
// fingerprint), seeds and every flag that changes the bits other than the kernels (meta keys
// starting with "--", "train_fingerprint", "test_fingerprint", and the older "model", "dataset",
// "batch_size"). Kernels, pins, device, GPU and versions may differ: they are what a comparison
// studies. Returns "" when comparable, else what differs ("--lr 0.002 vs 0.01; --model smallcnn
// vs resnet18"); a key recorded by one trace only differs too.
std::string trace_config_difference(const TraceMeta& a, const TraceMeta& b);

// "step 3, bwd, conv2 (conv2d), output dw" — how reports name an event and tensor. The tensor is
// called "input" or "output" after where the event lists it.
std::string describe(const TraceEvent& e, const std::string& tensor = "");

}  // namespace ditto
