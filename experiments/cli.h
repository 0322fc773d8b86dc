// The one definition of the training flags, shared by every front end (ditto-train,
// ditto-experiment, ditto-attribute, ditto-diverge): each adds the groups it honours and reads
// them back into a TrainConfig with apply_train_flags. Header-only so that libditto_experiments
// does not depend on CLI11; a program that includes it links CLI11.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "engine/error.h"
#include "engine/knob.h"
#include "engine/loss_scale.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "nets/nets.h"

namespace ditto {

enum TrainFlagGroups : unsigned {
  kFlagsData = 1,      // --model --dataset --data --train-size --test-size --label-attr ...
  kFlagsOptim = 2,     // --epochs --steps --batch-size --lr --optimizer ... --augment --standardize --loss-scale
  kFlagsRun = 4,       // --device --loader-threads --graph --summary --quiet
  kFlagsSeeds = 8,     // --seed-* --deterministic-init --deterministic-input
  kFlagsKernels = 16,  // --kernels --deterministic-kernels
  kFlagsPins = 32,     // --pin --pins-from --precision --channels-last --native-activations --eval-kernels
  kFlagsOutput = 64,   // --out --resume
  kFlagsDataParallel = 128,  // --dp-gpus --dp-groups --batchnorm --bucket-mb
  // --gpus as the name of --dp-gpus: for the front ends whose own --gpus does not already mean
  // something else (ditto-experiment and ditto-attribute spread replicas over GPUs with it).
  kFlagsGpusFlag = 256,
  // --dp-launch --dp-timeout: the ranks as processes, one per Slurm task (ditto-train alone: the
  // other front ends train several runs in one process).
  kFlagsDpProcesses = 512,
  kFlagsAll = 1023,
};

// Values that live outside TrainConfig until apply_train_flags.
struct TrainFlags {
  uint64_t seed_init = 0, seed_order = 0, seed_augment = 0;
  CLI::Option *seed_init_opt = nullptr, *seed_order_opt = nullptr, *seed_augment_opt = nullptr;
  bool deterministic_kernels = false;
  std::string pins_from;
  bool quiet = false;
  CLI::Option *image_size_opt = nullptr, *resize_opt = nullptr;  // stream-folder's own
  CLI::Option* loss_scale_opt = nullptr;  // given: default_loss_scale leaves --loss-scale alone
};

namespace detail {
// Every numeric flag is checked as text before CLI11 converts it, so a message names the flag and
// says what it takes: "--lr: must be a finite number above 0, got inf" rather than a run of NaNs,
// and "--batch-size: must be a whole number from 1 to ..." rather than a wrapped byte count.
// A whole number from low to high (the option's type bounds high).
inline CLI::Validator whole(long long low, long long high) {
  return CLI::Validator(
      [low, high](std::string& v) {
        const std::size_t sign = !v.empty() && (v[0] == '-' || v[0] == '+') ? 1 : 0;
        if (v.size() == sign || v.find_first_not_of("0123456789", sign) != std::string::npos)
          return "must be a whole number, got '" + v + "'";
        const std::string range =
            "must be a whole number from " + std::to_string(low) + " to " + std::to_string(high) + ", got " + v;
        try {
          const long long n = std::stoll(v);
          if (n < low || n > high) return range;
        } catch (const std::out_of_range&) {
          return range;
        }
        return std::string();
      },
      "INT in [" + std::to_string(low) + ", " + std::to_string(high) + "]");
}
// A seed: a whole number from 0 to 2^64-1.
inline CLI::Validator seed() {
  return CLI::Validator(
      [](std::string& v) {
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
          return "must be a whole number from 0 to 18446744073709551615, got '" + v + "'";
        try {
          (void)std::stoull(v);
        } catch (const std::out_of_range&) {
          return "must be a whole number from 0 to 18446744073709551615, got " + v;
        }
        return std::string();
      },
      "UINT64");
}
// A finite real number of at least `low` (above it when `open`), at most `high`.
inline CLI::Validator real(double low, bool open, double high = std::numeric_limits<double>::infinity()) {
  return CLI::Validator(
      [=](std::string& v) {
        std::size_t used = 0;
        double x = 0;
        try {
          x = std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != v.size() || v.empty()) return "must be a number, got '" + v + "'";
        const std::string range = std::string(open ? "above " : "of at least ") + CLI::detail::to_string(low) +
                                  (std::isinf(high) ? "" : " and at most " + CLI::detail::to_string(high));
        if (!std::isfinite(x) || x < low || (open && x == low) || x > high)
          return "must be a finite number " + range + ", got " + v;
        return std::string();
      },
      std::string(open ? ">" : ">=") + CLI::detail::to_string(low));
}
// A path a tool writes (experiments/run_dir.h output_path_problem says what is refused).
inline CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& v) { return output_path_problem(v); },
      "PATH");
}
// "--replicas must be at least 2, got 1" rather than CLI11's "not in range 0 to 1.79e308".
inline CLI::Validator at_least(double low) { return real(low, false); }
inline CLI::Validator positive() { return real(0, true); }
// A float flag (--lr, --wd, ...): above 0 and no larger than a float holds, so "1e39" is refused
// as typed instead of turning into inf on the way in.
inline CLI::Validator positive_float() { return real(0, true, std::numeric_limits<float>::max()); }

