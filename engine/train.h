// The training loop behind `ditto-train`, as a library call so experiments can run replicas
// in-process. Everything that can change bits is fixed by the config or recorded: seeds (drawn
// from the OS unless fixed, and written down), data order and augmentation (pure functions of
// seeds and epoch), initial weights (per-parameter Philox streams), and every kernel variant
// (the Policy, and the manifest of what ran).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ditto {

struct TrainConfig {
  std::string model = "smallcnn";
  std::string dataset = "synthetic";  // synthetic | cifar10 | cifar100 | imagefolder | celeba | mnist
  std::string data;                   // dataset folder (not for synthetic)
  int epochs = 10;
  int64_t batch_size = 128;
  float lr = 4e-4f;
  std::string optimizer = "adam";     // adam | sgd
  float momentum = 0.9f;              // sgd
  bool nesterov = false;              // sgd
  float weight_decay = 0.0f;
  std::string lr_schedule = "constant";  // constant | step | cosine
  std::vector<int> milestones = {50, 100};
  bool augment = false;               // pad-4 random crop + horizontal flip
  bool standardize = false;           // per-image standardization instead of channel mean/std
  std::string device = "cuda";        // cpu | cuda | cuda:N
  std::optional<uint64_t> seed_init, seed_order, seed_augment;
  bool deterministic_init = false;    // seed_init fixed (0 unless given)
  bool deterministic_input = false;   // seed_order and seed_augment fixed (0 unless given)
  std::string kernels = "heuristic";  // heuristic | deterministic | nondeterministic | fastest
  std::vector<std::string> pins;      // LAYER.KNOB=VARIANT rules, after the kernels mode
                                      // (a resumed run first pins what its manifest recorded)
  int64_t train_size = 0, test_size = 0;  // 0: all
  std::string resume;                 // run folder to continue from
  std::string out;                    // run folder to write
  bool summary = false;               // print the network summary before training
  bool progress = true;               // progress line on stderr
  int loader_threads = 4;
  // dataset-specific
  int synthetic_train = 5000, synthetic_test = 1000, synthetic_size = 32, synthetic_classes = 10;
  std::string celeba_label = "Blond_Hair";
  std::vector<std::string> celeba_subgroups = {"Male"};
  std::string command_line;           // recorded in the manifest
};

struct EpochLog {
  int epoch = 0;  // 1-based
  double lr = 0, loss = 0, train_acc = 0, test_top1 = 0, test_top5 = 0, seconds = 0;
};

struct TrainResult {
  std::vector<EpochLog> log;
  uint64_t seed_init = 0, seed_order = 0, seed_augment = 0;
  uint64_t weights_fingerprint = 0;   // over all parameters and buffers, in name order
  std::vector<int32_t> predictions;   // final top-1 per test example
  std::vector<int32_t> test_labels;   // the test labels, same order
  std::vector<int32_t> test_subgroups;             // per test example; empty without subgroups
  std::vector<std::string> class_names, subgroup_names;
  double test_top1 = 0;
};

// Pins that reproduce every kernel choice a run made: one "layer.knob[@shape]=variant" per
// manifest entry (entries of the CPU reference, which has no variants, are skipped). With them a replay
// runs the same algorithms even where the original chose by timing (`fastest`) or where another
// cuDNN would rank algorithms differently. Throws DataError naming the file for a manifest that
// cannot be read.
std::vector<std::string> pins_from_manifest(const std::string& manifest_path);

// Trains, evaluates each epoch, writes manifest.json, log.csv, predictions.csv, metrics.json
// and checkpoint.safetensors to cfg.out (when set; each written atomically). Throws
// ditto::Error (with the flag, file or layer named) on bad input.
TrainResult train(const TrainConfig& cfg);

}  // namespace ditto
