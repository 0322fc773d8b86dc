// Tuning file: the variants a `deterministic` run uses, measured once and then read, so that
// determinism need not mean a slow kernel. Every knob with more than one deterministic variant is
// tuned: the three convolution directions (cuDNN's deterministic algorithms and ditto's own,
// kernels/detail/conv2d_own.h), max-pool backward (cudnn-deterministic vs ditto's gather) and
// the bias reduction (ditto's fixed-order kernel vs cuDNN's). Batch-norm backward is not: its
// only deterministic variant is ditto's (cuDNN's is undocumented either way, so a deterministic
// run never takes it).
//
// cuDNN's heuristic ranks algorithms by its performance model; Find runs them and times them.
// `deterministic` mode takes the heuristic's first deterministic algorithm, because a choice by
// timing could differ between two runs. A tuning table makes the timed choice safe: with an
// empty table (tuning), each convolution problem the run meets — direction, input and filter
// shapes, strides, padding, dilation, groups, precision — gets the fastest algorithm that cuDNN
// labels deterministic in Find, and the choice is written down; with a loaded table (reading),
// every problem takes exactly the algorithm its entry names, through the pinned path (no Find),
// and a problem without an entry is an error. Two runs that read one file choose alike, so they
// are bit-identical; the manifest records the file's hash.
//
// A table may carry a workspace budget (bytes; 0: none): while tuning, a convolution takes the fastest
// deterministic algorithm whose workspace fits it, so a tuned run's peak memory can be held below a
// framework's (FFT and Winograd workspaces run to gigabytes on VGG-sized layers); each entry says the
// workspace its algorithm took, and a read file whose entry exceeds the file's budget is an error.
// The budget is in the file, so the manifest's hash of the file covers it.
//
// Find also tunes inside an algorithm, and cuDNN keeps what it found, so the tuning run itself
// may run other kernels than a later run that reads its file: tune in a run of its own
// (e.g. a short ditto-train --steps), then train with the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/fingerprint.h"

namespace ditto {

struct TuningEntry {
  std::string op = "conv2d";      // conv2d | maxpool2d | bias_add (the op kind the knob belongs to)
  std::string direction;          // the knob: fwd | bwd_data | bwd_filter (conv2d), bwd (maxpool2d),
                                  // bias_bwd (bias_add)
  std::vector<int64_t> x, w;      // conv2d: input NCHW and filter KCRS; maxpool2d: input NCHW and
                                  // window {kh, kw}; bias_add: dy's shape and w empty
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1;
  std::string precision;          // fp32 | tf32 | bf16 | fp16 (conv2d); "" for the others
  std::string layout;             // "nhwc" for channels-last convolutions; "" otherwise (NCHW)
  std::string algo;               // the variant's name, as policy strings write it
  double time_ms = 0;             // what was measured for it
  std::size_t workspace_bytes = 0;  // the workspace it takes (conv2d; informative, checked against the budget)
  std::string layer;              // the first layer that met the problem (for people; not a key)
  std::string key() const;        // everything but algo, time and layer
};

class TuningTable {
 public:
  TuningTable() = default;
  // Reads a tuning file. Throws IoError when it cannot be opened and DataError naming the file
  // and the entry (index and key) for malformed JSON, a missing field, an unknown direction or
  // precision, an algorithm that is not one of the direction's, or two entries for one key.
  // With expect_gpu / expect_cudnn non-empty, a file tuned on another GPU or cuDNN is a
  // DataError naming both.
  static TuningTable load(const std::string& path, const std::string& expect_gpu = "",
                          const std::string& expect_cudnn = "");
  // Writes atomically (write, then rename); returns the fingerprint of the bytes written.
  Fingerprint save(const std::string& path) const;

  const TuningEntry* find(const std::string& key) const;
  void add(TuningEntry e);                    // replaces an entry with the same key
  const std::vector<TuningEntry>& entries() const { return entries_; }

  bool reading() const { return reading_; }   // loaded from a file: no tuning, missing = error
  const std::string& path() const { return path_; }
  Fingerprint file_hash() const { return file_hash_; }  // fingerprint of the file's bytes when loaded

  std::string gpu, cudnn;                     // what the entries were measured on
  std::size_t workspace_budget = 0;           // bytes a tuned algorithm's workspace may take; 0: no limit

 private:
  std::vector<TuningEntry> entries_;
  std::map<std::string, std::size_t> index_;
  bool reading_ = false;
  std::string path_;
  Fingerprint file_hash_;
};

}  // namespace ditto