// The flag groups, one function each.

// The model and the data: which network, which dataset, where it lives, how much of it.
inline void add_data_flags(CLI::App& app, TrainConfig& c, TrainFlags& f) {
  constexpr long long kInt = INT_MAX, kInt64 = LLONG_MAX;
  app.add_option("--model", c.model, "the network (nets/nets.h describes each)")
      ->check(CLI::IsMember(known_models()))
      ->capture_default_str();
  app.add_option("--dataset", c.dataset,
                 "synthetic | cifar10 | cifar100 | imagefolder | stream-folder (JPEGs of any size decoded on the fly: "
                 "random-resized-crop with --augment, resize + centre crop otherwise) | celeba | mnist; for the other tasks (datasets/"
                 "dataset.h): mnist-seg (unet-small), mnist-rt (stn), mnist-strings (ctc-cnn), celeba-attrs "
                 "(embedding-bag), and their built-in stand-ins synthetic-seg, synthetic-rt, synthetic-strings, "
                 "synthetic-attrs")
      ->check(CLI::IsMember(known_datasets()))
      ->capture_default_str();
  app.add_option("--data", c.data, "dataset folder (not for synthetic)");
  app.add_option("--train-size", c.train_size, "use only the first N training examples (0: all)")->check(whole(0, kInt64));
  app.add_option("--test-size", c.test_size, "use only the first N test examples (0: all)")->check(whole(0, kInt64));
  app.add_option("--label-attr", c.celeba_label, "celeba, celeba-attrs: the attribute to predict")->capture_default_str();
  app.add_option("--subgroup-attrs", c.celeba_subgroups, "celeba, celeba-attrs: attributes forming subgroups");
  app.add_option("--synthetic-train", c.synthetic_train, "synthetic, synthetic-*: training examples")->check(whole(1, kInt))
      ->capture_default_str();
  app.add_option("--synthetic-test", c.synthetic_test, "synthetic, synthetic-*: test examples")->check(whole(1, kInt))
      ->capture_default_str();
  app.add_option("--synthetic-size", c.synthetic_size,
                 "synthetic: image height and width (the synthetic-* variants have their real data's size)")->check(whole(8, 4096))
      ->capture_default_str();
  f.image_size_opt = app.add_option("--image-size", c.image_size, "stream-folder: the side of the crops")->check(whole(1, 8192))
      ->capture_default_str();
  f.resize_opt = app.add_option("--resize", c.resize, "stream-folder: evaluation's shorter side before the centre crop")
      ->check(whole(1, 65535))->capture_default_str();
}

