// Manifest: what every op actually ran. Each (layer, knob) is recorded once per run with the
// variant that was used, what was asked for, whether the variant is deterministic, the precision
// mode and the workspace it took. Together with the seeds and versions a trainer adds, it is
// what lets a run be replayed exactly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

namespace ditto {

enum class Determinism { Yes, No, Unknown };
const char* determinism_name(Determinism d);

// The reproducibility a variant promises, in the words CCCL 3.1 uses for cub::DeviceReduce's
// determinism requirement:
//   not_guaranteed  two runs may differ: atomics add floats in the order threads arrive.
//   run_to_run      the same bits every run on one GPU model. cuDNN documents its deterministic
//                   routines as bit-reproducible on the same architecture; cuBLAS (atomics off)
//                   on the same architecture and SM count. Nothing is promised across models.
//   gpu_to_gpu      the same bits on any GPU: ditto's own fixed-order kernels, whose grid and
//                   reduction tree (CUB block reductions, kernels/detail/reduce.cuh) depend on the
//                   tensor shape alone, never on the SM count.
//   unknown         the library documents neither (cuDNN's batch-norm backward).
// The CPU reference (one thread, fixed order, double accumulation) is recorded as run_to_run:
// the same binary gives the same bits every run; other compilers or libms may not.
enum class Guarantee { NotGuaranteed, RunToRun, GpuToGpu, Unknown };
const char* guarantee_name(Guarantee g);

// Who implements a variant, which with its Determinism label fixes its Guarantee.
enum class Impl { Ditto, Library, CpuReference };
Guarantee guarantee_of(Determinism d, Impl impl);

// Manifests and tuning files written before the precision knob recorded a "math" mode (and
// linear layers a `math` knob): fma is today's fp32, tf32 is tf32. Anything else is returned as
// it is, for the reader's own check to name.
std::string legacy_precision(const std::string& math);

struct ManifestEntry {
  std::string layer;         // layer name as given to the op
  std::string op;            // conv2d, linear, maxpool2d, ...
  std::string knob;          // fwd, bwd_data, bwd_filter, bias_bwd, bwd, reduce, ...
  std::string variant;       // what ran: "algo1", "gather", "cudnn-deterministic", ...
  std::string requested;     // the policy's ask: "pinned", "deterministic", "heuristic", ...
  Determinism deterministic = Determinism::Unknown;  // cuDNN's own label for cuDNN algorithms
  std::string precision;     // "fp32", "tf32", "bf16", "fp16" (kernels/precision.h), or "" where none applies
  std::size_t workspace_bytes = 0;
  std::string device;        // "cpu" or "cuda:0"
  std::string shape;         // conv knobs: the input shape ("NxCxHxW"), since choices depend on it
  Guarantee guarantee = Guarantee::Unknown;  // what `deterministic` means across runs and GPUs
  // The library's configuration that ran, where the variant leaves it open: the cuBLASLt algorithm
  // a linear layer fixed for this shape ("id 21 tile 128x128 stages 64x3 splitk 1 ..."), or "".
  std::string algorithm;
};

class Manifest {
 public:
  // Inserts or replaces the entry for (layer, knob, shape).
  void record(ManifestEntry e);
  // The entry for (layer, knob): the one of that shape, or with shape "" the most recently
  // recorded of any shape.
  const ManifestEntry* find(const std::string& layer, const std::string& knob, const std::string& shape = "") const;
  std::vector<ManifestEntry> entries() const;  // in first-recorded order
  void clear();

  // {"ops": [ {layer, op, knob, variant, requested, deterministic, guarantee, precision,
  //           workspace_bytes, device, shape (conv and cuBLASLt linears), algorithm (where set)}, ...]}
  std::string to_json(int indent = 2) const;

 private:
  std::vector<ManifestEntry> entries_;
  std::vector<uint64_t> seq_;  // when each entry was last recorded
  uint64_t next_seq_ = 0;
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> index_;
};

// Writes text to path atomically: to a temporary file beside it, then rename. Throws IoError
// naming the path.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace ditto
