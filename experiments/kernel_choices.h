// Two runs' kernel choices side by side: for every (layer, knob, shape) either manifest recorded,
// what ran in each (variant, the library's configuration, precision, guarantee), and the runtime
// fields (GPU, driver, CUDA, cuDNN, cuBLAS) where the two differ. For "why do these two runs end
// with other weights": another GPU model or library version that ranked engines differently, a
// tuning file, a pin, a mode. ditto-diverge kernels and ditto.compare_kernels print it.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "engine/manifest.h"

namespace ditto {

struct KernelChoice {
  std::string layer, op, knob, shape;
  std::optional<ManifestEntry> a, b;  // absent where that run recorded no such entry
};

struct KernelChoices {
  std::string manifest_a, manifest_b;
  std::vector<std::array<std::string, 3>> runtime;  // (field, a's value, b's value) where they differ
  std::vector<KernelChoice> differing;              // in a's recording order, then b's own entries
  std::size_t same = 0;                             // entries that ran the same kernel in both
  bool differ() const { return !differing.empty(); }
};

// A run folder (its manifest.json) or a manifest file each. Throws like read_run_manifest (IoError,
// DataError naming the file and field).
KernelChoices compare_kernel_choices(const std::string& run_a, const std::string& run_b);

// What differs, one line per entry: "conv1.fwd @128x3x32x32 (conv2d): engine eng47[] | engine eng12[]".
std::string format_kernel_choices(const KernelChoices& c);

// A replay's kernels against the run it replays (--pins-from, --resume): the entries, on a GPU in
// both, that ran the pinned variant in another configuration ("conv1.fwd @128x3x32x32: engine
// eng12[] TENSOR_CORE (recorded eng47[] TENSOR_CORE)"). A variant such as `engine` names cuDNN's
// heuristic pick, which depends on the GPU model and the library's version, so a pin alone does
// not replay it elsewhere. Entries whose variants differ are left out (an explicit pin chose that).
std::vector<std::string> replay_mismatches(const std::vector<ManifestEntry>& recorded, const Manifest& now);

}  // namespace ditto