// Data parallelism: the ranks, the example groups, batch norm across them, the gradient buckets.
inline void add_data_parallel_flags(CLI::App& app, TrainConfig& c, bool gpus_flag, bool processes_flag) {
  app.add_option(gpus_flag ? "--gpus,--dp-gpus" : "--dp-gpus", c.gpus,
                 "data-parallel ranks: GPUs N..N+K-1 after --device cuda:N (simulated ranks on the CPU)")
      ->check(whole(1, 64))->capture_default_str();
  app.add_option("--dp-groups", c.dp_groups,
                 "example groups per global batch, shared by the ranks (a multiple of the ranks; default one per "
                 "rank); with the fixed-order all-reduce the same groups give the same bits for any rank count")
      ->check(whole(1, 4096));
  app.add_option("--batchnorm", c.batchnorm,
                 "data parallel: local (each group's own statistics, as DDP) | sync (the global batch's)")
      ->check(CLI::IsMember({"local", "sync"}))->capture_default_str();
  if (processes_flag) {
    app.add_option("--dp-launch", c.dp_launch,
                   "data parallel over processes: slurm (this process is the rank SLURM_PROCID of the job step's "
                   "SLURM_NTASKS tasks; start them with srun; rank 0 writes --out, where the ranks meet)")
        ->check(CLI::IsMember({"slurm"}));
    app.add_option("--dp-timeout", c.dp_timeout,
                   "--dp-launch: seconds a rank waits for the others at any meeting point before it gives up")
        ->check(CLI::Range(1.0, 604800.0))
        ->capture_default_str();
  }
  app.add_option("--bucket-mb", c.bucket_mb,
                 "data parallel: gradient bucket size (each bucket's all-reduce is a knob: --pin "
                 "bucketN.algo=fixed-order|ring|nccl-default|nccl-ring-simple|...)")
      ->check(whole(1, 65536))->capture_default_str();
}

// The optimization: epochs or steps, batch, learning rate and its schedule, optimizer, augmentation.
inline void add_optim_flags(CLI::App& app, TrainConfig& c) {
  constexpr long long kInt64 = LLONG_MAX;
  app.add_option("--epochs", c.epochs)->check(whole(1, 1000000))->capture_default_str();
  app.add_option("--steps", c.max_steps, "train this many steps instead of whole epochs (screening), then evaluate")
      ->check(whole(1, kInt64));
  app.add_option("--batch-size", c.batch_size)->check(whole(1, int64_t(1) << 31))->capture_default_str();
  app.add_option("--lr", c.lr)->check(positive_float())->capture_default_str();
  app.add_option("--optimizer", c.optimizer)->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  app.add_option("--momentum", c.momentum, "sgd")->check(real(0, false, 1))->capture_default_str();
  app.add_flag("--nesterov", c.nesterov, "sgd");
  app.add_option("--weight-decay", c.weight_decay)
      ->check(real(0, false, std::numeric_limits<float>::max()))
      ->capture_default_str();
  app.add_option("--lr-schedule", c.lr_schedule,
                 "per step: constant | step (/10 at --milestones) | cosine (to 0) | onecycle (linear to 0; with "
                 "--warmup-epochs, up then down)")
      ->check(CLI::IsMember({"constant", "step", "cosine", "onecycle"}))
      ->capture_default_str();
  app.add_option("--milestones", c.milestones, "epochs where the step schedule divides the lr by 10")
      ->check(whole(1, 1000000));
  app.add_option("--warmup-epochs", c.warmup_epochs,
                 "linear warm-up from 0 to --lr over this many epochs (fractional allowed, any schedule); cosine "
                 "and onecycle decay over the epochs after it")
      ->check(real(0, false))
      ->capture_default_str();
  app.add_flag("--augment", c.augment, "pad-4 random crop + horizontal flip");
  app.add_flag("--standardize", c.standardize, "per-image standardization instead of channel mean/std");
}

// Loss scaling (engine/loss_scale.h), checked as it is parsed.
inline void add_loss_scale_flag(CLI::App& app, TrainConfig& c, TrainFlags& f) {
  const CLI::Validator setting(
      [](std::string& v) {
        try {
          (void)parse_loss_scaling(v);
        } catch (const Error& e) {
          // CLI11 names the flag itself: "--loss-scale: '1000' is not ...", not the flag twice.
          const std::string text = e.what(), flag = "--loss-scale: ";
          return text.rfind(flag, 0) == 0 ? text.substr(flag.size()) : text;
        }
        return std::string();
      },
      "off|dynamic|POW2");
  f.loss_scale_opt = app.add_option("--loss-scale", c.loss_scale,
                                    "scale the loss for fp16 gradients: off | dynamic (GradScaler's: 2^16, x2 after "
                                    "2000 good steps, x0.5 and the update skipped on inf/nan) | "
                                    "dynamic:INIT:GROWTH:BACKOFF:INTERVAL | a power of two (fixed); every step's "
                                    "scale and overflow go to loss_scale.csv")
                         ->check(setting)
                         ->capture_default_str();
}

