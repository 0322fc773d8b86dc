// The one definition of the training flags, shared by every front end (ditto-train,
// ditto-experiment, ditto-attribute, ditto-diverge): each adds the groups it honours and reads
// them back into a TrainConfig with apply_train_flags. Header-only so that libditto_experiments
// does not depend on CLI11; a program that includes it links CLI11.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "experiments/train.h"
#include "nets/nets.h"

namespace ditto {

enum TrainFlagGroups : unsigned {
  kFlagsData = 1,      // --model --dataset --data --train-size --test-size --label-attr ...
  kFlagsOptim = 2,     // --epochs --steps --batch-size --lr --optimizer ... --augment --standardize
  kFlagsRun = 4,       // --device --loader-threads --graph --summary --quiet
  kFlagsSeeds = 8,     // --seed-* --deterministic-init --deterministic-input
  kFlagsKernels = 16,  // --kernels --deterministic-kernels
  kFlagsPins = 32,     // --pin --pins-from
  kFlagsOutput = 64,   // --out --resume
  kFlagsAll = 127,
};

// Values that live outside TrainConfig until apply_train_flags.
struct TrainFlags {
  uint64_t seed_init = 0, seed_order = 0, seed_augment = 0;
  CLI::Option *seed_init_opt = nullptr, *seed_order_opt = nullptr, *seed_augment_opt = nullptr;
  bool deterministic_kernels = false;
  std::string pins_from;
  bool quiet = false;
};

namespace detail {
// "--epochs must be at least 1, got 0" rather than CLI11's "not in range 0 to 1.79e308".
inline CLI::Validator at_least(double low) {
  return CLI::Validator(
      [low](std::string& v) {
        try {
          if (std::stod(v) >= low) return std::string();
        } catch (const std::exception&) {
          return "must be a number, got '" + v + "'";
        }
        return "must be at least " + CLI::detail::to_string(low) + ", got " + v;
      },
      ">=" + CLI::detail::to_string(low));
}
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& v) {
        try {
          if (std::stod(v) > 0) return std::string();
        } catch (const std::exception&) {
          return "must be a number, got '" + v + "'";
        }
        return "must be positive, got " + v;
      },
      ">0");
}
}  // namespace detail

