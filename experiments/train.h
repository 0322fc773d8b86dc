// The training loop behind `ditto-train`, as a library call so experiments can run replicas
// in-process. Everything that can change bits is fixed by the config or recorded: seeds (drawn
// from the OS unless fixed, and written down), data order and augmentation (pure functions of
// seeds and epoch), initial weights (per-parameter Philox streams), and every kernel variant
// (the Policy, and the manifest of what ran).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/fingerprint.h"

#include <memory>

#include "datasets/dataset.h"
#include "engine/loss_scale.h"
#include "engine/manifest.h"

namespace ditto {

class Context;
class Tracer;
struct Param;

struct TrainConfig {
  std::string model = "smallcnn";
  std::string dataset = "synthetic";  // synthetic | cifar10 | cifar100 | imagefolder | stream-folder |
                                      // celeba | mnist, and
                                      // the other tasks' (datasets/dataset.h): mnist-seg, mnist-rt,
                                      // mnist-strings, celeba-attrs and their built-in stand-ins
                                      // synthetic-seg, synthetic-rt, synthetic-strings, synthetic-attrs
                                      // (a derived set has one example per example of its source
                                      // split, drawn with seed 1 for training and 2 for the test)
  std::string data;                   // dataset folder (not for synthetic)
  int epochs = 10;
  int64_t max_steps = 0;              // > 0: stop after this many optimizer steps (a screening
                                      // run), then evaluate and write outputs as after an epoch
  std::string max_steps_flag = "--steps";  // what set max_steps, for the messages about it (a
                                           // protocol that sets it from its own flags names them)
  int64_t batch_size = 128;
  float lr = 4e-4f;
  std::string optimizer = "adam";     // adam | sgd
  float momentum = 0.9f;              // sgd
  bool nesterov = false;              // sgd
  float weight_decay = 0.0f;
  std::string lr_schedule = "constant";  // constant | step | cosine | onecycle (engine/optim.h)
  std::vector<int> milestones = {50, 100};
  double warmup_epochs = 0;           // linear warm-up from 0 over these epochs (any schedule)
  bool augment = false;               // pad-4 random crop + horizontal flip
  bool standardize = false;           // per-image standardization instead of channel mean/std
  std::string device = "cuda";        // cpu | cuda | cuda:N
  std::optional<uint64_t> seed_init, seed_order, seed_augment;
  bool deterministic_init = false;    // seed_init fixed (0 unless given)
  bool deterministic_input = false;   // seed_order and seed_augment fixed (0 unless given)
  std::string kernels = "heuristic";  // heuristic | deterministic | nondeterministic | fastest | pytorch
  std::string precision = "fp32";     // fp32 | tf32 | bf16 | fp16: the rule *.precision=VALUE (kernels/precision.h)
  bool channels_last = false;         // the rule *.layout=nhwc: convolutions compute channels-last (kernels/conv2d.h)
  bool native_activations = false;    // the rule *.output=native: convolutions hand on bf16/f16 (channels-last) results
  std::string tuning;                 // deterministic convs: read this tuning file, or tune and
                                      // write it when it does not exist (engine/tuning.h)
  int64_t tuning_workspace_mb = 0;    // tuning: the largest workspace a tuned conv algorithm may take
                                      // (MiB, written into the file); 0: no limit
  bool graph = false;                 // CUDA-graph steps (experiments/step.h); bits as eager
  std::string loss_scale = "off";     // off | dynamic | dynamic:INIT:GROWTH:BACKOFF:INTERVAL | a power
                                      // of two (fixed): engine/loss_scale.h; not with data parallelism
  std::string eval_kernels = "same";  // same | batch-invariant: the evaluation's kernels
                                      // (batch_invariant_rules below)
  std::vector<std::string> pins;      // LAYER.KNOB=VARIANT rules, after the kernels mode
                                      // (a resumed run first pins what its manifest recorded)
  int64_t train_size = 0, test_size = 0;  // 0: all
  std::string resume;                 // run folder to continue from (into --out, or in place without one)
  std::string pins_from;              // the manifest whose kernels the pins replay (--pins-from); after
                                      // the first step every GPU kernel must have run as recorded
  std::string out;                    // run folder to write (experiments/run_dir.h: the rules)
  bool overwrite = false;             // --out may hold a run, replaced once this one publishes an epoch
  bool checkpoint = true;             // false: no checkpoint.safetensors in out (large sweeps)
  bool summary = false;               // print the network summary before training
  bool progress = true;               // progress line on stderr
  int loader_threads = 4;
  // Data parallelism (experiments/data_parallel.h). At the defaults a run takes the plain step;
  // --gpus above 1, --dp-groups given or --batchnorm sync take the data-parallel one.
  int gpus = 1;                       // ranks: CUDA devices N..N+K-1 (N from --device), or K
                                      // simulated ranks on the CPU
  int dp_groups = 0;                  // example groups per global batch; 0: one per rank
  std::string batchnorm = "local";    // local | sync
  int bucket_mb = 25;                 // gradient bucket size in MiB
  // "" (the ranks are threads of this process) or "slurm": this process is one rank of a Slurm job
  // step's tasks (SLURM_PROCID of SLURM_NTASKS; --gpus, when given, must equal SLURM_NTASKS). Every
  // task runs the same command; rank 0 evaluates and writes --out, the others write nothing, and
  // the ranks meet in --out's rendezvous folder (experiments/data_parallel.h).
  std::string dp_launch;
  double dp_timeout = 600;            // seconds a rank waits for the others at any meeting point
  bool data_parallel() const { return gpus > 1 || dp_groups > 0 || batchnorm != "local" || !dp_launch.empty(); }
  // dataset-specific
  // synthetic: counts, side, classes; the synthetic-* task variants take the counts (their
  // geometry is fixed: that of the MNIST / CelebA data they stand in for)
  int image_size = 224, resize = 256;  // stream-folder: output side; evaluation's shorter side
  int synthetic_train = 5000, synthetic_test = 1000, synthetic_size = 32, synthetic_classes = 10;
  std::string celeba_label = "Blond_Hair";
  std::vector<std::string> celeba_subgroups = {"Male"};
  std::string command_line;           // recorded in the manifest
};

// test_top1 / test_top5 are the task's two scores (experiments/task_scoring.h): top-1 / top-5 accuracy,
// pixel accuracy / mean IoU (segmentation), sequence accuracy / character error rate (sequence).
// train_acc is NaN (not measured) for the tasks other than classification.
struct EpochLog {
  int epoch = 0;  // 1-based
  double lr = 0, loss = 0, train_acc = 0, test_top1 = 0, test_top5 = 0, seconds = 0;
};

struct TrainResult {
  std::vector<EpochLog> log;
  uint64_t seed_init = 0, seed_order = 0, seed_augment = 0;
  Fingerprint weights_fingerprint;    // over all parameters and buffers, in name order
  Task task = Task::Classification;   // what the predictions are (experiments/task_scoring.h)
  std::vector<int32_t> predictions;   // final prediction per test unit: top-1 class per example;
                                      // class per pixel (segmentation); code of the decoded string
                                      // per example (sequence)
  std::vector<int32_t> test_labels;   // the test units' labels, same order
  int64_t units_per_example = 1;      // predictions per test example (height * width for segmentation)
  std::vector<int32_t> test_subgroups;             // per test example; empty without subgroups
  std::vector<std::string> class_names, subgroup_names;
  double test_top1 = 0;
  int64_t steps = 0;                  // optimizer steps taken by this call
  int rank = 0;                       // --dp-launch slurm: this process's rank (only rank 0 evaluates and
                                      // writes the run; another rank's result holds its training alone)
  double train_seconds = 0;           // wall time of those steps (no evaluation, no hooks)
  std::vector<float> weights;         // every parameter and buffer, in name order, on the host
  std::vector<ManifestEntry> ops;     // what every op ran (the manifest's "ops")
  std::vector<std::string> warnings;  // also printed on stderr and written into the manifest
  // Under loss scaling, every step of the run (a resumed run's earlier steps first): the scale its
  // backward pass used and whether it overflowed (and so was skipped); the run folder's
  // loss_scale.csv. Empty without loss scaling.
  std::vector<LossScaleStep> loss_scale;
};

// What a hook sees after each optimizer step.
struct StepView {
  int64_t step;                       // 1-based, counted over the whole run
  int epoch;                          // 1-based
  Context& ctx;
  const std::vector<Param>& params;
  // Predictions of the current weights on the test set, per unit as TrainResult::predictions
  // (evaluation mode, no tape): the run's own training state is not touched, so calling it does
  // not change the run's bits.
  std::function<std::vector<int32_t>()> predict;
};

// Observers of a run, owned by the caller. A tracer sees every op (engine/tracer.h), the data
// of each step and each parameter update; after_step runs after every optimizer step. Time
// spent in either is left out of TrainResult::train_seconds.
struct TrainHooks {
  Tracer* tracer = nullptr;
  std::function<void(const StepView&)> after_step;
};

// Trains, evaluates each epoch, writes manifest.json, log.csv, predictions.csv, metrics.json
// and checkpoint.safetensors to cfg.out (when set; each epoch's files published at once, see
// experiments/run_dir.h). In stages: validate the flags, the output folder's rules, a resumed
// run's files and the policy (nothing written yet); set up data, net, optimizer and loaders; open
// and lock the run folder; resume (verifying the checkpoint) or initialize; the epochs, each
// published as a whole. Throws ditto::Error (with the flag, file or layer named) on bad input.
//
// data: the datasets, when the caller loaded them once for many runs (load_train_data); they
// must be what cfg names. Without it, train loads them.
struct TrainData {
  Dataset train, test;
};
TrainResult train(const TrainConfig& cfg, const TrainHooks& hooks = {}, std::shared_ptr<const TrainData> data = nullptr);

// The training and test sets a config names, trimmed to --train-size / --test-size. Throws
// ditto::Error naming the flag or file for a missing folder or a bad size.
std::shared_ptr<const TrainData> load_train_data(const TrainConfig& cfg);

// The rules --eval-kernels batch-invariant lays over the run's policy while it evaluates, so a test
// example's logits do not depend on the evaluation batch's size or the example's place in it:
// convolutions forward by ditto-direct and linear layers by gemm=ditto (each output summed in one
// order, kernels/detail/fixed_gemm.cuh), batch norm and pooling by ditto's own kernels (per-element
// inference, per-window max and per-plane means), NCHW fp32 between layers. The run's precision
// must be fp32. cuDNN and cuBLAS pick kernels by problem size, batch included: without these rules
// an example's logits may change in the last bits with the batch it is evaluated in. A library user
// evaluating in a loop of their own sets the same rules on the context's policy for the pass.
const std::vector<std::string>& batch_invariant_rules();

// Every --dataset name, in the order --help lists them.
const std::vector<std::string>& known_datasets();

// For the other tasks' datasets (and the categorical ones), a tiny training set shaped like the one
// cfg names: two examples of its built-in stand-in (mnist-seg's is synthetic-seg, celeba-attrs's
// synthetic-attrs, ...), which has the same geometry, classes and fields by construction: what
// probing a training step needs, without reading files. nullopt for the classic image datasets,
// whose probe is an image size (attribute.h model_candidates).
std::optional<Dataset> probe_examples(const TrainConfig& cfg);

// "auto" becomes "cuda" when a CUDA device can be used, else "cpu"; other values pass through.
std::string resolve_device(const std::string& device);

// Every parameter's values, concatenated in the order given, on the host (waits for the GPU).
std::vector<float> params_to_host(const std::vector<Param>& params);
// One fingerprint of all the parameters' bits, in the order given.
Fingerprint params_fingerprint(const std::vector<Param>& params);
// "mm:ss", or "h:mm:ss" from an hour on: elapsed times and ETAs in progress lines.
std::string format_hms(double seconds);

}  // namespace ditto