// How the run executes: the device, loader threads, CUDA graphs, what it prints.
inline void add_run_flags(CLI::App& app, TrainConfig& c, TrainFlags& f) {
  app.add_option("--device", c.device, "auto | cpu | cuda | cuda:N (auto: cuda when a GPU is present)")
      ->capture_default_str();
  app.add_option("--loader-threads", c.loader_threads)->check(whole(0, 64))->capture_default_str();
  app.add_flag("--graph", c.graph,
               "CUDA graphs: capture each batch size's training step once and replay it (bit-identical to "
               "eager; no tracing)");
  app.add_flag("--summary", c.summary, "print layer name, op, output shape, parameters");
  app.add_flag("--quiet", f.quiet, "no progress line");
}

// The seeds of initialization, example order and augmentation.
inline void add_seed_flags(CLI::App& app, TrainConfig& c, TrainFlags& f) {
  f.seed_init_opt = app.add_option("--seed-init", f.seed_init)->check(detail::seed());
  f.seed_order_opt = app.add_option("--seed-order", f.seed_order)->check(detail::seed());
  f.seed_augment_opt = app.add_option("--seed-augment", f.seed_augment)->check(detail::seed());
  app.add_flag("--deterministic-init", c.deterministic_init, "fix the init seed (0 unless --seed-init)");
  app.add_flag("--deterministic-input", c.deterministic_input, "fix order and augmentation seeds (0 unless given)");
}

// Which kernels run: the mode, and the tuning file of deterministic convolutions.
inline void add_kernel_flags(CLI::App& app, TrainConfig& c, TrainFlags& f) {
  auto* dk = app.add_flag("--deterministic-kernels", f.deterministic_kernels, "same as --kernels deterministic");
  auto* k = app.add_option("--kernels", c.kernels,
                           "the mode every knob resolves by (engine/knob.h says what each picks): heuristic (what "
                           "frameworks do) | deterministic | nondeterministic | fastest")
                ->check(CLI::IsMember(mode_words()))
                ->capture_default_str();
  dk->excludes(k);
  app.add_option("--tuning", c.tuning,
                 "with --kernels deterministic: take each conv's algorithm from this tuning file; when it does "
                 "not exist, time the deterministic algorithms (cuDNN Find), use the fastest and write the file");
  app.add_option("--tuning-workspace-mb", c.tuning_workspace_mb,
                 "with --tuning, when this run writes the file: the largest workspace (MiB) a tuned convolution "
                 "algorithm may take, written into the file (0: no limit); a file read must carry the same budget")
      ->check(CLI::NonNegativeNumber);
}

// Kernel pins: given one by one, or every kernel a run recorded; and the rules every layer of a
// kind takes (precision, layout).
inline void add_pin_flags(CLI::App& app, TrainConfig& c, TrainFlags& f) {
  app.add_option("--pin", c.pins,
                 "LAYER.KNOB=VARIANT (repeatable), e.g. conv2.bwd_filter=algo0. Knobs by op kind: " + knob_index() +
                     " (ditto-knobs lists every variant and its guarantee)");
  app.add_option("--pins-from", f.pins_from, "pin every kernel a run's manifest.json recorded (exact replay)")
      ->check(CLI::ExistingFile);
  app.add_option("--precision", c.precision,
                 "where convolutions and linear layers round (kernels/precision.h): fp32 | tf32 | bf16 | fp16 "
                 "(inputs and outputs rounded, fp32 accumulation on tensor cores); a --pin LAYER.precision=... "
                 "for one layer wins")
      ->check(CLI::IsMember(knob_spec(OpKind{"conv2d"}, "precision").variant_names()))
      ->capture_default_str();
  app.add_flag("--channels-last", c.channels_last,
               "convolutions compute channels-last (the rule *.layout=nhwc): the copies are made in the pass that "
               "rounds to the precision, where cuDNN's tensor-core kernels want them");
  app.add_flag("--native-activations", c.native_activations,
               "convolutions hand their results on in the precision's dtype and layout (the rule *.output=native): "
               "with --precision bf16 --channels-last, batch norm, activations, residual adds and pooling read and "
               "write bf16 channels-last tensors instead of fp32 NCHW (kernels/conv2d.h)");
  app.add_option("--eval-kernels", c.eval_kernels,
                 "the evaluation's kernels: same (the run's policy) | batch-invariant (each test example's logits "
                 "the same bits whatever the evaluation batch's size or the example's place in it: ditto's own "
                 "fixed-order convolution and linear kernels, fp32; experiments/train.h batch_invariant_rules)")
      ->check(CLI::IsMember({"same", "batch-invariant"}))
      ->capture_default_str();
}