inline void add_train_flags(CLI::App& app, TrainConfig& c, TrainFlags& f, unsigned groups = kFlagsAll) {
  using detail::at_least;
  using detail::positive;
  if (groups & kFlagsData) {
    app.add_option("--model", c.model, "the network (nets/nets.h describes each)")
        ->check(CLI::IsMember(known_models()))
        ->capture_default_str();
    app.add_option("--dataset", c.dataset, "synthetic | cifar10 | cifar100 | imagefolder | celeba | mnist")
        ->check(CLI::IsMember({"synthetic", "cifar10", "cifar100", "imagefolder", "celeba", "mnist"}))
        ->capture_default_str();
    app.add_option("--data", c.data, "dataset folder (not for synthetic)");
    app.add_option("--train-size", c.train_size, "use only the first N training examples (0: all)")->check(at_least(0));
    app.add_option("--test-size", c.test_size, "use only the first N test examples (0: all)")->check(at_least(0));
    app.add_option("--label-attr", c.celeba_label, "celeba: the attribute to predict")->capture_default_str();
    app.add_option("--subgroup-attrs", c.celeba_subgroups, "celeba: attributes forming subgroups");
    app.add_option("--synthetic-train", c.synthetic_train, "synthetic: training images")->check(at_least(1))
        ->capture_default_str();
    app.add_option("--synthetic-test", c.synthetic_test, "synthetic: test images")->check(at_least(1))
        ->capture_default_str();
    app.add_option("--synthetic-size", c.synthetic_size, "synthetic: image height and width")->check(at_least(8))
        ->capture_default_str();
  }
  if (groups & kFlagsOptim) {
    app.add_option("--epochs", c.epochs)->check(at_least(1))->capture_default_str();
    app.add_option("--steps", c.max_steps, "train this many steps instead of whole epochs (screening), then evaluate")
        ->check(at_least(1));
    app.add_option("--batch-size", c.batch_size)->check(at_least(1))->capture_default_str();
    app.add_option("--lr", c.lr)->check(positive())->capture_default_str();
    app.add_option("--optimizer", c.optimizer)->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
    app.add_option("--momentum", c.momentum, "sgd")->check(CLI::Range(0.0, 1.0))->capture_default_str();
    app.add_flag("--nesterov", c.nesterov, "sgd");
    app.add_option("--weight-decay", c.weight_decay)->check(at_least(0))->capture_default_str();
    app.add_option("--lr-schedule", c.lr_schedule,
                   "per step: constant | step (/10 at --milestones) | cosine (to 0) | onecycle (linear to 0; with "
                   "--warmup-epochs, up then down)")
        ->check(CLI::IsMember({"constant", "step", "cosine", "onecycle"}))
        ->capture_default_str();
    app.add_option("--milestones", c.milestones, "epochs where the step schedule divides the lr by 10");
    app.add_option("--warmup-epochs", c.warmup_epochs,
                   "linear warm-up from 0 to --lr over this many epochs (fractional allowed, any schedule); cosine "
                   "and onecycle decay over the epochs after it")
        ->check(detail::at_least(0))
        ->capture_default_str();
    app.add_flag("--augment", c.augment, "pad-4 random crop + horizontal flip");
    app.add_flag("--standardize", c.standardize, "per-image standardization instead of channel mean/std");
  }
  if (groups & kFlagsRun) {
    app.add_option("--device", c.device, "auto | cpu | cuda | cuda:N (auto: cuda when a GPU is present)")
        ->capture_default_str();
    app.add_option("--loader-threads", c.loader_threads)->check(at_least(0))->capture_default_str();
    app.add_flag("--graph", c.graph,
                 "CUDA graphs: capture each batch size's training step once and replay it (bit-identical to "
                 "eager; no tracing)");
    app.add_flag("--summary", c.summary, "print layer name, op, output shape, parameters");
    app.add_flag("--quiet", f.quiet, "no progress line");
  }
  if (groups & kFlagsSeeds) {
    f.seed_init_opt = app.add_option("--seed-init", f.seed_init);
    f.seed_order_opt = app.add_option("--seed-order", f.seed_order);
    f.seed_augment_opt = app.add_option("--seed-augment", f.seed_augment);
    app.add_flag("--deterministic-init", c.deterministic_init, "fix the init seed (0 unless --seed-init)");
    app.add_flag("--deterministic-input", c.deterministic_input, "fix order and augmentation seeds (0 unless given)");
  }
  if (groups & kFlagsKernels) {
    auto* dk = app.add_flag("--deterministic-kernels", f.deterministic_kernels, "same as --kernels deterministic");
    auto* k = app.add_option("--kernels", c.kernels,
                             "heuristic (cuDNN's pick, what frameworks do) | deterministic | nondeterministic | fastest")
                  ->check(CLI::IsMember({"heuristic", "deterministic", "nondeterministic", "fastest"}))
                  ->capture_default_str();
    dk->excludes(k);
    app.add_option("--tuning", c.tuning,
                   "with --kernels deterministic: take each conv's algorithm from this tuning file; when it does "
                   "not exist, time the deterministic algorithms (cuDNN Find), use the fastest and write the file");
  }
  if (groups & kFlagsPins) {
    app.add_option("--pin", c.pins, "LAYER.KNOB=VARIANT (repeatable), e.g. conv2.bwd_filter=algo0");
    app.add_option("--pins-from", f.pins_from, "pin every kernel a run's manifest.json recorded (exact replay)")
        ->check(CLI::ExistingFile);
  }
  if (groups & kFlagsOutput) {
    app.add_option("--resume", c.resume, "run folder to continue from")->check(CLI::ExistingDirectory);
    app.add_option("--out", c.out, "run folder to write");
  }
}

// After parsing: seeds given by flag, the kernels switch, recorded pins (first, so explicit
// --pin flags still override them), the progress switch, and the command line for the manifest.
// Throws ditto::Error for a manifest that cannot be read.
inline void apply_train_flags(TrainConfig& c, const TrainFlags& f, int argc, char** argv) {
  if (f.seed_init_opt && *f.seed_init_opt) c.seed_init = f.seed_init;
  if (f.seed_order_opt && *f.seed_order_opt) c.seed_order = f.seed_order;
  if (f.seed_augment_opt && *f.seed_augment_opt) c.seed_augment = f.seed_augment;
  if (f.deterministic_kernels) c.kernels = "deterministic";
  c.progress = !f.quiet;
  c.command_line.clear();
  for (int i = 0; i < argc; ++i) c.command_line += (i ? " " : "") + std::string(argv[i]);
  if (!f.pins_from.empty()) {
    auto recorded = pins_from_manifest(f.pins_from);
    recorded.insert(recorded.end(), c.pins.begin(), c.pins.end());
    c.pins = recorded;
  }
  c.device = resolve_device(c.device);
}

}  // namespace ditto