// The run folder: where to write, what to resume, whether to replace.
inline void add_output_flags(CLI::App& app, TrainConfig& c) {
  app.add_option("--resume", c.resume, "run folder to continue from")->check(CLI::ExistingDirectory);
  app.add_option("--out", c.out, "run folder to write (default with --resume: continue in the resumed folder)")
      ->check(output_path());
  app.add_flag("--overwrite", c.overwrite,
               "--out may hold a run: replace it (the old run stays whole until this one has finished an epoch)");
}
}  // namespace detail

// Adds the flag groups `groups` names, in one fixed order (which --help keeps).
inline void add_train_flags(CLI::App& app, TrainConfig& c, TrainFlags& f, unsigned groups = kFlagsAll) {
  if (groups & kFlagsData) detail::add_data_flags(app, c, f);
  if (groups & kFlagsDataParallel)
    detail::add_data_parallel_flags(app, c, (groups & kFlagsGpusFlag) != 0, (groups & kFlagsDpProcesses) != 0);
  if (groups & kFlagsOptim) detail::add_optim_flags(app, c);
  if (groups & kFlagsOptim) detail::add_loss_scale_flag(app, c, f);
  if (groups & kFlagsRun) detail::add_run_flags(app, c, f);
  if (groups & kFlagsSeeds) detail::add_seed_flags(app, c, f);
  if (groups & kFlagsKernels) detail::add_kernel_flags(app, c, f);
  if (groups & kFlagsPins) detail::add_pin_flags(app, c, f);
  if (groups & kFlagsOutput) detail::add_output_flags(app, c);
}

// The loss scaling of a run whose --loss-scale was not given, from the precision it trains at
// (engine/loss_scale.h default_loss_scaling: dynamic for fp16, off otherwise). A front end with
// --precision calls it after parsing; a given --loss-scale always wins.
inline void default_loss_scale(TrainConfig& c, const TrainFlags& f, const std::string& precision) {
  if (f.loss_scale_opt && f.loss_scale_opt->count() > 0) return;
  c.loss_scale = loss_scaling_name(default_loss_scaling(precision));
}

// After parsing: seeds given by flag, the kernels switch, recorded pins (first, so explicit
// --pin flags still override them), the progress switch, the command line for the manifest, and
// the loss scaling --precision implies (dynamic for fp16) unless --loss-scale was given.
// Throws ditto::Error for a manifest that cannot be read.
inline void apply_train_flags(TrainConfig& c, const TrainFlags& f, int argc, char** argv) {
  if (f.seed_init_opt && *f.seed_init_opt) c.seed_init = f.seed_init;
  if (f.seed_order_opt && *f.seed_order_opt) c.seed_order = f.seed_order;
  if (f.seed_augment_opt && *f.seed_augment_opt) c.seed_augment = f.seed_augment;
  if (f.deterministic_kernels) c.kernels = "deterministic";
  c.progress = !f.quiet;
  c.command_line.clear();
  for (int i = 0; i < argc; ++i) c.command_line += (i ? " " : "") + std::string(argv[i]);
  for (CLI::Option* o : {f.image_size_opt, f.resize_opt})
    if (o && o->count() && c.dataset != "stream-folder")
      throw Error(fmt::format("{}: only --dataset stream-folder crops and resizes its images; --dataset {} has fixed "
                              "sizes (leave {} out)",
                              o->get_name(), c.dataset, o->get_name()));
  if (!f.pins_from.empty()) {
    // The pins name the recorded run's layers and shapes: another model's would pin layers that
    // merely share a name.
    const RunManifest recorded_run = read_run_manifest(f.pins_from);
    const auto model = recorded_run.flags.find("--model");
    if (model != recorded_run.flags.end() && model->second != c.model)
      throw Error(fmt::format("--pins-from {}: that run trained --model {}, this one --model {}; its pins name {}'s "
                              "layers and shapes",
                              f.pins_from, model->second, c.model, model->second));
    auto recorded = pins_from_ops(recorded_run.ops);
    recorded.insert(recorded.end(), c.pins.begin(), c.pins.end());
    c.pins = recorded;
    c.pins_from = f.pins_from;
  }
  c.device = resolve_device(c.device);
  default_loss_scale(c, f, c.precision);
}

}  // namespace ditto
